//! The `cosmos-writer` stage (DESIGN §4, §5): `ops.flights.curated` → Cosmos DB `flights`.
//!
//! A consumer-group member reads batches of curated `FlightState`s (at most `batch.max_records`
//! or what arrives within `batch.max_wait_ms`). Each batch is decoded (undecodable records and
//! records whose key is not their flight key go to the dead-letter topic with the reason),
//! coalesced to the newest version per flight ([`guard::coalesce`]) and written with at most
//! `batch.concurrency` requests in flight through the version guard ([`writer::DocumentWriter`]).
//! Only when every write and dead letter of the batch is acknowledged are the batch's offsets
//! committed — so a crash at any moment redelivers records whose effect is already in Cosmos DB
//! or not yet, and the guard makes both harmless: every flight ends at its highest version.

pub mod config;
pub mod error;
pub mod guard;
pub mod metrics;
pub mod writer;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use contrail_common::admin::{StageStatus, StreamAdmin};
use contrail_common::metrics::MetricsRegistry;
use contrail_common::server::{self, Health};
use contrail_common::shutdown::Shutdown;
use contrail_dedup::document::flight_document;
use contrail_proto::admin::v1 as admin;
use contrail_proto::v1::{DeadLetter, FlightState, SourcePosition};
use futures::StreamExt;
use prost::Message as _;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

pub use config::CosmosWriterConfig;
pub use error::CosmosWriterError;

use crate::metrics::WriterMetrics;
use crate::writer::{DocumentWriter, Outcome, WriteError};

/// Offsets committed by this instance (next offset to read, per partition).
type Committed = Arc<Mutex<BTreeMap<i32, i64>>>;

struct WriterStatus {
    instance: String,
    topic: String,
    consumer: Arc<StreamConsumer>,
    watermarks: Arc<BaseConsumer>,
    committed: Committed,
    metrics: WriterMetrics,
    started: Instant,
}

