//! The error type of the state engine.

/// What went wrong, and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// RocksDB failed (disk full, I/O error). Stop the shard; restart re-opens or restores it.
    #[error("state store {path}: {message}")]
    Storage {
        /// The shard directory.
        path: String,
        /// What RocksDB said.
        message: String,
    },
    /// Stored bytes do not decode. Stop: restore the shard from a checkpoint.
    #[error("corrupt state in {path}: {message}")]
    Corrupt {
        /// The shard directory.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A state key contains the 0x00 separator. The record goes to the dead-letter path.
    #[error("state key {0:?} contains a NUL byte")]
    InvalidKey(String),
    /// The processor rejected a record. The record goes to the dead-letter path.
    #[error("processor: {0}")]
    Processor(String),
    /// A commit point was asked for while outputs of the held batches are not acknowledged by
    /// the broker: nothing was written. Ask again once they are.
    #[error("commit point refused: {0} held outputs are not acknowledged by the broker yet")]
    NotAcknowledged(u64),
    /// The checkpoint store failed. Retry with backoff (the next epoch tries again).
    #[error("checkpoint store: {0}")]
    CheckpointStore(String),
}

impl StateError {
    /// Whether retrying the same operation later can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StateError::CheckpointStore(_) | StateError::NotAcknowledged(_)
        )
    }
}
