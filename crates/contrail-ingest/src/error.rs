//! The error type of the ingest stage.

use contrail_common::CommonError;

/// What went wrong in ingest, and how the caller recovers.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// Invalid configuration or setup. Stop.
    #[error(transparent)]
    Common(#[from] CommonError),
    /// The broker did not acknowledge in time or refused. Retry with backoff (clients get `503`).
    #[error("broker unavailable: {0}")]
    BrokerUnavailable(String),
    /// Too many records, or bytes, in flight. Retry after a short pause (clients get `429`).
    #[error("over capacity: {in_flight} {unit} in flight, limit {limit}")]
    OverCapacity {
        /// Records (or bytes) in flight when refused.
        in_flight: usize,
        /// The limit.
        limit: usize,
        /// `records` or `bytes`: which bound refused.
        unit: &'static str,
    },
    /// A pull source failed to fetch. Retry with backoff when `retryable`.
    #[error("source {source_name}: {message}")]
    Source {
        /// The source.
        source_name: String,
        /// What happened.
        message: String,
        /// Whether trying again can help.
        retryable: bool,
    },
    /// A cursor could not be read or written. Stop: the cursor directory is broken.
    #[error("cursor store {path}: {message}")]
    Cursor {
        /// The file.
        path: String,
        /// What happened.
        message: String,
    },
}

impl IngestError {
    /// Whether retrying later can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            IngestError::BrokerUnavailable(_) | IngestError::OverCapacity { .. } => true,
            IngestError::Source { retryable, .. } => *retryable,
            IngestError::Common(_) | IngestError::Cursor { .. } => false,
        }
    }
}

impl contrail_common::stage::StageError for IngestError {
    fn is_retryable(&self) -> bool {
        IngestError::is_retryable(self)
    }
}
