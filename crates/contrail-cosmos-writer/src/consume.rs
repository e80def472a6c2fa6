//! The consume → write → commit loop: a batch of curated states is decoded (bad records to the
//! dead-letter topic), coalesced to the newest version per flight, written through the version
//! guard, and only then are its offsets committed.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use contrail_common::dead_letter::Unprocessable;
use contrail_common::shutdown::Shutdown;
use contrail_flight::document::flight_document;
use contrail_proto::v1::{FlightState, SourcePosition};
use futures::StreamExt;
use prost::Message as _;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::CosmosWriterConfig;
use crate::error::CosmosWriterError;
use crate::guard;
use crate::metrics::WriterMetrics;
use crate::writer::{DocumentWriter, Outcome, WriteError};

pub(crate) struct Loop<'a> {
    pub(crate) config: &'a CosmosWriterConfig,
    pub(crate) consumer: &'a StreamConsumer,
    pub(crate) writer: &'a DocumentWriter,
    pub(crate) dlq: &'a FutureProducer,
    pub(crate) committed: &'a Mutex<BTreeMap<i32, i64>>,
    pub(crate) metrics: &'a WriterMetrics,
    pub(crate) paused: &'a AtomicBool,
    pub(crate) shutdown: &'a Shutdown,
}

impl Loop<'_> {
    pub(crate) async fn run(&self) -> Result<(), CosmosWriterError> {
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
        let key = message.key().unwrap_or_default();
        let payload = Unprocessable {
            position: SourcePosition {
                topic: message.topic().to_owned(),
                partition: message.partition(),
                offset: message.offset(),
            },
            key,
            payload: message.payload().unwrap_or_default(),
            content_type: "application/x-protobuf; contrail.v1.FlightState".to_owned(),
        }
        .dead_letter("cosmos-writer", reason, 0, self.config.kafka.max_message_bytes());
        let record = FutureRecord::to(&self.config.topics.dlq)
            .key(key)
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
