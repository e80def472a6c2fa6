//! The consume → write → commit loop: curated states are decoded as they arrive (bad records to
//! the dead-letter topic) and offered to the write window ([`crate::window`]): up to
//! `batch.concurrency` guarded writes in flight, one per flight, newer versions coalescing behind
//! it; every `batch.commit_interval_ms` each partition is committed up to its first record whose
//! write is not yet acknowledged.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use contrail_common::consume::{DeadLetters, GapWatch, RebalanceEvent, Rebalances, RecordingConsumer};
use contrail_common::shutdown::Shutdown;
use contrail_common::trace::TraceParent;
use contrail_flight::document::{PREDICTION_GUARD, flight_document, prediction_fields};
use contrail_proto::v1::{FlightPrediction, FlightState};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use prost::Message as _;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};
use tracing::Instrument;

use crate::config::{CosmosWriterConfig, Input};
use crate::error::CosmosWriterError;
use crate::metrics::WriterMetrics;
use crate::window::{Offer, Window, Write};
use crate::writer::{Change, DocumentWriter, Outcome, WriteError};

pub(crate) struct Loop<'a> {
    pub(crate) config: &'a CosmosWriterConfig,
    pub(crate) consumer: &'a RecordingConsumer,
    /// The rebalances the consumer's context recorded (it pauses what it is assigned).
    pub(crate) rebalances: &'a Rebalances,
    /// Judges the partitions assigned and holds the ones at a gap (no silent gap).
    pub(crate) watch: &'a GapWatch,
    pub(crate) writer: &'a DocumentWriter,
    pub(crate) dlq: &'a FutureProducer,
    pub(crate) committed: &'a Mutex<BTreeMap<i32, i64>>,
    pub(crate) metrics: &'a WriterMetrics,
    pub(crate) paused: &'a AtomicBool,
    pub(crate) shutdown: &'a Shutdown,
}

/// What a write carries: the document (or the prediction's fields), and the record it came from
/// (for a dead letter).
type Carried = (Item, OwnedMessage);

/// What a record writes.
enum Item {
    /// A flight state's whole document.
    Document(serde_json::Value),
    /// A prediction's fields of the flight's document.
    Prediction(serde_json::Map<String, serde_json::Value>),
}

/// The loop stops consuming: the stage is stopping, or the dead-letter topic refused a record
/// (its partition must not be committed past it; the restarted stage meets it again).
struct Stop;

