//! The `cosmos-writer` stage (docs/CONTRACT.md, "Serving writes" and "Stores"):
//! `ops.flights.curated` → Cosmos DB `flights`; a deployment with `input = "predictions"` writes
//! the rotation processor's `ops.flights.predictions` into the same documents' prediction fields
//! (`predictedOut`, `knockOnFrom`, …, guarded by `predictionVersion`; see [`writer`] for how the
//! two compose).
//!
//! It runs on the consuming-stage frame ([`contrail_common::consume::Frame`]; assignment, gaps,
//! placement, commits, drain) with its effect in `consume`. A consumer-group member decodes curated `FlightState`s as they arrive (undecodable records and
//! records whose key is not their flight key go to the dead-letter topic with the reason) and
//! offers them to the write window ([`window::Window`]): at most `batch.concurrency` writes in
//! flight, one per flight, through the version guard ([`writer::DocumentWriter`]); a newer version
//! of a flight being written waits behind it and replaces any older waiting one. Every
//! `batch.commit_interval_ms` each partition is committed up to its first record whose effect is
//! not yet acknowledged by Cosmos DB — so a crash at any moment redelivers records whose effect is
//! already in Cosmos DB or not yet, and the guard makes both harmless: every flight ends at its
//! highest version.

pub mod cli;
pub mod config;
mod consume;
pub mod error;
pub mod metrics;
mod status;
pub mod window;

/// The version guard and the guarded write live in `contrail-cosmos`, shared with `contrail
/// backfill serving`.
pub use contrail_cosmos::{guard, writer};

use std::sync::Arc;

use contrail_common::consume::{Frame, GapWatch, Rebalances, RecordingConsumer, RecordingContext};
use contrail_common::shutdown::Shutdown;
use contrail_common::stage::StageContext;
use contrail_common::topology;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureProducer;

pub use config::CosmosWriterConfig;
pub use error::CosmosWriterError;

use crate::consume::{Writer, Writes};
use crate::metrics::WriterMetrics;
use crate::status::{Committed, WriterStatus};
use crate::writer::DocumentWriter;

fn producer(config: &CosmosWriterConfig) -> Result<FutureProducer, CosmosWriterError> {
    config
        .kafka
        .producer_config("cosmos-writer")?
        .create()
        .map_err(|error| CosmosWriterError::Broker(format!("producer: {error}")))
}

/// Runs the stage until `shutdown`.
pub async fn run(config: CosmosWriterConfig, shutdown: Shutdown) -> Result<(), CosmosWriterError> {
    let config = config.with_input_defaults();
    let stage = StageContext::start(topology::COSMOS_WRITER, config.validate(), shutdown)?;
    let metrics = WriterMetrics::new(&stage.registry);
    let tokens = stage.tokens(&config.auth, "auth", "the admin API", &config.listen)?;
    let topics = &config.topics;
    stage
        .create_topics(
            &config.kafka,
            topics.create,
            &[config.input_topic(), topics.dlq.as_str()],
            topics.partitions,
        )
        .await?;
    let Some(containers) = stage.unless_shutdown(config.cosmos.open("cosmos-writer")).await else {
        return Ok(());
    };
    let containers = containers?;
    let writer = Arc::new(
        DocumentWriter::new(
            containers.flights.clone(),
            config.batch.etag_cache_entries,
            metrics.writes.clone(),
        )
        .with_outage(contrail_cosmos::CredentialOutage::with_health(
            "writes",
            stage.health.clone(),
        )),
    );
    // Every partition assigned is paused until the loop has judged its committed offset against
    // the topic (no silent gap: a position the topic no longer has is held, not reset).
    let rebalances = Rebalances::default();
    let consumer: Arc<RecordingConsumer> = Arc::new(
        config
            .kafka
            .consumer_config("cosmos-writer", &config.group, &config.instance)?
            .create_with_context(RecordingContext::pausing(rebalances.clone()))
            .map_err(|error| CosmosWriterError::Broker(format!("consumer: {error}")))?,
    );
    let watch = GapWatch::new(
        stage.controls.gaps(),
        config.kafka.client_config("cosmos-writer-probe")?,
        config.input_topic(),
    );
    consumer
        .subscribe(&[config.input_topic()])
        .map_err(|error| CosmosWriterError::Broker(format!("subscribe {}: {error}", config.input_topic())))?;
    let watermarks: Arc<BaseConsumer> = Arc::new(config.kafka.watermark_client("cosmos-writer")?);
    let dlq = producer(&config)?;
    let committed: Committed = Arc::default();

    let status = WriterStatus {
        instance: config.instance.clone(),
        topic: config.input_topic().to_owned(),
        consumer: consumer.clone(),
        watermarks,
        committed: committed.clone(),
        metrics: metrics.clone(),
        uptime: stage.controls.clone(),
    };
    let servers = stage
        .serve_stream_admin(
            &config.listen,
            &tokens,
            "cosmos-writer keeps no checkpoints or key state: its progress is the consumer group's \
             committed offsets, its state the documents in Cosmos DB",
            status,
        )
        .await?;
    stage.health.set_ready(true);
    tracing::info!(instance = %config.instance, input = ?config.input, topic = config.input_topic(), group = %config.group.id, endpoint = %config.cosmos.endpoint, "cosmos-writer running");

    let paused = stage.controls.pause_flag();
    let shared = Writer {
        config: &config,
        writer: &writer,
        dlq: &dlq,
        committed: &committed,
        metrics: &metrics,
        shutdown: &stage.shutdown,
    };
    let result = Frame::new(&consumer, &rebalances, vec![watch], &paused, &stage.shutdown)
        .run(&mut Writes::new(&shared))
        .await;
    stage.health.set_ready(false);
    stage.shutdown.trigger();
    consumer.unsubscribe();
    servers.join().await;
    result
}
