//! The error type of the dedup-state stage.

use contrail_common::CommonError;
use contrail_state::StateError;

/// What went wrong in dedup-state, and how to recover.
#[derive(Debug, thiserror::Error)]
pub enum DedupStateError {
    /// Invalid configuration or setup. Stop.
    #[error(transparent)]
    Common(#[from] CommonError),
    /// The state engine failed; `StateError::is_retryable` says whether retrying helps.
    #[error(transparent)]
    State(#[from] StateError),
    /// The broker refused or is unreachable. Retry with backoff.
    #[error("broker: {0}")]
    Broker(String),
    /// A checkpoint round failed (an owner did not ack, the store failed). The next round retries.
    #[error("checkpoint epoch {epoch}: {message}")]
    Checkpoint {
        /// The epoch.
        epoch: u64,
        /// What happened.
        message: String,
    },
    /// The processing thread stopped unexpectedly. Stop: the process restarts and recovers.
    #[error("processing thread: {0}")]
    Worker(String),
}

impl DedupStateError {
    /// Whether retrying later can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            DedupStateError::Broker(_) | DedupStateError::Checkpoint { .. } => true,
            DedupStateError::State(error) => error.is_retryable(),
            DedupStateError::Common(_) | DedupStateError::Worker(_) => false,
        }
    }
}

impl contrail_common::stage::StageError for DedupStateError {
    fn is_retryable(&self) -> bool {
        DedupStateError::is_retryable(self)
    }
}
