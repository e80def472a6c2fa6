//! The error type of the shared runtime.

/// What went wrong in shared infrastructure, and what the caller should do about it.
#[derive(Debug, thiserror::Error)]
pub enum CommonError {
    /// The configuration is invalid (unknown key, bad value, unreadable file). Stop: fix the config.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A listener could not bind or a server failed. Stop: the port is taken or the address invalid.
    #[error("cannot serve {what} on {address}: {message}")]
    Serve {
        /// `HTTP` or `gRPC`.
        what: &'static str,
        /// The address.
        address: String,
        /// The cause.
        message: String,
    },
    /// Telemetry could not be initialised. Stop.
    #[error("cannot initialise telemetry: {0}")]
    Telemetry(String),
    /// A Kafka client could not be created from the settings. Stop: fix the Kafka config.
    #[error("invalid Kafka settings: {0}")]
    Kafka(String),
}

impl CommonError {
    /// Whether retrying the same operation can succeed. Everything here is a setup error.
    pub fn is_retryable(&self) -> bool {
        false
    }
}
