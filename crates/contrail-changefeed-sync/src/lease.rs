//! Lease documents in the `leases` container: one per feed range of the monitored container, with
//! its owner, renewal time and continuation token. Every update is a replace under `If-Match`, so
//! two instances can never both believe a write of theirs succeeded: the loser gets 412 and learns
//! the lease is no longer its own.

use std::sync::Arc;

use azure_core::http::Etag;
use azure_data_cosmos::feed::FeedRange;
use azure_data_cosmos::options::{ItemWriteOptions, Precondition};
use azure_data_cosmos::{ContainerClient, CosmosClient, FeedScope};
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
    /// `_rid` of the monitored container whose range and continuation this lease holds. Absent in
    /// leases written before it was recorded: such a lease is known stale by the service's answer
    /// (400, sub-status 1024) instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_rid: Option<String>,
    /// How many times the monitored container had been replaced (deleted and created again under
    /// the same name) when this lease was created: 0 for the first container. Its changes are
    /// labelled `<range>#<incarnation>` from the first replacement on, because a new container's
    /// `_lsn` starts again and history would take them for copies of the old one's
    /// (docs/CONTRACT.md, "Change feed").
    #[serde(default)]
    pub incarnation: u32,
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

/// The id of the lease of `range` in incarnation `incarnation` of `container` (see
/// [`Lease::incarnation`]); incarnation 0 keeps the ids earlier versions created.
pub fn lease_id_in(container: &str, range: &str, incarnation: u32) -> String {
    match incarnation {
        0 => lease_id(container, range),
        n => lease_id(&format!("{container}-{n}"), range),
    }
}

/// The label of changes read from `physical_range` in incarnation `incarnation` of the monitored
/// container: the range itself for the first container (what earlier versions wrote), then
/// `<range>#<incarnation>` — a new origin for history's per-origin `_lsn` rule.
pub fn change_label(physical_range: &str, incarnation: u32) -> String {
    match incarnation {
        0 => physical_range.to_owned(),
        n => format!("{physical_range}#{n}"),
    }
}

/// Whether `error` is the service refusing a request addressed to a container that was replaced
/// (400 with sub-status 1024, "collection RID mismatch") or the SDK refusing to carry an explicit
/// feed range over to the replacement.
pub fn refers_to_replaced_container(error: &CosmosStoreError) -> bool {
    match error {
        CosmosStoreError::Service {
            status,
            sub_status,
            message,
            ..
        } => (*status == 400 && *sub_status == Some(1024)) || message.contains("recreated container"),
        _ => false,
    }
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
    /// Replaced by a client resolved afresh when the monitored container is replaced.
    monitored: Arc<std::sync::RwLock<ContainerClient>>,
    client: CosmosClient,
    database: String,
    container: String,
}

impl LeaseStore {
    /// Leases in `leases` for the feed ranges of `monitored`, container `container` of database
    /// `database` of `client` (which opens the container again after it was replaced).
    pub fn new(
        leases: ContainerClient,
        monitored: ContainerClient,
        client: CosmosClient,
        database: &str,
        container: &str,
    ) -> LeaseStore {
        LeaseStore {
            leases,
            monitored: Arc::new(std::sync::RwLock::new(monitored)),
            client,
            database: database.to_owned(),
            container: container.to_owned(),
        }
    }

