//! Lease documents in the `leases` container: one per feed range of the monitored container, with
//! its owner, renewal time and continuation token. Every update is a replace under `If-Match`, so
//! two instances can never both believe a write of theirs succeeded: the loser gets 412 and learns
//! the lease is no longer its own.

use std::sync::Arc;

use azure_core::http::Etag;
use azure_data_cosmos::feed::FeedRange;
use azure_data_cosmos::options::{ItemWriteOptions, Precondition};
use azure_data_cosmos::{ContainerClient, FeedScope};
use contrail_cosmos::{CosmosStoreError, ErrorClass};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::ChangefeedError;

/// A lease document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// `<container>-<hash of the feed range>`.
    pub id: String,
    /// The monitored container.
    pub container: String,
    /// The feed range (the SDK's string form).
    pub feed_range: String,
    /// Owner instance; empty = free.
    #[serde(default)]
    pub owner: String,
    /// Continuation token after the last change whose publication the broker acknowledged.
    #[serde(default)]
    pub continuation: Option<String>,
    /// Last renewal by the owner, ms since the epoch.
    #[serde(default)]
    pub renewed_at_ms: i64,
    /// `_lsn` of the last change published.
    #[serde(default)]
    pub last_lsn: i64,
    /// `_ts` of the last change published.
    #[serde(default)]
    pub last_ts: i64,
    /// Changes published from this lease, all owners together.
    #[serde(default)]
    pub published: u64,
    /// The document's ETag (system property; not written back).
    #[serde(rename = "_etag", default, skip_serializing)]
    pub etag: Option<String>,
}

/// The lease id of `range` of `container`: stable, and free of characters ids may not hold.
pub fn lease_id(container: &str, range: &str) -> String {
    let digest = sha2::Sha256::digest(range.as_bytes());
    let hex: String = digest.iter().take(8).map(|byte| format!("{byte:02x}")).collect();
    format!("{container}-{hex}")
}

/// Wall clock in ms since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as i64)
        .unwrap_or(0)
}

/// The lease container.
#[derive(Clone)]
pub struct LeaseStore {
    leases: ContainerClient,
    monitored: ContainerClient,
    container: String,
}

impl LeaseStore {
    /// Leases in `leases` for the feed ranges of `monitored` (named `container`).
    pub fn new(leases: ContainerClient, monitored: ContainerClient, container: &str) -> LeaseStore {
        LeaseStore {
            leases,
            monitored,
            container: container.to_owned(),
        }
    }

    /// The monitored container's client.
    pub fn monitored(&self) -> &ContainerClient {
        &self.monitored
    }

    /// The physical feed range (partition key range) that holds documents of `partition_key` now
    /// (from the client's routing map; `refresh` re-reads it, as after a split).
    pub async fn physical_range(
        &self,
        partition_key: &str,
        refresh: bool,
    ) -> Result<String, CosmosStoreError> {
        let options =
            azure_data_cosmos::options::ReadFeedRangesOptions::default().with_force_refresh(refresh);
        let ranges = self
            .monitored
            .feed_range_from_partition_key(partition_key.to_owned(), Some(options))
            .await
            .map_err(|error| CosmosStoreError::service("feed range of a partition key", &error))?;
        ranges
            .first()
            .map(ToString::to_string)
            .ok_or_else(|| CosmosStoreError::Document {
                id: partition_key.to_owned(),
                message: "no feed range holds this partition key".to_owned(),
            })
    }

    /// Every lease of the monitored container.
    pub async fn list(&self) -> Result<Vec<Lease>, CosmosStoreError> {
        let query = format!(
            "SELECT * FROM c WHERE c.container = '{}'",
            self.container.replace('\'', "")
        );
        let mut items = self
            .leases
            .query_items::<Lease>(query, FeedScope::full_container(), None)
            .await
            .map_err(|error| CosmosStoreError::service("list leases", &error))?;
        let mut leases = Vec::new();
        while let Some(item) = items.next().await {
            leases.push(item.map_err(|error| CosmosStoreError::service("list leases", &error))?);
        }
        leases.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(leases)
    }

