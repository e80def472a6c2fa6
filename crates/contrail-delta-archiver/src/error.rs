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

/// What to check when the storage refuses the credentials.
pub const STORAGE_ACCESS_HINT: &str = "check delta.storage_options (e.g. azure_storage_account_key: a \
     regenerated key must be redeployed) or, with workload identity, that the identity holds \
     \"Storage Blob Data Contributor\" on the container of delta_root";

impl DeltaArchiverError {
    /// The storage refused access (401/403: a rotated key, a missing role assignment): an
    /// outage of the stage, not a fault of the records — it waits and retries, not ready,
    /// committing and dead-lettering nothing. Returns the storage's message.
    pub fn storage_access_refused(&self) -> Option<String> {
        let DeltaArchiverError::Delta { source, .. } = self else {
            return None;
        };
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source);
        while let Some(error) = cause {
            if let Some(store) = error.downcast_ref::<deltalake::ObjectStoreError>()
                && matches!(
                    store,
                    deltalake::ObjectStoreError::PermissionDenied { .. }
                        | deltalake::ObjectStoreError::Unauthenticated { .. }
                )
            {
                return Some(store.to_string());
            }
            if let Some(io) = error.downcast_ref::<std::io::Error>()
                && io.kind() == std::io::ErrorKind::PermissionDenied
            {
                return Some(io.to_string());
            }
            cause = error.source();
        }
        None
    }

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

impl From<contrail_history::HistoryError> for DeltaArchiverError {
    fn from(error: contrail_history::HistoryError) -> Self {
        match error {
            contrail_history::HistoryError::Location { root, reason } => {
                DeltaArchiverError::Location { root, reason }
            }
            contrail_history::HistoryError::Delta { table, source } => {
                DeltaArchiverError::Delta { table, source }
            }
        }
    }
}

impl contrail_common::stage::StageError for DeltaArchiverError {
    fn is_retryable(&self) -> bool {
        DeltaArchiverError::is_retryable(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(source: deltalake::DeltaTableError) -> DeltaArchiverError {
        DeltaArchiverError::Delta {
            table: "events",
            source,
        }
    }

    /// A storage that refuses the credentials is an outage; anything else keeps its class.
    #[test]
    fn refused_storage_access_is_told_apart_from_other_failures() {
        let denied = deltalake::ObjectStoreError::PermissionDenied {
            path: "history/events/_delta_log".to_owned(),
            source: "403 AuthorizationPermissionMismatch".into(),
        };
        let refused = delta(deltalake::DeltaTableError::ObjectStore { source: denied });
        let message = refused.storage_access_refused().expect("an access refusal");
        assert!(message.contains("403"), "{message}");
        let unauthenticated = deltalake::ObjectStoreError::Unauthenticated {
            path: "history".to_owned(),
            source: "401".into(),
        };
        assert!(
            delta(deltalake::DeltaTableError::ObjectStore {
                source: unauthenticated
            })
            .storage_access_refused()
            .is_some()
        );
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "read-only volume");
        assert!(
            delta(deltalake::DeltaTableError::from(io))
                .storage_access_refused()
                .is_some()
        );
        let missing = deltalake::ObjectStoreError::NotFound {
            path: "history".to_owned(),
            source: "404".into(),
        };
        assert!(
            delta(deltalake::DeltaTableError::ObjectStore { source: missing })
                .storage_access_refused()
                .is_none()
        );
        assert!(
            DeltaArchiverError::Broker("down".to_owned())
                .storage_access_refused()
                .is_none()
        );
    }
}