    /// The monitored container's client.
    pub fn monitored(&self) -> ContainerClient {
        match self.monitored.read() {
            Ok(client) => client.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The `_rid` of the container named like the monitored one now (read by name: a replaced
    /// container answers with its new id).
    pub async fn current_rid(&self) -> Result<String, CosmosStoreError> {
        let properties: azure_data_cosmos::models::ContainerProperties = self
            .monitored()
            .read(None)
            .await
            .and_then(|response| response.into_model())
            .map_err(|error| {
                CosmosStoreError::service(format!("read container {}", self.container), &error)
            })?;
        properties
            .system_properties
            .resource_id
            .ok_or_else(|| CosmosStoreError::Document {
                id: self.container.clone(),
                message: "the container's properties carry no _rid".to_owned(),
            })
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
            .monitored()
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

    /// Makes sure every feed range of the monitored container has a lease (docs/CONTRACT.md, "No
    /// silent gap"): creates one for each current feed range that the leases of the newest
    /// incarnation do not cover whole — every range when there are no leases yet, the missing
    /// ones when a bootstrap was interrupted after its first lease or a lease was deleted. A
    /// range the leases cover needs none: after a split, the parent's lease keeps covering its
    /// children (the SDK's continuation token tracks each child), and a lease for a child would
    /// read its changes twice. Leases of a replaced container are left to
    /// [`LeaseStore::supersede`]. Called at start and periodically; returns the leases created.
    pub async fn ensure_leases(&self) -> Result<usize, CosmosStoreError> {
        let leases = self.list().await?;
        let rid = self.current_rid().await?;
        let incarnation = leases.iter().map(|lease| lease.incarnation).max().unwrap_or(0);
        let newest: Vec<&Lease> = leases
            .iter()
            .filter(|lease| lease.incarnation == incarnation)
            .collect();
        if newest.iter().any(|lease| {
            lease
                .container_rid
                .as_deref()
                .is_some_and(|lease_rid| lease_rid != rid)
        }) {
            // The container was replaced: its new leases come from `supersede`.
            return Ok(0);
        }
        let mut leased = Vec::with_capacity(newest.len());
        for lease in newest {
            leased.push(Self::feed_range(lease)?);
        }
        self.create_leases(&rid, incarnation, !leases.is_empty(), &leased)
            .await
    }

    /// Creates the leases of incarnation `incarnation` of the monitored container (`_rid` `rid`),
    /// one per feed range it has now (`refresh`: read afresh, not from the client's cache) that
    /// the union of `leased` does not cover whole ([`ranges_without_lease`]). A lease that exists
    /// already (created by another instance) is kept as it is.
    async fn create_leases(
        &self,
        rid: &str,
        incarnation: u32,
        refresh: bool,
        leased: &[FeedRange],
    ) -> Result<usize, CosmosStoreError> {
        let options =
            azure_data_cosmos::options::ReadFeedRangesOptions::default().with_force_refresh(refresh);
        let ranges = self
            .monitored()
            .read_feed_ranges(Some(options))
            .await
            .map_err(|error| CosmosStoreError::service("read feed ranges", &error))?;
        let mut created = 0;
        let missing = ranges_without_lease(&ranges, leased, |range: &FeedRange| {
            (range.min_inclusive(), range.max_exclusive())
        });
        for range in missing {
            tracing::info!(lease_range = %range, incarnation, "feed range without a lease: creating one");
            let range = range.to_string();
            let lease = Lease {
                id: lease_id_in(&self.container, &range, incarnation),
                container: self.container.clone(),
                feed_range: range,
                owner: String::new(),
                continuation: None,
                renewed_at_ms: 0,
                last_lsn: 0,
                last_ts: 0,
                published: 0,
                container_rid: Some(rid.to_owned()),
                incarnation,
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

    /// Resolves the monitored container afresh: after it was replaced, requests of a client
    /// resolved before carry the old container's identity, and the SDK refuses to carry explicit
    /// feed ranges over to the new one.
    pub async fn reopen(&self) -> Result<(), CosmosStoreError> {
        let fresh = self
            .client
            .database_client(self.database.as_str())
            .container_client(self.container.as_str(), None)
            .await
            .map_err(|error| {
                CosmosStoreError::service(format!("open container {}", self.container), &error)
            })?;
        match self.monitored.write() {
            Ok(mut client) => *client = fresh,
            Err(poisoned) => *poisoned.into_inner() = fresh,
        }
        Ok(())
    }

    /// The monitored container was replaced (deleted and created again under its name; `_rid`
    /// `rid` now): `stale`'s range and continuation belong to the old container, which the
    /// service refuses for good, and nothing of the old container can be read any more. Creates
    /// the leases of the new incarnation (one per feed range of the new container, read from its
    /// beginning; every instance creating them ends with the same leases), then deletes `stale`
    /// under If-Match. Returns the leases this call created. Call [`LeaseStore::reopen`] first.
    pub async fn supersede(&self, stale: &Lease, rid: &str) -> Result<usize, ChangefeedError> {
        // Leases of this container may exist already (another instance superseded first, or the
        // container was replaced twice and a lease two incarnations old meets it now): then
        // only the stale lease goes, and no second set reads the container again.
        let current = self.list().await?;
        let created = if current
            .iter()
            .any(|lease| lease.container_rid.as_deref() == Some(rid))
        {
            0
        } else {
            let newest = current
                .iter()
                .map(|lease| lease.incarnation)
                .max()
                .unwrap_or_default();
            self.create_leases(rid, newest.max(stale.incarnation).saturating_add(1), true, &[])
                .await?
        };
        self.delete(stale).await?;
        Ok(created)
    }

    /// Deletes `lease` under If-Match of its ETag (412 / 404: another instance changed or deleted
    /// it first — [`ChangefeedError::LeaseLost`]).
    async fn delete(&self, lease: &Lease) -> Result<(), ChangefeedError> {
        self.leases
            .delete_item(lease.id.clone(), &lease.id, Some(if_match(lease)?))
            .await
            .map_err(|error| lease_write_failed("delete", lease, &error))?;
        Ok(())
    }

    /// Replaces `lease` under If-Match of its ETag; returns it with the new ETag. 412 or 404 mean
    /// another instance changed it: [`ChangefeedError::LeaseLost`].
    pub async fn replace(&self, lease: &Lease) -> Result<Lease, ChangefeedError> {
        let response = self
            .leases
            .replace_item(lease.id.clone(), &lease.id, lease, Some(if_match(lease)?))
            .await
            .map_err(|error| lease_write_failed("replace", lease, &error))?;
        let mut updated = lease.clone();
        updated.etag = response.headers().etag().map(|etag| etag.to_string());
        Ok(updated)
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

/// The feed ranges of `current` that the union of `leased` does not cover whole: those need a
/// lease. `bounds` gives a range's [min, max). A range inside one lease (a split child) or inside
/// several (a merge of leased ranges) is read through them; one covered only in part gets a lease
/// of its own, which reads the covered part a second time — harmless, as every change carries
/// `(id, _lsn)` — rather than leave the rest unread. Pure.
pub fn ranges_without_lease<'a, R, K: PartialOrd + Copy>(
    current: &'a [R],
    leased: &'a [R],
    bounds: impl Fn(&'a R) -> (K, K),
) -> Vec<&'a R> {
    let mut leases: Vec<(K, K)> = leased.iter().map(&bounds).collect();
    leases.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
    let covered = |(min, max): (K, K)| {
        let mut cursor = min;
        for (lease_min, lease_max) in &leases {
            if cursor >= max {
                break;
            }
            if *lease_min <= cursor && cursor < *lease_max {
                cursor = *lease_max;
            }
        }
        cursor >= max
    };
    current.iter().filter(|range| !covered(bounds(range))).collect()
}

/// Write options conditional on `lease`'s ETag (a lease without one was never read: lost).
fn if_match(lease: &Lease) -> Result<ItemWriteOptions, ChangefeedError> {
    let etag = lease
        .etag
        .clone()
        .ok_or_else(|| ChangefeedError::LeaseLost(lease.id.clone()))?;
    Ok(ItemWriteOptions::default().with_precondition(Precondition::if_match(Etag::from(etag))))
}

/// A conditional write of `lease` that failed: 412 or 404 mean another instance changed or
/// deleted it ([`ChangefeedError::LeaseLost`]); anything else is the service's error.
fn lease_write_failed(
    action: &str,
    lease: &Lease,
    error: &azure_data_cosmos::CosmosError,
) -> ChangefeedError {
    let error = CosmosStoreError::service(format!("{action} lease {}", lease.id), error);
    match error.class() {
        ErrorClass::PreconditionFailed | ErrorClass::NotFound => ChangefeedError::LeaseLost(lease.id.clone()),
        _ => error.into(),
    }
}

/// A lease owned by this instance: the latest document (and ETag), shared by the processing task
/// and the renewal loop, which serialise their updates through the mutex.
pub type OwnedLease = Arc<tokio::sync::Mutex<Lease>>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed ranges as half-open intervals [min, max) of the key space 0..16.
    fn bounds(range: &(u8, u8)) -> (u8, u8) {
        *range
    }

    #[test]
    fn every_range_not_wholly_leased_gets_a_lease() {
        let current = [(0, 4), (4, 8), (8, 12), (12, 16)];
        // No leases yet: all four.
        assert_eq!(ranges_without_lease(&current, &[], bounds).len(), 4);
        // A bootstrap interrupted after its first lease: the other three.
        assert_eq!(
            ranges_without_lease(&current, &[(0, 4)], bounds),
            [&(4, 8), &(8, 12), &(12, 16)]
        );
        // Split children of leased ranges, and a merge of two leased ranges: none.
        let after = [(0, 2), (2, 4), (4, 16)];
        let leases = [(0, 4), (4, 8), (8, 12), (12, 16)];
        assert!(ranges_without_lease(&after, &leases, bounds).is_empty());
        // A merge of a leased and an unleased range: a lease of its own.
        assert_eq!(ranges_without_lease(&[(0, 8)], &[(0, 4)], bounds), [&(0, 8)]);
    }

    proptest::proptest! {
        /// Any partition of the key space into ranges and any set of leases: afterwards every point
        /// of the key space is in a leased or a newly leased range, and a range wholly inside the
        /// leases gets no second lease.
        #[test]
        fn afterwards_every_point_is_covered_and_no_whole_range_twice(
            cuts in proptest::collection::btree_set(1u8..16, 0..8),
            leases in proptest::collection::vec((0u8..16, 1u8..5), 0..5),
        ) {
            let mut points: Vec<u8> = std::iter::once(0).chain(cuts).chain(std::iter::once(16)).collect();
            points.dedup();
            let current: Vec<(u8, u8)> = points.windows(2).map(|pair| (pair[0], pair[1])).collect();
            let leased: Vec<(u8, u8)> = leases.iter().map(|(min, width)| (*min, (*min + width).min(16))).collect();
            let created = ranges_without_lease(&current, &leased, bounds);
            let in_a_lease = |point: u8| leased.iter().any(|lease| lease.0 <= point && point < lease.1);
            for point in 0u8..16 {
                let created_here = created.iter().any(|range| range.0 <= point && point < range.1);
                proptest::prop_assert!(in_a_lease(point) || created_here, "point {} uncovered", point);
            }
            for range in &current {
                let wholly_leased = (range.0..range.1).all(in_a_lease);
                proptest::prop_assert_eq!(created.contains(&range), !wholly_leased, "{:?}", range);
            }
        }
    }

    #[test]
    fn lease_ids_are_stable_and_safe() {
        let a = lease_id("flights", "[\"\",\"3FFF\")");
        assert_eq!(a, lease_id("flights", "[\"\",\"3FFF\")"));
        assert_ne!(a, lease_id("flights", "[\"3FFF\",\"7FFF\")"));
        assert!(a.starts_with("flights-"));
        assert!(!a.contains(['/', '\\', '?', '#']));
        assert_eq!(lease_id_in("flights", "r", 0), lease_id("flights", "r"));
        let replaced = lease_id_in("flights", "r", 1);
        assert!(replaced.starts_with("flights-1-"), "{replaced}");
        assert_ne!(replaced, lease_id_in("flights", "r", 2));
    }

    #[test]
    fn changes_of_a_replaced_container_are_labelled_apart() {
        assert_eq!(change_label("[\"\",\"3FFF\")", 0), "[\"\",\"3FFF\")");
        assert_eq!(change_label("[\"\",\"3FFF\")", 2), "[\"\",\"3FFF\")#2");
    }

    #[test]
    fn the_answers_about_a_replaced_container_are_recognised() {
        let service = |status, sub_status, message: &str| CosmosStoreError::Service {
            operation: "query change feed".to_owned(),
            status,
            sub_status,
            message: message.to_owned(),
        };
        assert!(refers_to_replaced_container(&service(
            400,
            Some(1024),
            "CollectionRidMismatch"
        )));
        assert!(refers_to_replaced_container(&service(
            400,
            None,
            "an explicit effective partition key range cannot be carried to a recreated container"
        )));
        assert!(!refers_to_replaced_container(&service(400, None, "bad request")));
        assert!(!refers_to_replaced_container(&service(
            404,
            Some(1003),
            "not found"
        )));
        assert!(!refers_to_replaced_container(&service(503, None, "unavailable")));
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
