//! cosmos-writer's effect on the consuming-stage frame ([`contrail_common::consume::Frame`]):
//! curated states are decoded as they arrive (bad records to the dead-letter topic) and offered
//! to the write window ([`crate::window`]): up to `batch.concurrency` guarded writes in flight,
//! one per flight, newer versions coalescing behind it; every `batch.commit_interval_ms` each
//! partition is committed up to its first record whose write is not yet acknowledged. Its
//! positions are the consumer group's committed offsets.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use contrail_common::consume::frame::{Effect, Points, Start, group_positions};
use contrail_common::consume::{DeadLetters, RecordingConsumer, TopicPartition};
use contrail_common::shutdown::Shutdown;
use contrail_common::trace::TraceParent;
use contrail_flight::document::{PREDICTION_GUARD, flight_document, prediction_fields};
use contrail_proto::v1::{FlightPrediction, FlightState};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use prost::Message as _;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::FutureProducer;
use tracing::Instrument;

use crate::config::{CosmosWriterConfig, Input};
use crate::error::CosmosWriterError;
use crate::metrics::WriterMetrics;
use crate::window::{Offer, Window, Write};
use crate::writer::{Change, DocumentWriter, Outcome, WriteError};

/// What the writes share.
pub(crate) struct Writer<'a> {
    pub(crate) config: &'a CosmosWriterConfig,
    pub(crate) writer: &'a DocumentWriter,
    pub(crate) dlq: &'a FutureProducer,
    pub(crate) committed: &'a Mutex<BTreeMap<i32, i64>>,
    pub(crate) metrics: &'a WriterMetrics,
    pub(crate) shutdown: &'a Shutdown,
}

/// What a write carries: the document (or the prediction's fields), and the record it came from
/// (for a dead letter).
type Carried = (Item, OwnedMessage);

/// What a record writes.
pub(crate) enum Item {
    /// A flight state's whole document.
    Document(serde_json::Value),
    /// A prediction's fields of the flight's document.
    Prediction(serde_json::Map<String, serde_json::Value>),
}

/// A write in flight and its outcome.
type Written = (Write<Carried>, Result<Outcome, WriteError>);

/// The dead-letter topic refused a record: its partition must not be committed past it; the
/// restarted stage meets it again.
struct Refused;

impl From<Refused> for CosmosWriterError {
    fn from(_: Refused) -> Self {
        CosmosWriterError::Broker(
            "the dead-letter topic refused a record; stopping so its partition is not committed past it"
                .to_owned(),
        )
    }
}

/// The effect: the write window and the writes in flight.
pub(crate) struct Writes<'a> {
    shared: &'a Writer<'a>,
    window: Window<Carried>,
    writes: FuturesUnordered<Pin<Box<dyn Future<Output = Written> + 'a>>>,
    tick: tokio::time::Interval,
}

/// What the effect acts on.
pub(crate) enum Ready {
    /// A write finished.
    Written(Box<Written>),
    /// Time to commit.
    Tick,
}

impl<'a> Writes<'a> {
    pub(crate) fn new(shared: &'a Writer<'a>) -> Writes<'a> {
        let interval = Duration::from_millis(shared.config.batch.commit_interval_ms);
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Writes {
            shared,
            window: Window::default(),
            writes: FuturesUnordered::new(),
            tick,
        }
    }

    /// The window's commit points as the frame commits them.
    fn points(&self) -> Points {
        let topic: std::sync::Arc<str> = std::sync::Arc::from(self.shared.config.input_topic());
        self.window
            .commit_points()
            .into_iter()
            .map(|(partition, offset)| ((topic.clone(), partition), offset))
            .collect()
    }
}

