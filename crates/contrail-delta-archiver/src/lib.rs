//! The `delta-archiver` stage: the pipeline's topics into Delta Lake history (docs/CONTRACT.md,
//! "Guarantees across restarts" and "Stores").
//!
//! | topic | table | one row per |
//! | --- | --- | --- |
//! | `ops.events.accepted` | `events` | accepted `(flight_key, event_id)` |
//! | `ops.flights.curated` | `flight_states` | `(flight_key, version)` |
//! | `ops.events.late` | `late_events` | late raw record |
//! | `ops.flights.changes` | `serving_changes` | `(id, _lsn)` |
//! | `ops.alerts` | `alerts` | alert raised or resolved, `(alert_id, state)` |
//!
//! Exactly-once, as kafka-delta-ingest does it: progress lives in the tables, not in the consumer
//! group. Every commit carries a `txn` action per `(table, topic, partition)` whose version is the
//! last offset it covers. A partition this instance starts reading resumes after the stored
//! version: the archiver is an effect on the consuming-stage frame
//! ([`contrail_common::consume::Frame`]), which judges that position against the topic, seeks
//! there and places each record. Before a commit the
//! stored versions are read again and must equal what this instance resumed from or last committed
//! ([`progress::fence_holds`]) — a zombie that lost its partitions in a rebalance finds the new
//! owner's versions and drops its rows — and Delta's conflict check refuses a commit racing another
//! one with the same app ids. A crash between writing Parquet files and committing them leaves
//! unreferenced files only (vacuum removes them) and the records are archived again after restart.
//!
//! Redelivered copies (upstream stages use no Kafka transactions; a dedup-state shard restored
//! from an old checkpoint regenerates hours of output) are dropped exactly, by origin
//! ([`applied`]): per (topic partition, input partition or feed range) the highest position
//! applied is stored in the same commit as a `txn` action, and anything at or below it is a copy.
//!
//! Batches span all tables and commit on rows, bytes or latency ([`progress::flush_due`]): one
//! commit per table per batch. Checkpoints are written by the commit that reaches
//! `delta.checkpointInterval`; compaction and vacuum run on a schedule between batches
//! ([`maintenance`]) — compaction is our own (read small files, write one, commit `remove` +
//! `add` with `dataChange = false`), so the stage needs no DataFusion.

pub mod applied;
mod archiver;
pub mod cli;
pub mod config;
pub mod error;
pub mod maintenance;
pub mod metrics;
pub mod progress;
pub mod row;
mod status;
pub mod table;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use contrail_common::consume::{Rebalances, RecordingConsumer, RecordingContext};
use contrail_common::metrics::MetricsRegistry;
use contrail_common::shutdown::Shutdown;
use contrail_common::stage::StageContext;
use contrail_common::topology;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureProducer;

pub use config::DeltaArchiverConfig;
pub use error::DeltaArchiverError;

use crate::archiver::{Archiver, Consuming, open_tables};
use crate::metrics::ArchiverMetrics;
use crate::status::{ArchiverStatus, Positions, update_lag};
use crate::table::Tables;

