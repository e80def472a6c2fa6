//! The error type of the history crate.

/// What went wrong locating or reading a history table.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// The Delta root or a table location is invalid (a malformed URL, a directory that cannot
    /// be created). Not retryable: the configuration must change.
    #[error("delta_root {root:?}: {reason}")]
    Location {
        /// The configured root.
        root: String,
        /// Why it is unusable.
        reason: String,
    },
    /// Reading a Delta table failed (storage unreachable or refusing access, a corrupt log).
    /// Retryable when the storage is.
    #[error("delta table {table}: {source}")]
    Delta {
        /// Table name.
        table: &'static str,
        /// The underlying error.
        #[source]
        source: deltalake::DeltaTableError,
    },
}