impl Effect for Writes<'_> {
    type Error = CosmosWriterError;
    type Ready = Ready;

    async fn stored_positions(
        &mut self,
        consumer: &RecordingConsumer,
        partitions: &[TopicPartition],
    ) -> Result<Vec<(TopicPartition, Option<i64>)>, CosmosWriterError> {
        Ok(group_positions(consumer, partitions))
    }

    /// Its position is the group's commit; after an accepted gap the window forgets the
    /// partition's old records and counts the gap's end as committed.
    async fn start(&mut self, partition: &TopicPartition, start: Start<'_>) -> Result<(), CosmosWriterError> {
        if let Some(accepted) = start.accepted {
            self.window.restart(partition.1, accepted.from);
        }
        Ok(())
    }

    /// Records of a partition lost in a rebalance stay in the window until their writes finish
    /// (they are written all the same); the frame commits only partitions this instance owns.
    fn stop(&mut self, _partition: &TopicPartition) {}

    fn has_room(&self) -> bool {
        self.window.outstanding() < self.shared.config.batch.window_records
    }

    async fn take(&mut self, record: OwnedMessage) -> Result<(), CosmosWriterError> {
        Ok(self.shared.offer(&mut self.window, record).await?)
    }

    /// Biased: acknowledgements first (they free room and move commit points) — so under a
    /// backlog the window fills and versions coalesce while they queue, and at low load a
    /// record's write starts as soon as it is consumed.
    async fn ready(&mut self) -> Ready {
        while self.writes.len() < self.shared.config.batch.concurrency {
            let Some(write) = self.window.next_write() else {
                break;
            };
            self.writes.push(Box::pin(self.shared.start(write)));
        }
        tokio::select! {
            biased;
            Some(written) = self.writes.next(), if !self.writes.is_empty() => Ready::Written(Box::new(written)),
            _ = self.tick.tick() => Ready::Tick,
        }
    }

    async fn act(&mut self, ready: Ready) -> Result<Points, CosmosWriterError> {
        match ready {
            Ready::Written(written) => {
                let (write, outcome) = *written;
                // Not done when it gave up because the stage is stopping: the frame drains next.
                if self.shared.finish(&write, outcome).await? {
                    self.window.complete(&write.key);
                }
                Ok(Vec::new())
            }
            Ready::Tick => Ok(self.points()),
        }
    }

    fn committed(&mut self, points: &[(TopicPartition, i64)]) {
        let points: Vec<(i32, i64)> = points
            .iter()
            .map(|((_, partition), offset)| (*partition, *offset))
            .collect();
        self.window.committed(&points);
        self.shared.metrics.commits.inc();
        if let Ok(mut committed) = self.shared.committed.lock() {
            committed.extend(points);
        }
    }

    /// Stopping (docs/CONTRACT.md, "Operating"): the writes in flight finish (a write that would
    /// have to be retried gives up once stopping); what they completed is committed.
    async fn drain(&mut self) -> Result<Points, CosmosWriterError> {
        while let Some((write, outcome)) = self.writes.next().await {
            if let Ok(true) = self.shared.finish(&write, outcome).await {
                self.window.complete(&write.key);
            }
        }
        if self.window.outstanding() > 0 {
            tracing::info!(
                records = self.window.outstanding(),
                "stopping: records not yet in Cosmos DB are not committed and will be redelivered"
            );
        }
        Ok(self.points())
    }
}

impl Writer<'_> {
    /// Decodes a consumed record into the window (or the dead-letter topic).
    async fn offer(&self, window: &mut Window<Carried>, message: OwnedMessage) -> Result<(), Refused> {
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
    async fn start(&self, write: Write<Carried>) -> Written {
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

    /// Accounts for a finished write: `true` when its records are done (written, stale, or
    /// refused and dead-lettered), `false` when it gave up because the stage is stopping.
    async fn finish(
        &self,
        write: &Write<Carried>,
        outcome: Result<Outcome, WriteError>,
    ) -> Result<bool, Refused> {
        match outcome {
            Ok(Outcome::Written) => self.metrics.written.inc(),
            Ok(Outcome::Stale) => self.metrics.stale.inc(),
            Err(WriteError::Fatal(error)) => {
                self.dead_letter(&write.item.1, format!("Cosmos DB refused the document: {error}"))
                    .await?;
            }
            Err(WriteError::Stopping) => return Ok(false),
        }
        Ok(true)
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

    async fn dead_letter(&self, message: &OwnedMessage, reason: String) -> Result<(), Refused> {
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
                Err(Refused)
            }
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
}