#[tonic::async_trait]
impl StageStatus for WriterStatus {
    async fn status(&self) -> Result<admin::StatusResponse, tonic::Status> {
        let owned: Vec<i32> = self
            .consumer
            .assignment()
            .map(|list| {
                list.elements()
                    .iter()
                    .map(|element| element.partition())
                    .collect()
            })
            .unwrap_or_default();
        let committed = self
            .committed
            .lock()
            .map(|committed| committed.clone())
            .unwrap_or_default();
        let watermarks = self.watermarks.clone();
        let topic = self.topic.clone();
        let partitions = tokio::task::spawn_blocking(move || {
            owned
                .iter()
                .map(|partition| {
                    let high = watermarks
                        .fetch_watermarks(&topic, *partition, Duration::from_secs(2))
                        .map(|(_, high)| high)
                        .unwrap_or(-1);
                    let next = committed.get(partition).copied().unwrap_or(-1);
                    admin::PartitionStatus {
                        topic: topic.clone(),
                        partition: *partition,
                        committed_offset: next,
                        high_watermark: high,
                        lag: contrail_common::kafka::partition_lag(high, next),
                        state_bytes: 0,
                    }
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|error| tonic::Status::internal(error.to_string()))?;
        let m = &self.metrics;
        let counters = [
            ("records_total", m.records.get() as f64),
            ("documents_written_total", m.written.get() as f64),
            ("stale_skipped_total", m.stale.get() as f64),
            ("coalesced_total", m.coalesced.get() as f64),
            ("dead_letters_total", m.dead_letters.get() as f64),
            ("request_units_total", m.request_units.get()),
            ("batches_total", m.batches.get() as f64),
            ("retries_total", m.total_retries()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        let uptime = self.started.elapsed().as_secs_f64().max(1.0);
        Ok(admin::StatusResponse {
            instance: self.instance.clone(),
            uptime_seconds: uptime as i64,
            partitions,
            counters,
            events_per_second: m.records.get() as f64 / uptime,
            ..admin::StatusResponse::default()
        })
    }
}

fn producer(config: &CosmosWriterConfig) -> Result<FutureProducer, CosmosWriterError> {
    config
        .kafka
        .producer_config("cosmos-writer")?
        .create()
        .map_err(|error| CosmosWriterError::Broker(format!("producer: {error}")))
}

/// Runs the stage until `shutdown`.
pub async fn run(config: CosmosWriterConfig, shutdown: Shutdown) -> Result<(), CosmosWriterError> {
    config
        .validate()
        .map_err(|message| CosmosWriterError::Common(contrail_common::CommonError::Config(message)))?;
    let started = Instant::now();
    let registry = MetricsRegistry::new();
    let metrics = WriterMetrics::new(&registry);
    let health = Health::new();
    let tokens = config.auth.load()?;
    if !tokens.enabled() {
        tracing::warn!("no auth.tokens configured: the admin API accepts unauthenticated requests");
    }
    if config.topics.create {
        let names = [config.topics.curated.as_str(), config.topics.dlq.as_str()];
        contrail_common::kafka::create_topics(
            &config.kafka,
            "cosmos-writer",
            &names,
            config.topics.partitions,
        )
        .await?;
    }
    let containers = tokio::select! {
        containers = config.cosmos.open("cosmos-writer") => containers?,
        () = shutdown.triggered() => return Ok(()),
    };
    let writer = Arc::new(
        DocumentWriter::new(
            containers.flights.clone(),
            config.batch.etag_cache_entries,
            metrics.clone(),
        )
        .with_outage(contrail_cosmos::CredentialOutage::with_health(
            "writes",
            health.clone(),
        )),
    );
    let consumer: Arc<StreamConsumer> = Arc::new(
        config
            .kafka
            .consumer_config("cosmos-writer", &config.group, &config.instance)?
            .create()
            .map_err(|error| CosmosWriterError::Broker(format!("consumer: {error}")))?,
    );
    consumer
        .subscribe(&[config.topics.curated.as_str()])
        .map_err(|error| {
            CosmosWriterError::Broker(format!("subscribe {}: {error}", config.topics.curated))
        })?;
    let watermarks: Arc<BaseConsumer> = Arc::new(config.kafka.watermark_client("cosmos-writer")?);
    let dlq = producer(&config)?;
    let committed: Committed = Arc::default();
    let paused = Arc::new(AtomicBool::new(false));

    let listeners = server::Listeners::bind(&config.listen).await?;
    let admin = StreamAdmin::new(
        "cosmos-writer",
        "cosmos-writer keeps no checkpoints or key state: its progress is the consumer group's \
         committed offsets, its state the documents in Cosmos DB",
        WriterStatus {
            instance: config.instance.clone(),
            topic: config.topics.curated.clone(),
            consumer: consumer.clone(),
            watermarks,
            committed: committed.clone(),
            metrics: metrics.clone(),
            started,
        },
        paused.clone(),
        health.clone(),
        shutdown.clone(),
    );
    let servers = admin.serve(listeners, &tokens, registry);
    health.set_ready(true);
    tracing::info!(instance = %config.instance, endpoint = %config.cosmos.endpoint, "cosmos-writer running");

    let loop_context = Loop {
        config: &config,
        consumer: &consumer,
        writer: &writer,
        dlq: &dlq,
        committed: &committed,
        metrics: &metrics,
        paused: &paused,
        shutdown: &shutdown,
    };
    let result = loop_context.run().await;
    health.set_ready(false);
    shutdown.trigger();
    consumer.unsubscribe();
    servers.join().await;
    result
}

struct Loop<'a> {
    config: &'a CosmosWriterConfig,
    consumer: &'a StreamConsumer,
    writer: &'a DocumentWriter,
    dlq: &'a FutureProducer,
    committed: &'a Mutex<BTreeMap<i32, i64>>,
    metrics: &'a WriterMetrics,
    paused: &'a AtomicBool,
    shutdown: &'a Shutdown,
}

impl Loop<'_> {
    async fn run(&self) -> Result<(), CosmosWriterError> {
        let max_wait = Duration::from_millis(self.config.batch.max_wait_ms);
        loop {
            if self.shutdown.is_triggered() {
                return Ok(());
            }
            if self.paused.load(Ordering::Relaxed) {
                tokio::select! {
                    () = self.shutdown.triggered() => return Ok(()),
                    () = tokio::time::sleep(Duration::from_millis(200)) => continue,
                }
            }
            let first = tokio::select! {
                () = self.shutdown.triggered() => return Ok(()),
                message = self.consumer.recv() => message,
            };
            let first = match first {
                Ok(message) => message.detach(),
                Err(error) => {
                    tracing::warn!(%error, "consumer error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let mut batch = vec![first];
            let deadline = tokio::time::Instant::now() + max_wait;
            while batch.len() < self.config.batch.max_records {
                match tokio::time::timeout_at(deadline, self.consumer.recv()).await {
                    Ok(Ok(message)) => batch.push(message.detach()),
                    Ok(Err(error)) => {
                        tracing::warn!(%error, "consumer error");
                        break;
                    }
                    Err(_) => break,
                }
            }
            match self.process(&batch).await {
                Ok(()) => self.commit(&batch),
                Err(WriteError::Stopping) => {
                    tracing::info!(
                        records = batch.len(),
                        "stopping: the batch in flight is not committed and will be redelivered"
                    );
                    return Ok(());
                }
                Err(WriteError::Fatal(error)) => return Err(error.into()),
            }
        }
    }

    /// The record as `(flight key, version, serving document)`, or why it is not a flight state.
    fn decode(&self, message: &OwnedMessage) -> Result<(String, u64, serde_json::Value), String> {
        let key = message
            .key()
            .map(|key| String::from_utf8_lossy(key).into_owned())
            .unwrap_or_default();
        let payload = message.payload().unwrap_or_default();
        let state = FlightState::decode(payload)
            .map_err(|error| format!("not a contrail.v1.FlightState: {error}"))?;
        if state.flight_key.is_empty() {
            return Err("FlightState without flight_key".to_owned());
        }
        if state.flight_key != key {
            return Err(format!(
                "record key {key:?} is not the state's flight key {:?}",
                state.flight_key
            ));
        }
        if state.version == 0 {
            return Err(format!("FlightState {} has version 0", state.flight_key));
        }
        let document = flight_document(&state);
        Ok((state.flight_key, state.version, document))
    }

    async fn dead_letter(&self, message: &OwnedMessage, reason: String) -> Result<(), WriteError> {
        self.metrics.dead_letters.inc();
        tracing::warn!(partition = message.partition(), offset = message.offset(), %reason, "record to the dead-letter topic");
        let mut letter = DeadLetter {
            stage: "cosmos-writer".to_owned(),
            reason,
            errors: Vec::new(),
            payload: message.payload().unwrap_or_default().to_vec(),
            content_type: "application/x-protobuf; contrail.v1.FlightState".to_owned(),
            record_index: 0,
            origin: message.topic().to_owned(),
            rejected_at_us: 0,
            input: Some(SourcePosition {
                topic: message.topic().to_owned(),
                partition: message.partition(),
                offset: message.offset(),
            }),
            ..DeadLetter::default()
        };
        let key = message.key().unwrap_or_default().to_vec();
        contrail_common::dead_letter::fit(&mut letter, key.len(), self.config.kafka.max_message_bytes());
        let payload = letter.encode_to_vec();
        let record = FutureRecord::to(&self.config.topics.dlq)
            .key(&key)
            .payload(&payload);
        match self.dlq.send(record, Duration::from_secs(300)).await {
            Ok(_) => Ok(()),
            Err((error, _)) => {
                // Without the dead letter acknowledged the batch must not be committed.
                tracing::error!(%error, "dead-letter topic refused the record");
                Err(WriteError::Stopping)
            }
        }
    }

    async fn process(&self, batch: &[OwnedMessage]) -> Result<(), WriteError> {
        self.metrics.records.inc_by(batch.len() as u64);
        let mut items = Vec::with_capacity(batch.len());
        for message in batch {
            match self.decode(message) {
                Ok((key, version, document)) => items.push((key, version, (document, message))),
                Err(reason) => self.dead_letter(message, reason).await?,
            }
        }
        let (survivors, dropped) = guard::coalesce(items);
        self.metrics.coalesced.inc_by(dropped as u64);
        let shutdown = self.shutdown.clone();
        let stopping = move || shutdown.is_triggered();
        let stopping = &stopping;
        let results: Vec<(Result<Outcome, WriteError>, &OwnedMessage)> =
            futures::stream::iter(survivors.into_iter().map(
                |(key, version, (document, message))| async move {
                    let outcome = self.writer.write(&key, version, &document, stopping).await;
                    (outcome, message)
                },
            ))
            .buffer_unordered(self.config.batch.concurrency)
            .collect()
            .await;
        for (result, message) in results {
            match result {
                Ok(Outcome::Written) => self.metrics.written.inc(),
                Ok(Outcome::Stale) => self.metrics.stale.inc(),
                Err(WriteError::Fatal(error)) => {
                    self.dead_letter(message, format!("Cosmos DB refused the document: {error}"))
                        .await?;
                }
                Err(WriteError::Stopping) => return Err(WriteError::Stopping),
            }
        }
        Ok(())
    }

    fn commit(&self, batch: &[OwnedMessage]) {
        let mut next: BTreeMap<(String, i32), i64> = BTreeMap::new();
        for message in batch {
            let entry = next
                .entry((message.topic().to_owned(), message.partition()))
                .or_insert(0);
            *entry = (*entry).max(message.offset() + 1);
        }
        let mut list = TopicPartitionList::new();
        for ((topic, partition), offset) in &next {
            if let Err(error) = list.add_partition_offset(topic, *partition, Offset::Offset(*offset)) {
                tracing::warn!(%error, "offset list");
            }
        }
        // Sync commit (off the async workers: it waits for the broker): the batch's writes are
        // done; a failed commit (partition moved to another member) only means those records are
        // written again — harmlessly — by the new owner.
        match tokio::task::block_in_place(|| self.consumer.commit(&list, CommitMode::Sync)) {
            Ok(()) => {
                self.metrics.batches.inc();
                if let Ok(mut committed) = self.committed.lock() {
                    for ((_, partition), offset) in next {
                        committed.insert(partition, offset);
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "offset commit failed; the records will be redelivered"),
        }
    }
}