/// Runs the stage until `shutdown`.
pub async fn run(config: DeltaArchiverConfig, shutdown: Shutdown) -> Result<(), DeltaArchiverError> {
    let stage = StageContext::start(topology::DELTA_ARCHIVER, config.validate(), shutdown)?;
    let metrics = ArchiverMetrics::new(&stage.registry);
    let tokens = stage.tokens(&config.auth, "auth", "the admin API", &config.listen)?;
    let tables_and_topics = config.topics.tables();
    let topic_names: Vec<&str> = tables_and_topics
        .iter()
        .map(|(_, topic)| topic.as_str())
        .collect();
    let mut created = topic_names.clone();
    created.push(config.topics.dlq.as_str());
    stage
        .create_topics(
            &config.kafka,
            config.topics.create,
            &created,
            config.topics.partitions,
        )
        .await?;
    let Some(tables) = open_tables(&config, &stage.shutdown).await? else {
        return Ok(());
    };
    tracing::info!(root = %tables.root(), tables = tables_and_topics.len(), "Delta tables open");

    let rebalances = Rebalances::default();
    let consumer: Arc<RecordingConsumer> = Arc::new(
        config
            .kafka
            .consumer_config("delta-archiver", &config.group, &config.instance)?
            .create_with_context(RecordingContext::pausing(rebalances.clone()))
            .map_err(|error| DeltaArchiverError::Broker(format!("consumer: {error}")))?,
    );
    consumer
        .subscribe(&topic_names)
        .map_err(|error| DeltaArchiverError::Broker(format!("subscribe {topic_names:?}: {error}")))?;
    let watermarks: Arc<BaseConsumer> = Arc::new(config.kafka.watermark_client("delta-archiver")?);
    let dlq = producer(&config)?;
    let positions: Positions = Arc::default();

    let status = ArchiverStatus {
        instance: config.instance.clone(),
        watermarks: watermarks.clone(),
        positions: positions.clone(),
        metrics: metrics.clone(),
        uptime: stage.controls.clone(),
    };
    let servers = stage
        .serve_stream_admin(
            &config.listen,
            &tokens,
            "delta-archiver keeps no checkpoints or key state: its progress is the txn versions \
             stored in the Delta tables themselves",
            status,
        )
        .await?;
    stage.shutdown.spawn(update_lag(
        watermarks.clone(),
        positions.clone(),
        metrics.clone(),
        stage.shutdown.clone(),
    ));
    stage.health.set_ready(true);
    tracing::info!(instance = %config.instance, root = %config.delta_root, "delta-archiver running");

    let mut archiver = Archiver {
        config: &config,
        topics: tables_and_topics
            .iter()
            .map(|(table, topic)| (topic.clone(), *table))
            .collect(),
        dlq: &dlq,
        tables,
        metrics: &metrics,
        positions: &positions,
        partitions: HashMap::new(),
        batch_records: 0,
        batch_bytes: 0,
        batch_started: None,
        last_maintenance: Instant::now(),
        health: &stage.health,
        outage: false,
        restarts: Vec::new(),
    };
    let consuming = Consuming {
        consumer: &consumer,
        rebalances: &rebalances,
        gaps: stage.controls.gaps(),
        probe: config.kafka.client_config("delta-archiver-probe")?,
    };
    let result = archiver
        .run(consuming, &stage.controls.pause_flag(), &stage.shutdown)
        .await;
    stage.health.set_ready(false);
    stage.shutdown.trigger();
    consumer.unsubscribe();
    servers.join().await;
    result
}

/// Runs maintenance (compaction, vacuum) once on every configured table and exits: the
/// `delta-archiver maintain` command. `vacuum_retention_s` overrides the configured retention
/// (only safe while no archiver is writing).
pub async fn maintain_once(
    config: DeltaArchiverConfig,
    vacuum_retention_s: Option<u64>,
) -> Result<(), DeltaArchiverError> {
    let registry = MetricsRegistry::new();
    let metrics = ArchiverMetrics::new(&registry);
    let mut tables = Tables::open(&config).await?;
    let mut settings = config.maintenance.clone();
    if let Some(retention) = vacuum_retention_s {
        settings.vacuum_retention_s = retention;
    }
    for (table, _) in config.topics.tables() {
        let report = maintenance::run(&mut tables, table, &settings, &config.delta, &metrics).await?;
        println!(
            "{}: compacted {} files into {}, vacuumed {} files",
            table.name(),
            report.compacted_files,
            report.written_files,
            report.vacuumed_files
        );
    }
    Ok(())
}

fn producer(config: &DeltaArchiverConfig) -> Result<FutureProducer, DeltaArchiverError> {
    config
        .kafka
        .producer_config("delta-archiver")?
        .create()
        .map_err(|error| DeltaArchiverError::Broker(format!("producer: {error}")))
}
