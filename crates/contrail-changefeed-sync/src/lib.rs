//! The `changefeed-sync` stage (docs/CONTRACT.md, "Change feed"): the Cosmos DB change feed of
//! `flights` onto `ops.flights.changes`, with a change feed processor of our own (the Rust SDK has
//! none).
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
//! - **A replaced container** (deleted and created again under its name): the service refuses the
//!   old leases' ranges and continuations for good. The instance that meets it creates the leases
//!   of the new container (next incarnation, read from its beginning, changes labelled
//!   `<range>#<incarnation>`) and deletes the stale lease; see [`lease::LeaseStore::supersede`].

pub mod balance;
mod change;
pub mod cli;
pub mod config;
pub mod error;
mod feed;
pub mod lease;
pub mod metrics;
mod processor;
mod shared;
mod status;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use contrail_common::shutdown::Shutdown;
use contrail_common::stage::StageContext;
use contrail_common::topology;
use rdkafka::producer::FutureProducer;

pub use change::serving_change;
pub use config::ChangefeedSyncConfig;
pub use error::ChangefeedError;

use crate::lease::LeaseStore;
use crate::metrics::ChangefeedMetrics;
use crate::processor::{Running, maintain, release_all};
use crate::shared::Shared;
use crate::status::{LeaseBoard, SyncStatus};

/// The change topic's producer: idempotent and without a delivery timeout, so a page's changes
/// reach each topic partition in `_lsn` order (a timed-out change re-published behind newer ones
/// would be taken for a copy downstream; docs/CONTRACT.md, "Change feed").
fn producer(config: &ChangefeedSyncConfig) -> Result<FutureProducer, ChangefeedError> {
    let mut client = config.kafka.producer_config("changefeed-sync")?;
    client.set("message.timeout.ms", "0");
    client
        .create()
        .map_err(|error| ChangefeedError::Broker(format!("producer: {error}")))
}

/// Runs the stage until `shutdown`.
pub async fn run(config: ChangefeedSyncConfig, shutdown: Shutdown) -> Result<(), ChangefeedError> {
    let stage = StageContext::start(topology::CHANGEFEED_SYNC, config.validate(), shutdown)?;
    let metrics = ChangefeedMetrics::new(&stage.registry);
    let tokens = stage.tokens(&config.auth, "auth", "the admin API", &config.listen)?;
    stage
        .create_topics(
            &config.kafka,
            config.topics.create,
            &[config.topics.changes.as_str()],
            config.topics.partitions,
        )
        .await?;
    let Some(containers) = stage.unless_shutdown(config.cosmos.open("changefeed-sync")).await else {
        return Ok(());
    };
    let containers = containers?;
    let store = LeaseStore::new(
        containers.leases.clone(),
        containers.flights.clone(),
        containers.client.clone(),
        &config.cosmos.database,
        &config.cosmos.flights_container,
    );
    let bootstrap = contrail_cosmos::retry_setup("lease bootstrap", || store.ensure_leases());
    let Some(created) = stage.unless_shutdown(bootstrap).await else {
        return Ok(());
    };
    let created = created?;
    if created > 0 {
        tracing::info!(
            leases = created,
            "leases created for the feed ranges that had none"
        );
    }
    let board: LeaseBoard = Arc::default();
    let shared = Arc::new(Shared {
        producer: producer(&config)?,
        config: config.clone(),
        store,
        metrics: metrics.clone(),
        board: board.clone(),
        paused: stage.controls.pause_flag(),
        tasks: stage.shutdown.clone(),
        outage: contrail_cosmos::CredentialOutage::with_health("change feed reads", stage.health.clone()),
    });

    let status = SyncStatus {
        instance: config.instance.clone(),
        board,
        metrics: metrics.clone(),
        uptime: stage.controls.clone(),
    };
    let servers = stage
        .serve_stream_admin(
            &config.listen,
            &tokens,
            "changefeed-sync keeps its progress in the leases container (one continuation token per \
             feed range); see Status for the leases",
            status,
        )
        .await?;
    stage.health.set_ready(true);
    tracing::info!(instance = %config.instance, "changefeed-sync running");

    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    let interval = Duration::from_millis(config.leases.renew_interval_ms);
    let coverage_interval = Duration::from_millis(config.leases.coverage_check_interval_ms);
    let mut coverage_checked = std::time::Instant::now();
    while !stage.shutdown.is_triggered() {
        if coverage_checked.elapsed() >= coverage_interval {
            coverage_checked = std::time::Instant::now();
            match shared.store.ensure_leases().await {
                Ok(0) => {}
                Ok(created) => {
                    tracing::warn!(
                        leases = created,
                        "feed ranges without a lease found and given one"
                    );
                }
                Err(error) => {
                    tracing::warn!(%error, "checking every feed range has a lease failed; retrying later")
                }
            }
        }
        if let Err(error) = maintain(&shared, &mut running).await {
            tracing::warn!(%error, "lease maintenance failed; retrying next round");
        }
        metrics.owned.set(running.len() as i64);
        let _ = stage.unless_shutdown(tokio::time::sleep(interval)).await;
    }
    stage.health.set_ready(false);
    tracing::info!(
        leases = running.len(),
        "shutdown: finishing pages in flight and releasing leases"
    );
    release_all(&shared, running).await;
    servers.join().await;
    Ok(())
}
