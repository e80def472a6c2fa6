//! The error type of the changefeed-sync stage.

use contrail_common::CommonError;
use contrail_cosmos::CosmosStoreError;

/// What went wrong in changefeed-sync, and how to recover.
#[derive(Debug, thiserror::Error)]
pub enum ChangefeedError {
    /// Invalid configuration or setup. Stop.
    #[error(transparent)]
    Common(#[from] CommonError),
    /// Cosmos DB failed; `CosmosStoreError::is_retryable` says whether retrying helps.
    #[error(transparent)]
    Cosmos(#[from] CosmosStoreError),
    /// The broker refused or is unreachable. Retry.
    #[error("broker: {0}")]
    Broker(String),
    /// This instance no longer owns the lease (another instance took it over). Stop that lease.
    #[error("lease {0} lost to another instance")]
    LeaseLost(String),
    /// The lease belonged to a replaced container and was handed over to the new container's
    /// leases. Stop that lease.
    #[error("lease {0} superseded: its container was replaced")]
    Superseded(String),
}

impl ChangefeedError {
    /// Whether retrying later can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            ChangefeedError::Broker(_) => true,
            ChangefeedError::Cosmos(error) => error.is_retryable(),
            ChangefeedError::Common(_) | ChangefeedError::LeaseLost(_) | ChangefeedError::Superseded(_) => {
                false
            }
        }
    }
}

impl contrail_common::stage::StageError for ChangefeedError {
    fn is_retryable(&self) -> bool {
        ChangefeedError::is_retryable(self)
    }
}