impl Loop<'_> {
    pub(crate) async fn run(&self) -> Result<(), CosmosWriterError> {
        self.write_until_stopped().await;
        Ok(())
    }

    async fn write_until_stopped(&self) {
        let interval = Duration::from_millis(self.config.batch.commit_interval_ms);
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut window: Window<Carried> = Window::default();
        let mut writes = FuturesUnordered::new();
        // Partitions assigned (and paused by the consumer's context) whose committed offset is
        // not judged yet.
        let mut unjudged: Vec<i32> = Vec::new();
        loop {
            self.watch_gaps(&mut window, &mut unjudged);
            while writes.len() < self.config.batch.concurrency {
                let Some(write) = window.next_write() else { break };
                writes.push(self.start(write));
            }
            let room = window.outstanding() < self.config.batch.window_records
                && !self.paused.load(Ordering::Relaxed);
            // Biased: acknowledgements first (they free room and move commit points), then
            // consumption — so under a backlog the window fills and versions coalesce while they
            // queue, and at low load a record's write starts as soon as it is consumed.
            tokio::select! {
                biased;
                () = self.shutdown.triggered() => break,
                Some((write, outcome)) = writes.next(), if !writes.is_empty() => {
                    match self.finish(&write, outcome).await {
                        Ok(()) => window.complete(&write.key),
                        Err(Stop) => break,
                    }
                }
                _ = tick.tick() => self.commit(&mut window),
                message = self.consumer.recv(), if room => match message {
                    Ok(message) => {
                        if let Err(Stop) = self.offer(&mut window, message.detach()).await {
                            break;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "consumer error");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                },
            }
        }
        // Stopping (DESIGN §6): consume no more, let the writes in flight finish (a write that
        // would have to be retried gives up once stopping), commit what they completed.
        while let Some((write, outcome)) = writes.next().await {
            if self.finish(&write, outcome).await.is_ok() {
                window.complete(&write.key);
            }
        }
        self.commit(&mut window);
        if window.outstanding() > 0 {
            tracing::info!(
                records = window.outstanding(),
                "stopping: records not yet in Cosmos DB are not committed and will be redelivered"
            );
        }
    }

    /// No silent gap (docs/CONTRACT.md): judges each partition assigned since the last turn at the
    /// group's committed offset — resumed if the topic still has that position (or none is
    /// stored), held at its gap otherwise — and goes on with the partitions whose gap an operator
    /// accepted: at the topic's first offset, committed at once so a restart does not meet the
    /// gap again. Runs every turn of the loop (the commit tick makes one at least every
    /// `batch.commit_interval_ms`, also while every partition is paused).
    fn watch_gaps(&self, window: &mut Window<Carried>, unjudged: &mut Vec<i32>) {
        let topic = self.config.input_topic();
        for event in self.rebalances.take() {
            match event {
                RebalanceEvent::Assigned(partitions) => {
                    unjudged.extend(partitions.into_iter().filter(|(t, _)| t == topic).map(|(_, p)| p));
                }
                RebalanceEvent::Revoked(partitions) => {
                    for (_, partition) in partitions.into_iter().filter(|(t, _)| t == topic) {
                        unjudged.retain(|p| *p != partition);
                        self.watch.release(partition);
                    }
                }
            }
        }
        if !unjudged.is_empty() {
            let mut list = TopicPartitionList::new();
            for partition in unjudged.iter() {
                list.add_partition(topic, *partition);
            }
            // Off the async workers: it waits for the group coordinator (and the judging for the
            // broker).
            let judged = tokio::task::block_in_place(|| {
                let committed = self.consumer.committed_offsets(list, Duration::from_secs(10))?;
                let mut stored = Vec::new();
                for element in committed.elements() {
                    match element.offset() {
                        Offset::Offset(next) => stored.push((element.partition(), next)),
                        // No position stored: the group starts at the topic's first offset.
                        _ => self.watch.resume(self.consumer, element.partition()),
                    }
                }
                // Not judged: still paused, judged again at the next turn — nothing else here
                // would notice librdkafka resetting a position the topic lacks.
                Ok::<_, rdkafka::error::KafkaError>(
                    self.watch
                        .check_assigned(self.consumer, stored, false)
                        .into_iter()
                        .map(|(partition, _)| partition)
                        .collect::<Vec<i32>>(),
                )
            });
            match judged {
                Ok(again) => *unjudged = again,
                // Still paused: judged at the next turn, never read from a position not judged.
                Err(error) => {
                    tracing::warn!(%error, partitions = ?unjudged, "reading the committed offsets of the partitions assigned; trying again")
                }
            }
        }
        for accepted in tokio::task::block_in_place(|| self.watch.take_accepted(self.consumer, false)) {
            window.restart(accepted.partition, accepted.from);
            let mut list = TopicPartitionList::new();
            if let Err(error) =
                list.add_partition_offset(topic, accepted.partition, Offset::Offset(accepted.from))
            {
                tracing::warn!(%error, "offset list");
                continue;
            }
            match tokio::task::block_in_place(|| self.consumer.commit(&list, CommitMode::Sync)) {
                Ok(()) => {
                    if let Ok(mut committed) = self.committed.lock() {
                        committed.insert(accepted.partition, accepted.from);
                    }
                }
                // The records from `from` on are read all the same; the commit after their writes
                // records the new position.
                Err(error) => {
                    tracing::warn!(%error, partition = accepted.partition, "committing the accepted gap's end")
                }
            }
        }
    }

    /// Decodes a consumed record into the window (or the dead-letter topic).
    async fn offer(&self, window: &mut Window<Carried>, message: OwnedMessage) -> Result<(), Stop> {
        self.metrics.records.inc();
        let position = (message.partition(), message.offset());
        match self.decode(&message) {
            Ok((key, version, document)) => {
                if window.offer(position, &key, version, (document, message)) == Offer::Coalesced {
                    self.metrics.coalesced.inc();
                }
                Ok(())
            }
            Err(reason) => {
                self.dead_letter(&message, reason).await?;
                window.done(position);
                Ok(())
            }
        }
    }

    /// The guarded write of one flight's document.
    async fn start(&self, write: Write<Carried>) -> (Write<Carried>, Result<Outcome, WriteError>) {
        let shutdown = self.shutdown.clone();
        let stopping = move || shutdown.is_triggered();
        let span = write_span(&write);
        let change = match &write.item.0 {
            Item::Document(document) => Change::State {
                version: write.version,
                document,
            },
            Item::Prediction(fields) => Change::Fields {
                version: write.version,
                guard: PREDICTION_GUARD,
                fields,
            },
        };
        let outcome = self
            .writer
            .apply(&write.key, change, &stopping)
            .instrument(span.clone())
            .await;
        span.record(
            "cosmos.outcome",
            match &outcome {
                Ok(Outcome::Written) => "written",
                Ok(Outcome::Stale) => "stale",
                Err(WriteError::Fatal(_)) => "refused",
                Err(WriteError::Stopping) => "stopping",
            },
        );
        (write, outcome)
    }

    /// Accounts for a finished write; `Ok` when its records are done (written, stale, or
    /// refused and dead-lettered).
    async fn finish(&self, write: &Write<Carried>, outcome: Result<Outcome, WriteError>) -> Result<(), Stop> {
        match outcome {
            Ok(Outcome::Written) => self.metrics.written.inc(),
            Ok(Outcome::Stale) => self.metrics.stale.inc(),
            Err(WriteError::Fatal(error)) => {
                self.dead_letter(&write.item.1, format!("Cosmos DB refused the document: {error}"))
                    .await?;
            }
            Err(WriteError::Stopping) => return Err(Stop),
        }
        Ok(())
    }

    /// The record as `(flight key, version, what to write)`, or why it is not one of the
    /// deployment's input.
    fn decode(&self, message: &OwnedMessage) -> Result<(String, u64, Item), String> {
        let key = message
            .key()
            .map(|key| String::from_utf8_lossy(key).into_owned())
            .unwrap_or_default();
        let payload = message.payload().unwrap_or_default();
        if self.config.input == Input::Predictions {
            return decode_prediction(&key, payload);
        }
        let state = FlightState::decode(payload)
            .map_err(|error| format!("not a contrail.v1.FlightState: {error}"))?;
        identity("FlightState", &state.flight_key, &key, state.version)?;
        let document = flight_document(&state);
        Ok((state.flight_key, state.version, Item::Document(document)))
    }

    async fn dead_letter(&self, message: &OwnedMessage, reason: String) -> Result<(), Stop> {
        self.metrics.dead_letters.inc();
        tracing::warn!(partition = message.partition(), offset = message.offset(), %reason, "record to the dead-letter topic");
        let content_type = match self.config.input {
            Input::FlightStates => "application/x-protobuf; contrail.v1.FlightState",
            Input::Predictions => "application/x-protobuf; contrail.v1.FlightPrediction",
        };
        let letters = DeadLetters {
            producer: self.dlq,
            topic: &self.config.topics.dlq,
            stage: "cosmos-writer",
            max_message_bytes: self.config.kafka.max_message_bytes(),
        };
        match letters.send(message, reason, content_type.to_owned(), 0).await {
            Ok(()) => Ok(()),
            Err(error) => {
                // Without the dead letter acknowledged its partition must not be committed past it.
                tracing::error!(%error, "dead-letter topic refused the record");
                Err(Stop)
            }
        }
    }

    /// Commits every partition whose commit point moved and that this instance still owns.
    fn commit(&self, window: &mut Window<Carried>) {
        let mut points = window.commit_points();
        if points.is_empty() {
            return;
        }
        // A partition lost in a rebalance keeps its records in the window until their writes
        // finish (they are written all the same), but its offsets are the new owner's to commit: a
        // broker that checks the assignment on commit would refuse the whole list, and committing
        // would move the new owner's point back. Should the partition come back, its point is
        // still true (every record below it is in Cosmos DB) and is committed then.
        let owned = match self.consumer.assignment() {
            Ok(assignment) => owned_partitions(&assignment, self.config.input_topic()),
            Err(error) => {
                tracing::warn!(%error, "reading the assignment; committing at the next tick");
                return;
            }
        };
        points.retain(|(partition, _)| owned.contains(partition));
        if points.is_empty() {
            return;
        }
        let mut list = TopicPartitionList::new();
        for (partition, offset) in &points {
            if let Err(error) =
                list.add_partition_offset(self.config.input_topic(), *partition, Offset::Offset(*offset))
            {
                tracing::warn!(%error, "offset list");
            }
        }
        // Sync commit (off the async workers: it waits for the broker). Every record below a
        // point is in Cosmos DB; a failed commit (partition moved to another member) only means
        // those records are written again — harmlessly — by the new owner.
        match tokio::task::block_in_place(|| self.consumer.commit(&list, CommitMode::Sync)) {
            Ok(()) => {
                window.committed(&points);
                self.metrics.commits.inc();
                if let Ok(mut committed) = self.committed.lock() {
                    committed.extend(points);
                }
            }
            Err(error) => tracing::warn!(%error, "offset commit failed; the records will be redelivered"),
        }
    }
}

