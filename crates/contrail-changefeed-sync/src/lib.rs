//! The `changefeed-sync` stage (DESIGN §4): the Cosmos DB change feed of `flights` onto
//! `ops.flights.changes`, with a change feed processor of our own (the Rust SDK has none).
//!
//! - **Leases** ([`lease`]): one document per feed range in the `leases` container, created once
//!   from the container's feed ranges. Owner, renewal time and continuation token; every update is
//!   a replace under `If-Match`.
//! - **Balancing** ([`balance`], pure): every `renew_interval_ms` an instance renews its leases,
//!   lists all of them and takes free/expired ones up to its fair share, or one from the busiest
//!   owner when that evens things out. A lease whose owner stopped renewing for `expiry_ms` is
//!   taken over — that is how a killed instance's ranges move.
//! - **Processing**: a task per owned lease reads its feed range from the lease's continuation
//!   token, publishes each change as a `ServingChange` keyed by flight key, waits for the broker's
//!   acknowledgement of the whole page, and only then stores the page's continuation token in the
//!   lease. A crash or a takeover therefore re-publishes at most the changes after the last stored
//!   token — at-least-once, and each redelivery is identifiable by `(id, lsn)`.

pub mod balance;
pub mod config;
pub mod error;
pub mod lease;
pub mod metrics;

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use azure_data_cosmos::FeedScope;
use azure_data_cosmos::feed::ContinuationToken;
use azure_data_cosmos::options::{ChangeFeedOptions, ChangeFeedStartFrom, MaxItemCountHint};
use contrail_common::admin::{StageStatus, StreamAdmin};
use contrail_common::metrics::MetricsRegistry;
use contrail_common::server::{self, Health};
use contrail_common::shutdown::Shutdown;
use contrail_cosmos::backoff;
use contrail_proto::admin::v1 as admin;
use contrail_proto::v1::ServingChange;
use futures::StreamExt;
use prost::Message as _;
use rdkafka::producer::{FutureProducer, FutureRecord};

pub use config::ChangefeedSyncConfig;
pub use error::ChangefeedError;

use crate::balance::LeaseView;
use crate::lease::{Lease, LeaseStore, OwnedLease, now_ms};
use crate::metrics::ChangefeedMetrics;

/// What the admin API shows of each lease.
type LeaseBoard = Arc<Mutex<BTreeMap<String, admin::LeaseStatus>>>;

struct Shared {
    config: ChangefeedSyncConfig,
    store: LeaseStore,
    producer: FutureProducer,
    metrics: ChangefeedMetrics,
    board: LeaseBoard,
    paused: Arc<AtomicBool>,
    /// Refused Cosmos DB credentials: readiness and the error log.
    outage: contrail_cosmos::CredentialOutage,
}

struct Running {
    lease: OwnedLease,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<(), ChangefeedError>>,
}

struct SyncStatus {
    instance: String,
    board: LeaseBoard,
    metrics: ChangefeedMetrics,
    started: Instant,
}

