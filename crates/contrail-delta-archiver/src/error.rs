//! The error type of the delta-archiver stage.

use contrail_common::CommonError;

/// What went wrong in delta-archiver, and how to recover.
#[derive(Debug, thiserror::Error)]
pub enum DeltaArchiverError {
    /// Invalid configuration or setup. Stop.
    #[error(transparent)]
    Common(#[from] CommonError),
    /// The Delta root URL or a table location is invalid. Stop.
    #[error("delta_root {root:?}: {reason}")]
    Location {
        /// The configured root.
        root: String,
        /// Why it is unusable.
        reason: String,
    },
    /// Reading or committing a Delta table failed (storage unreachable, throttled, conflict
    /// retries exhausted). Retry (restart): nothing half-done is visible in the table.
    #[error("delta table {table}: {source}")]
    Delta {
        /// Table name.
        table: &'static str,
        /// The underlying error.
        #[source]
        source: deltalake::DeltaTableError,
    },
    /// Rows could not be turned into a record batch (a schema bug). Stop.
    #[error("delta table {table}: cannot build a record batch: {reason}")]
    Batch {
        /// Table name.
        table: &'static str,
        /// Why.
        reason: String,
    },
    /// The broker refused or is unreachable. Retry with backoff (restart).
    #[error("broker: {0}")]
    Broker(String),
}

impl DeltaArchiverError {
    /// Whether retrying later can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            DeltaArchiverError::Broker(_) | DeltaArchiverError::Delta { .. } => true,
            DeltaArchiverError::Common(_)
            | DeltaArchiverError::Location { .. }
            | DeltaArchiverError::Batch { .. } => false,
        }
    }
}

impl contrail_common::stage::StageError for DeltaArchiverError {
    fn is_retryable(&self) -> bool {
        DeltaArchiverError::is_retryable(self)
    }
}