/// The span of a write whose record is traced and sampled (a child of the record's context; the
/// write carries the newest version of its flight — records it coalesced are not linked), else
/// none.
fn write_span(write: &Write<Carried>) -> tracing::Span {
    let record = &write.item.1;
    match TraceParent::of_record(record.headers()).filter(TraceParent::sampled) {
        Some(parent) => {
            let span = tracing::info_span!(
                parent: None,
                "cosmos-writer.write",
                flight.key = %write.key,
                flight.version = write.version,
                messaging.kafka.partition = record.partition(),
                messaging.kafka.offset = record.offset(),
                cosmos.outcome = tracing::field::Empty,
                cosmos.request_charge = tracing::field::Empty,
            );
            parent.adopt(&span);
            span
        }
        None => tracing::Span::none(),
    }
}

/// Why a decoded `kind` of flight `flight_key` at `version` under record key `key` cannot be
/// written, if it cannot: no flight key, another flight's key, or version 0 (the guard's "none").
fn identity(kind: &str, flight_key: &str, key: &str, version: u64) -> Result<(), String> {
    if flight_key.is_empty() {
        return Err(format!("{kind} without flight_key"));
    }
    if flight_key != key {
        return Err(format!(
            "record key {key:?} is not the {kind}'s flight key {flight_key:?}"
        ));
    }
    if version == 0 {
        return Err(format!("{kind} {flight_key} has version 0"));
    }
    Ok(())
}