#[tonic::async_trait]
impl StageStatus for SyncStatus {
    async fn status(&self) -> Result<admin::StatusResponse, tonic::Status> {
        let leases: Vec<admin::LeaseStatus> = self
            .board
            .lock()
            .map(|board| board.values().cloned().collect())
            .unwrap_or_default();
        let m = &self.metrics;
        let counters = [
            ("changes_published_total", m.published.get() as f64),
            ("pages_total", m.pages.get() as f64),
            ("leases_owned", m.owned.get() as f64),
            ("leases_acquired_total", m.acquired.get() as f64),
            ("leases_lost_total", m.lost.get() as f64),
            ("missing_lsn_total", m.missing_lsn.get() as f64),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        let uptime = self.started.elapsed().as_secs_f64().max(1.0);
        Ok(admin::StatusResponse {
            instance: self.instance.clone(),
            uptime_seconds: uptime as i64,
            counters,
            events_per_second: m.published.get() as f64 / uptime,
            leases,
            ..admin::StatusResponse::default()
        })
    }
}

/// The change topic's producer: idempotent and without a delivery timeout, so a page's changes
/// reach each topic partition in `_lsn` order (a timed-out change re-published behind newer ones
/// would be taken for a copy downstream, DESIGN §4).
fn producer(config: &ChangefeedSyncConfig) -> Result<FutureProducer, ChangefeedError> {
    let mut client = config.kafka.producer_config("changefeed-sync")?;
    client.set("message.timeout.ms", "0");
    client
        .create()
        .map_err(|error| ChangefeedError::Broker(format!("producer: {error}")))
}

/// The `ServingChange` of one change feed document, or why it is not one. A document too large for
/// one message of at most `max_message_bytes` (Cosmos DB documents reach 2 MB) is published
/// without its JSON (`document_omitted`, `document_size`): the change still reaches the topic,
/// and the document is in the serving store.
pub fn serving_change(
    document: &serde_json::Value,
    feed_range: &str,
    max_message_bytes: usize,
) -> Result<ServingChange, String> {
    let id = document
        .get("id")
        .and_then(serde_json::Value::as_str)
        .ok_or("document without id")?;
    let flight_key = document
        .get("flightKey")
        .and_then(serde_json::Value::as_str)
        .unwrap_or(id);
    let mut change = ServingChange {
        id: id.to_owned(),
        flight_key: flight_key.to_owned(),
        lsn: document
            .get("_lsn")
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(0),
        ts: document
            .get("_ts")
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(0),
        document_json: document.to_string(),
        feed_range: feed_range.to_owned(),
        ..ServingChange::default()
    };
    let budget = max_message_bytes
        .saturating_sub(change.flight_key.len() + contrail_common::dead_letter::RECORD_OVERHEAD_BYTES);
    if change.encoded_len() > budget {
        change.document_size = change.document_json.len() as u64;
        change.document_json = String::new();
        change.document_omitted = true;
    }
    Ok(change)
}

/// Runs the stage until `shutdown`.
pub async fn run(config: ChangefeedSyncConfig, shutdown: Shutdown) -> Result<(), ChangefeedError> {
    config
        .validate()
        .map_err(|message| ChangefeedError::Common(contrail_common::CommonError::Config(message)))?;
    let started = Instant::now();
    let registry = MetricsRegistry::new();
    let metrics = ChangefeedMetrics::new(&registry);
    let health = Health::new();
    let tokens = config.auth.load()?;
    if !tokens.enabled() {
        tracing::warn!("no auth.tokens configured: the admin API accepts unauthenticated requests");
    }
    if config.topics.create {
        contrail_common::kafka::create_topics(
            &config.kafka,
            "changefeed-sync",
            &[config.topics.changes.as_str()],
            config.topics.partitions,
        )
        .await?;
    }
    let containers = tokio::select! {
        containers = config.cosmos.open("changefeed-sync") => containers?,
        () = shutdown.triggered() => return Ok(()),
    };
    let store = LeaseStore::new(
        containers.leases.clone(),
        containers.flights.clone(),
        &config.cosmos.flights_container,
    );
    let created = tokio::select! {
        created = contrail_cosmos::retry_setup("lease bootstrap", || store.bootstrap()) => created?,
        () = shutdown.triggered() => return Ok(()),
    };
    if created > 0 {
        tracing::info!(leases = created, "leases created, one per feed range");
    }
    let board: LeaseBoard = Arc::default();
    let paused = Arc::new(AtomicBool::new(false));
    let shared = Arc::new(Shared {
        producer: producer(&config)?,
        config: config.clone(),
        store,
        metrics: metrics.clone(),
        board: board.clone(),
        paused: paused.clone(),
        outage: contrail_cosmos::CredentialOutage::with_health("change feed reads", health.clone()),
    });

    let listeners = server::Listeners::bind(&config.listen).await?;
    let admin = StreamAdmin::new(
        "changefeed-sync",
        "changefeed-sync keeps its progress in the leases container (one continuation token per \
         feed range); see Status for the leases",
        SyncStatus {
            instance: config.instance.clone(),
            board,
            metrics: metrics.clone(),
            started,
        },
        paused,
        health.clone(),
        shutdown.clone(),
    );
    let servers = admin.serve(listeners, &tokens, registry);
    health.set_ready(true);
    tracing::info!(instance = %config.instance, "changefeed-sync running");

    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    let interval = Duration::from_millis(config.leases.renew_interval_ms);
    while !shutdown.is_triggered() {
        if let Err(error) = maintain(&shared, &mut running).await {
            tracing::warn!(%error, "lease maintenance failed; retrying next round");
        }
        metrics.owned.set(running.len() as i64);
        tokio::select! {
            () = shutdown.triggered() => {}
            () = tokio::time::sleep(interval) => {}
        }
    }
    health.set_ready(false);
    tracing::info!(
        leases = running.len(),
        "shutdown: finishing pages in flight and releasing leases"
    );
    for (id, lease) in running {
        lease.stop.store(true, Ordering::Relaxed);
        let _ = lease.task.await;
        let mut document = lease.lease.lock().await;
        document.owner = String::new();
        match shared.store.replace(&document).await {
            Ok(updated) => *document = updated,
            Err(error) => tracing::warn!(lease = %id, %error, "could not release lease; it expires instead"),
        }
    }
    servers.join().await;
    Ok(())
}

/// One round: renew owned leases, reap finished tasks, list, balance, take.
async fn maintain(
    shared: &Arc<Shared>,
    running: &mut BTreeMap<String, Running>,
) -> Result<(), ChangefeedError> {
    let me = shared.config.instance.clone();
    let mut lost = Vec::new();
    for (id, entry) in running.iter() {
        if entry.task.is_finished() {
            lost.push(id.clone());
            continue;
        }
        let mut document = entry.lease.lock().await;
        let mut renewed = document.clone();
        renewed.renewed_at_ms = now_ms();
        renewed.owner = me.clone();
        match shared.store.replace(&renewed).await {
            Ok(updated) => *document = updated,
            Err(ChangefeedError::LeaseLost(_)) => lost.push(id.clone()),
            Err(error) => tracing::warn!(lease = %id, %error, "lease renewal failed"),
        }
    }
    for id in lost {
        if let Some(entry) = running.remove(&id) {
            entry.stop.store(true, Ordering::Relaxed);
            match entry.task.await {
                Ok(Err(ChangefeedError::LeaseLost(_))) | Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::warn!(lease = %id, %error, "lease task failed"),
                Err(error) => tracing::error!(lease = %id, %error, "lease task panicked"),
            }
            shared.metrics.lost.inc();
            tracing::info!(lease = %id, "lease no longer owned");
        }
    }

    let leases = shared.store.list().await?;
    let now = now_ms();
    let expiry = shared.config.leases.expiry_ms as i64;
    if let Ok(mut board) = shared.board.lock() {
        // Leases this instance runs are shown by their tasks, which are ahead of the listing.
        for lease in leases.iter().filter(|lease| !running.contains_key(&lease.id)) {
            let owner = if balance::is_free(&view(lease), now, expiry) {
                String::new()
            } else {
                lease.owner.clone()
            };
            show(&mut board, lease, owner, None);
        }
    }
    let views: Vec<LeaseView> = leases.iter().map(view).collect();
    for id in balance::leases_to_take(&views, &me, now, expiry) {
        if running.contains_key(&id) {
            continue;
        }
        let Some(lease) = leases.iter().find(|lease| lease.id == id) else {
            continue;
        };
        let previous = lease.owner.clone();
        let mut taken = lease.clone();
        taken.owner = me.clone();
        taken.renewed_at_ms = now_ms();
        match shared.store.replace(&taken).await {
            Ok(updated) => {
                shared.metrics.acquired.inc();
                tracing::info!(lease = %id, previous_owner = %previous, range = %updated.feed_range, "lease acquired");
                let owned: OwnedLease = Arc::new(tokio::sync::Mutex::new(updated));
                let stop = Arc::new(AtomicBool::new(false));
                let task = tokio::spawn(process_lease(shared.clone(), owned.clone(), stop.clone()));
                running.insert(
                    id,
                    Running {
                        lease: owned,
                        stop,
                        task,
                    },
                );
            }
            Err(ChangefeedError::LeaseLost(_)) => {
                tracing::debug!(lease = %id, "another instance took the lease first");
            }
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

fn view(lease: &Lease) -> LeaseView {
    LeaseView {
        id: lease.id.clone(),
        owner: lease.owner.clone(),
        renewed_at_ms: lease.renewed_at_ms,
    }
}

fn update_board(shared: &Shared, lease: &Lease, lag_seconds: f64) {
    shared
        .metrics
        .lag_seconds
        .with_label_values(&[&lease.id])
        .set(lag_seconds);
    shared
        .metrics
        .last_lsn
        .with_label_values(&[&lease.id])
        .set(lease.last_lsn as f64);
    if let Ok(mut board) = shared.board.lock() {
        show(&mut board, lease, lease.owner.clone(), Some(lag_seconds));
    }
}

/// Puts `lease` on the admin board with `owner` (empty: free); `lag_seconds` when known.
fn show(
    board: &mut BTreeMap<String, admin::LeaseStatus>,
    lease: &Lease,
    owner: String,
    lag_seconds: Option<f64>,
) {
    let entry = board.entry(lease.id.clone()).or_default();
    entry.feed_range = lease.feed_range.clone();
    entry.owner = owner;
    entry.last_lsn = lease.last_lsn;
    entry.last_ts = lease.last_ts;
    entry.renewed_ms_ago = now_ms().saturating_sub(lease.renewed_at_ms);
    entry.changes_published = lease.published;
    if let Some(lag) = lag_seconds {
        entry.lag_seconds = lag;
    }
}

/// Reads one lease's feed range until stopped or the lease is lost.
async fn process_lease(
    shared: Arc<Shared>,
    lease: OwnedLease,
    stop: Arc<AtomicBool>,
) -> Result<(), ChangefeedError> {
    let (id, range_text, range) = {
        let document = lease.lock().await;
        let range = LeaseStore::feed_range(&document)?;
        (document.id.clone(), document.feed_range.clone(), range)
    };
    let poll = Duration::from_millis(shared.config.leases.poll_interval_ms);
    let page_size = NonZeroU32::new(shared.config.leases.max_items_per_page).unwrap_or(NonZeroU32::MIN);
    let mut failures: u32 = 0;
    while !stop.load(Ordering::Relaxed) {
        if shared.paused.load(Ordering::Relaxed) {
            tokio::time::sleep(poll).await;
            continue;
        }
        match poll_once(&shared, &lease, &stop, &range, &range_text, page_size).await {
            Ok(()) => {
                failures = 0;
                shared.outage.succeeded();
            }
            Err(ChangefeedError::Cosmos(error)) if error.is_unauthorized() => {
                // Refused credentials: an outage (not ready, said once per 30 s), retried from the
                // stored continuation; nothing is published or stored meanwhile.
                shared.outage.refused(&error);
                let delay = backoff(failures).max(Duration::from_secs(1));
                failures = failures.saturating_add(1);
                tokio::time::sleep(delay).await;
                continue;
            }
            Err(ChangefeedError::LeaseLost(lost)) => return Err(ChangefeedError::LeaseLost(lost)),
            Err(error) => {
                let delay = backoff(failures);
                failures = failures.saturating_add(1);
                tracing::warn!(lease = %id, %error, delay_ms = delay.as_millis() as u64, "change feed poll failed; retrying from the stored continuation");
                tokio::time::sleep(delay).await;
                continue;
            }
        }
        tokio::time::sleep(poll).await;
    }
    Ok(())
}

/// One poll: pages from the stored continuation until caught up; each page published and
/// acknowledged before its continuation is stored.
async fn poll_once(
    shared: &Shared,
    lease: &OwnedLease,
    stop: &AtomicBool,
    range: &azure_data_cosmos::feed::FeedRange,
    range_text: &str,
    page_size: NonZeroU32,
) -> Result<(), ChangefeedError> {
    let continuation = lease.lock().await.continuation.clone();
    let max_message_bytes = shared.config.kafka.max_message_bytes();
    // The highest `_lsn` published per physical range in this poll (see `label_physical_ranges`).
    let mut published_lsn: HashMap<String, i64> = HashMap::new();
    let mut options = ChangeFeedOptions::default().with_max_item_count(MaxItemCountHint::Limit(page_size));
    if let Some(token) = continuation {
        options = options.with_continuation_token(ContinuationToken::from_string(token));
    }
    let mut pages = shared
        .store
        .monitored()
        .query_change_feed::<serde_json::Value>(
            FeedScope::range(range.clone()),
            ChangeFeedStartFrom::Beginning,
            Some(options),
        )
        .await
        .map_err(|error| contrail_cosmos::CosmosStoreError::service("query change feed", &error))?;
    // The stream never ends: an empty page means this (sub-)range has nothing new. A range split
    // into children answers one empty page per child, so two in a row end the poll; a child not
    // reached this poll is read from the same continuation on the next.
    let mut empty_pages = 0;
    while empty_pages < 2 && !stop.load(Ordering::Relaxed) {
        let Some(page) = pages.next().await else { break };
        let page = page
            .map_err(|error| contrail_cosmos::CosmosStoreError::service("read change feed page", &error))?;
        shared.metrics.pages.inc();
        let items = page.into_items();
        if items.is_empty() {
            empty_pages += 1;
            let document = lease.lock().await.clone();
            update_board(shared, &document, 0.0);
            continue;
        }
        empty_pages = 0;
        let read_at = Instant::now();
        let mut changes: Vec<ServingChange> = Vec::with_capacity(items.len());
        for item in &items {
            let Some(document) = item.current() else {
                tracing::warn!(
                    range = range_text,
                    "change feed item without a current document skipped"
                );
                continue;
            };
            match serving_change(document, range_text, max_message_bytes) {
                Ok(change) => changes.push(change),
                Err(reason) => tracing::warn!(%reason, "change feed item skipped"),
            }
        }
        label_physical_ranges(shared, &mut changes, &mut published_lsn).await?;
        // Handed to the producer one after the other, in the page's order (a full queue is
        // waited out before the next change), then every acknowledgement is awaited.
        let mut deliveries = Vec::with_capacity(changes.len());
        for change in &changes {
            let payload = change.encode_to_vec();
            deliveries.push(
                enqueue(
                    &shared.producer,
                    &shared.config.topics.changes,
                    &change.flight_key,
                    &payload,
                )
                .await?,
            );
        }
        for delivery in deliveries {
            match delivery.await {
                Ok(Ok(_)) => {}
                Ok(Err((error, _))) => {
                    return Err(ChangefeedError::Broker(format!("publish change: {error}")));
                }
                Err(_) => {
                    return Err(ChangefeedError::Broker(
                        "publish change: producer gone".to_owned(),
                    ));
                }
            }
        }
        shared
            .metrics
            .publish_seconds
            .observe(read_at.elapsed().as_secs_f64());
        let missing = changes.iter().filter(|change| change.lsn == 0).count();
        shared.metrics.missing_lsn.inc_by(missing as u64);
        shared.metrics.published.inc_by(changes.len() as u64);
        let token = pages
            .to_continuation_token()
            .map_err(|error| contrail_cosmos::CosmosStoreError::service("continuation token", &error))?;
        let mut document = lease.lock().await;
        let mut next = document.clone();
        next.continuation = Some(token.as_str().to_owned());
        if let Some(last) = changes.iter().max_by_key(|change| (change.ts, change.lsn)) {
            next.last_lsn = next.last_lsn.max(last.lsn);
            next.last_ts = next.last_ts.max(last.ts);
        }
        next.published = next.published.saturating_add(changes.len() as u64);
        next.renewed_at_ms = now_ms();
        *document = shared.store.replace(&next).await?;
        let lag = (now_ms() / 1000 - document.last_ts).max(0) as f64;
        update_board(shared, &document, lag);
    }
    Ok(())
}

/// Sets each change's `feed_range` to the physical range that holds its document. `_lsn` grows
/// within a physical partition, and delta-archiver keeps, per (topic partition, `feed_range`), the
/// highest `_lsn` it archived, dropping anything at or below it (DESIGN §4). A lease's range keeps
/// covering the children of a split, whose `_lsn` sequences interleave: labelled with the lease's
/// range, a child's changes could fall below its sibling's and be taken for copies. A change whose
/// `_lsn` is not above what this poll already published for its range means the routing map is
/// stale (a split since it was read): it is read again and the change labelled anew.
async fn label_physical_ranges(
    shared: &Shared,
    changes: &mut [ServingChange],
    published_lsn: &mut HashMap<String, i64>,
) -> Result<(), ChangefeedError> {
    for change in changes.iter_mut() {
        let mut range = shared.store.physical_range(&change.flight_key, false).await?;
        if published_lsn.get(&range).is_some_and(|&last| change.lsn <= last) {
            range = shared.store.physical_range(&change.flight_key, true).await?;
            if published_lsn.get(&range).is_some_and(|&last| change.lsn <= last) {
                tracing::error!(id = %change.id, lsn = change.lsn, %range, "a change's _lsn is not above its partition's last published one: history may take it for a copy");
            }
        }
        let last = published_lsn.entry(range.clone()).or_insert(i64::MIN);
        *last = (*last).max(change.lsn);
        change.feed_range = range;
    }
    Ok(())
}

/// Hands one record to the producer, waiting while its queue is full (so records are enqueued in
/// the caller's order).
async fn enqueue(
    producer: &FutureProducer,
    topic: &str,
    key: &str,
    payload: &[u8],
) -> Result<rdkafka::producer::DeliveryFuture, ChangefeedError> {
    loop {
        let record = FutureRecord::to(topic).key(key).payload(payload);
        match producer.send_result(record) {
            Ok(delivery) => return Ok(delivery),
            Err((
                rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                _,
            )) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err((error, _)) => return Err(ChangefeedError::Broker(format!("publish change: {error}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_carry_identity_and_document() {
        let document = serde_json::json!({
            "id": "AA-100-2013-01-01-JFK", "flightKey": "AA-100-2013-01-01-JFK", "version": 3,
            "_lsn": 17, "_ts": 1700000000, "_etag": "\"x\""
        });
        let change = serving_change(&document, "range", 1_000_000).expect("change");
        assert_eq!(change.id, "AA-100-2013-01-01-JFK");
        assert_eq!(change.lsn, 17);
        assert_eq!(change.ts, 1_700_000_000);
        assert!(!change.document_omitted);
        let round: serde_json::Value = serde_json::from_str(&change.document_json).expect("json");
        assert_eq!(round["version"], 3);
        assert!(serving_change(&serde_json::json!({"x": 1}), "r", 1_000_000).is_err());
    }

    /// A document larger than a message (Cosmos DB allows 2 MB) still reaches the topic as a
    /// change, without its JSON and with its size.
    #[test]
    fn a_document_too_large_for_a_message_is_published_without_its_json() {
        let document = serde_json::json!({
            "id": "AA-100-2013-01-01-JFK", "flightKey": "AA-100-2013-01-01-JFK", "version": 3,
            "_lsn": 17, "_ts": 1700000000, "notes": "x".repeat(1_500_000)
        });
        let change = serving_change(&document, "range", 1_000_000).expect("change");
        assert!(change.document_omitted);
        assert!(change.document_json.is_empty());
        assert!(change.document_size > 1_500_000);
        assert_eq!((change.id.as_str(), change.lsn), ("AA-100-2013-01-01-JFK", 17));
        assert!(change.encoded_len() < 1_000_000);
    }
}
