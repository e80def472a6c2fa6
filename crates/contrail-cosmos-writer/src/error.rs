//! The error type of the cosmos-writer stage.

use contrail_common::CommonError;
use contrail_cosmos::CosmosStoreError;

/// What went wrong in cosmos-writer, and how to recover.
#[derive(Debug, thiserror::Error)]
pub enum CosmosWriterError {
    /// Invalid configuration or setup. Stop.
    #[error(transparent)]
    Common(#[from] CommonError),
    /// Cosmos DB failed; `CosmosStoreError::is_retryable` says whether retrying helps.
    #[error(transparent)]
    Cosmos(#[from] CosmosStoreError),
    /// The broker refused or is unreachable. Retry with backoff (restart).
    #[error("broker: {0}")]
    Broker(String),
}

impl CosmosWriterError {
    /// Whether retrying later can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            CosmosWriterError::Broker(_) => true,
            CosmosWriterError::Cosmos(error) => error.is_retryable(),
            CosmosWriterError::Common(_) => false,
        }
    }
}

impl contrail_common::stage::StageError for CosmosWriterError {
    fn is_retryable(&self) -> bool {
        CosmosWriterError::is_retryable(self)
    }
}