/// A predictions record as `(flight key, version, fields)`, or why it is not a prediction.
fn decode_prediction(key: &str, payload: &[u8]) -> Result<(String, u64, Item), String> {
    let prediction = FlightPrediction::decode(payload)
        .map_err(|error| format!("not a contrail.v1.FlightPrediction: {error}"))?;
    identity(
        "FlightPrediction",
        &prediction.flight_key,
        key,
        prediction.version,
    )?;
    let fields = prediction_fields(&prediction);
    Ok((
        prediction.flight_key,
        prediction.version,
        Item::Prediction(fields),
    ))
}

/// The partitions of `topic` in `assignment`.
fn owned_partitions(assignment: &TopicPartitionList, topic: &str) -> std::collections::BTreeSet<i32> {
    assignment
        .elements_for_topic(topic)
        .iter()
        .map(|element| element.partition())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Any bytes under any key: a reason or a prediction of exactly that key, never a panic.
        #[test]
        fn prediction_records_decode_or_say_why(key in ".{0,12}", payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80)) {
            match decode_prediction(&key, &payload) {
                Ok((flight, version, Item::Prediction(fields))) => {
                    proptest::prop_assert_eq!(&flight, &key);
                    proptest::prop_assert!(version > 0);
                    proptest::prop_assert_eq!(&fields[PREDICTION_GUARD], &serde_json::json!(version));
                }
                Ok(_) => proptest::prop_assert!(false, "a prediction decodes to fields"),
                Err(reason) => proptest::prop_assert!(!reason.is_empty()),
            }
        }
    }

    #[test]
    fn a_prediction_of_another_flight_or_version_0_is_refused() {
        let prediction = FlightPrediction {
            flight_key: "B6-1-2013-06-10-JFK".to_owned(),
            version: 1 << 32 | 1,
            ..FlightPrediction::default()
        };
        let payload = prediction.encode_to_vec();
        assert!(decode_prediction("B6-1-2013-06-10-JFK", &payload).is_ok());
        let error = decode_prediction("B6-2-2013-06-10-JFK", &payload)
            .map(|_| ())
            .expect_err("key");
        assert!(error.contains("B6-2-2013-06-10-JFK"), "{error}");
        let zero = FlightPrediction {
            version: 0,
            ..prediction
        }
        .encode_to_vec();
        let error = decode_prediction("B6-1-2013-06-10-JFK", &zero)
            .map(|_| ())
            .expect_err("v0");
        assert!(error.contains("version 0"), "{error}");
    }

    #[test]
    fn only_the_partitions_of_the_curated_topic_in_the_assignment_are_owned() {
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition("ops.flights.curated", 0);
        assignment.add_partition("ops.flights.curated", 3);
        assignment.add_partition("other", 1);
        assert_eq!(
            owned_partitions(&assignment, "ops.flights.curated"),
            [0, 3].into_iter().collect()
        );
        assert!(owned_partitions(&TopicPartitionList::new(), "ops.flights.curated").is_empty());
    }
}