    /// Creates one lease per current feed range — only when the container has no leases yet. Later
    /// splits need no new leases: a lease's range keeps covering its children (the SDK's
    /// continuation token tracks each child), and creating leases for children would read their
    /// changes twice.
    pub async fn bootstrap(&self) -> Result<usize, CosmosStoreError> {
        if !self.list().await?.is_empty() {
            return Ok(0);
        }
        let ranges = self
            .monitored
            .read_feed_ranges(None)
            .await
            .map_err(|error| CosmosStoreError::service("read feed ranges", &error))?;
        let mut created = 0;
        for range in ranges {
            let range = range.to_string();
            let lease = Lease {
                id: lease_id(&self.container, &range),
                container: self.container.clone(),
                feed_range: range,
                owner: String::new(),
                continuation: None,
                renewed_at_ms: 0,
                last_lsn: 0,
                last_ts: 0,
                published: 0,
                etag: None,
            };
            match self
                .leases
                .create_item(lease.id.clone(), &lease.id, &lease, None)
                .await
            {
                Ok(_) => created += 1,
                Err(error) if u16::from(error.status().status_code()) == 409 => {}
                Err(error) => {
                    return Err(CosmosStoreError::service(
                        format!("create lease {}", lease.id),
                        &error,
                    ));
                }
            }
        }
        Ok(created)
    }

    /// Replaces `lease` under If-Match of its ETag; returns it with the new ETag. 412 or 404 mean
    /// another instance changed it: [`ChangefeedError::LeaseLost`].
    pub async fn replace(&self, lease: &Lease) -> Result<Lease, ChangefeedError> {
        let etag = lease
            .etag
            .clone()
            .ok_or_else(|| ChangefeedError::LeaseLost(lease.id.clone()))?;
        let options = ItemWriteOptions::default().with_precondition(Precondition::if_match(Etag::from(etag)));
        match self
            .leases
            .replace_item(lease.id.clone(), &lease.id, lease, Some(options))
            .await
        {
            Ok(response) => {
                let mut updated = lease.clone();
                updated.etag = response.headers().etag().map(|etag| etag.to_string());
                Ok(updated)
            }
            Err(error) => {
                let error = CosmosStoreError::service(format!("replace lease {}", lease.id), &error);
                match error.class() {
                    ErrorClass::PreconditionFailed | ErrorClass::NotFound => {
                        Err(ChangefeedError::LeaseLost(lease.id.clone()))
                    }
                    _ => Err(error.into()),
                }
            }
        }
    }

    /// The feed range of `lease`.
    pub fn feed_range(lease: &Lease) -> Result<FeedRange, CosmosStoreError> {
        lease
            .feed_range
            .parse::<FeedRange>()
            .map_err(|error| CosmosStoreError::Document {
                id: lease.id.clone(),
                message: format!("feed range {:?}: {error}", lease.feed_range),
            })
    }
}

/// A lease owned by this instance: the latest document (and ETag), shared by the processing task
/// and the renewal loop, which serialise their updates through the mutex.
pub type OwnedLease = Arc<tokio::sync::Mutex<Lease>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_are_stable_and_safe() {
        let a = lease_id("flights", "[\"\",\"3FFF\")");
        assert_eq!(a, lease_id("flights", "[\"\",\"3FFF\")"));
        assert_ne!(a, lease_id("flights", "[\"3FFF\",\"7FFF\")"));
        assert!(a.starts_with("flights-"));
        assert!(!a.contains(['/', '\\', '?', '#']));
    }

    #[test]
    fn etag_is_read_but_never_written() {
        let lease: Lease = serde_json::from_value(serde_json::json!({
            "id": "flights-1", "container": "flights", "feedRange": "r", "_etag": "\"e1\"", "_ts": 5
        }))
        .expect("lease");
        assert_eq!(lease.etag.as_deref(), Some("\"e1\""));
        let written = serde_json::to_value(&lease).expect("json");
        assert!(written.get("_etag").is_none());
        assert_eq!(written["feedRange"], "r");
    }
}
