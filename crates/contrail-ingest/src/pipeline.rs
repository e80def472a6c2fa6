//! The path every record takes, whatever API or source it came from: validate, produce valid events
//! to the raw topic and rejected records to the dead-letter topic, and wait for the broker.
//!
//! Invariants:
//! - a record is reported `accepted` only after the broker acknowledged it (`acks=all`, idempotent
//!   producer);
//! - a rejected record is reported only after its dead letter was acknowledged — when that fails
//!   the batch counts as failed so the client retries; nothing is dropped silently;
//! - memory is bounded, in records and in bytes: records hold capacity permits from the moment
//!   they are accepted for processing until the broker resolved them (even after the client was
//!   answered), and a batch that does not fit is refused up front with
//!   [`IngestError::OverCapacity`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use contrail_common::trace::{self, TraceParent};
use contrail_events::{BodyRecord, FieldError, Limits, validate_json, validate_record};
use contrail_proto::v1::DeadLetter;
use prost::Message;
use rdkafka::producer::BaseRecord;
use tokio::sync::Semaphore;
use tracing::Instrument;

use crate::delivery::{IngestProducer, Pending, Request};
use crate::error::IngestError;
use crate::metrics::IngestMetrics;

/// Where a batch came from; labels metrics and dead letters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `POST /v1/events`.
    Http,
    /// The gRPC ingest service.
    Grpc,
    /// A pull source, by name.
    Source(String),
}

impl Origin {
    /// Metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Origin::Http => "http",
            Origin::Grpc => "grpc",
            Origin::Source(_) => "source",
        }
    }

    /// The `origin` field of a dead letter.
    pub fn describe(&self) -> String {
        match self {
            Origin::Http => "http".to_owned(),
            Origin::Grpc => "grpc".to_owned(),
            Origin::Source(name) => format!("source:{name}"),
        }
    }
}

/// What happened to one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordStatus {
    /// On the raw topic.
    Accepted,
    /// Invalid; its dead letter is on the DLQ topic.
    Rejected(Vec<FieldError>),
    /// Valid (or rejected), but the broker did not acknowledge in time: retry it.
    Failed(String),
}

/// The result of one record of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordOutcome {
    /// Position in the batch.
    pub index: usize,
    /// The record's `event_id`, when it had a readable one.
    pub event_id: Option<String>,
    /// The flight key of a valid record.
    pub flight_key: Option<String>,
    /// What happened.
    pub status: RecordStatus,
}

/// The result of a batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// One per record, in batch order.
    pub records: Vec<RecordOutcome>,
    /// Records on the raw topic.
    pub accepted: usize,
    /// Records rejected (and dead-lettered).
    pub rejected: usize,
    /// Records to retry.
    pub failed: usize,
}

/// Topic names the pipeline writes.
#[derive(Debug, Clone)]
pub struct PipelineTopics {
    /// Valid events.
    pub raw: String,
    /// Dead letters.
    pub dlq: String,
}

/// How much the pipeline takes.
#[derive(Debug, Clone, Copy)]
pub struct PipelineLimits {
    /// Records accepted but not yet resolved by the broker, over all batches (`429` above).
    pub max_in_flight: usize,
    /// Bytes (as received) of the records accepted but not yet resolved by the broker, over all
    /// batches (`429` above): the memory bound, whatever the records' sizes.
    pub max_in_flight_bytes: usize,
    /// How long a batch waits for the broker's acknowledgements (`503` after).
    pub produce_timeout: Duration,
    /// Largest record, in bytes as received: a larger one is rejected (`400`) and
    /// dead-lettered with its first bytes.
    pub max_record_bytes: usize,
    /// The broker's message limit (`message.max.bytes`): nothing written may exceed it.
    pub max_message_bytes: usize,
    /// How far ahead of ingest's clock an `event_time` may be (plausible time), µs.
    pub max_clock_skew_us: i64,
}

/// The shared publish path. Cheap to clone.
#[derive(Clone)]
pub struct Pipeline {
    inner: Arc<PipelineInner>,
}

struct PipelineInner {
    producer: Arc<IngestProducer>,
    topics: PipelineTopics,
    limits: Limits,
    capacity: Arc<Semaphore>,
    max_in_flight: usize,
    byte_capacity: Arc<Semaphore>,
    max_in_flight_bytes: usize,
    produce_timeout: Duration,
    max_record_bytes: usize,
    max_message_bytes: usize,
    max_clock_skew_us: i64,
    metrics: IngestMetrics,
    paused: Arc<AtomicBool>,
    sampler: trace::Sampler,
}

enum Validated {
    Valid {
        event_id: String,
        flight_key: String,
        payload: Vec<u8>,
    },
    Invalid {
        event_id: Option<String>,
        errors: Vec<FieldError>,
        dead_letter: Vec<u8>,
    },
}

impl Pipeline {
    /// A pipeline over an idempotent producer.
    pub fn new(
        producer: Arc<IngestProducer>,
        topics: PipelineTopics,
        limits: PipelineLimits,
        metrics: IngestMetrics,
    ) -> Pipeline {
        Pipeline {
            inner: Arc::new(PipelineInner {
                producer,
                topics,
                limits: Limits::default(),
                capacity: Arc::new(Semaphore::new(limits.max_in_flight)),
                max_in_flight: limits.max_in_flight,
                byte_capacity: Arc::new(Semaphore::new(limits.max_in_flight_bytes)),
                max_in_flight_bytes: limits.max_in_flight_bytes,
                produce_timeout: limits.produce_timeout,
                max_record_bytes: limits.max_record_bytes,
                max_message_bytes: limits.max_message_bytes,
                max_clock_skew_us: limits.max_clock_skew_us,
                metrics,
                paused: Arc::default(),
                sampler: trace::Sampler::from_env(),
            }),
        }
    }

    /// Records waiting for the broker.
    pub fn in_flight(&self) -> usize {
        self.inner.max_in_flight - self.inner.capacity.available_permits()
    }

    /// Stops accepting batches (admin pause); in-flight ones finish.
    pub fn set_paused(&self, paused: bool) {
        self.inner.paused.store(paused, Ordering::Relaxed);
    }

    /// The pause flag, shared with the admin API's controls.
    pub fn pause_flag(&self) -> Arc<AtomicBool> {
        self.inner.paused.clone()
    }

    /// Whether paused.
    pub fn is_paused(&self) -> bool {
        self.inner.paused.load(Ordering::Relaxed)
    }

    /// The producer, for health probes.
    pub fn producer(&self) -> &Arc<IngestProducer> {
        &self.inner.producer
    }

    /// Validates and publishes a batch; see the module docs for the guarantees.
    pub async fn publish(
        &self,
        records: Vec<BodyRecord>,
        origin: &Origin,
    ) -> Result<BatchOutcome, IngestError> {
        self.publish_traced(records, origin, None).await
    }

    /// [`Pipeline::publish`] for a request that may carry a trace context (`traceparent`): the
    /// request's span continues that trace (or starts one), and every record produced carries the
    /// span's context in its `traceparent` header.
    pub async fn publish_traced(
        &self,
        records: Vec<BodyRecord>,
        origin: &Origin,
        parent: Option<TraceParent>,
    ) -> Result<BatchOutcome, IngestError> {
        let span = tracing::info_span!(
            "ingest.request",
            origin = origin.label(),
            records = records.len(),
            accepted = tracing::field::Empty,
            rejected = tracing::field::Empty,
            failed = tracing::field::Empty,
            event.id = tracing::field::Empty,
            flight.key = tracing::field::Empty,
        );
        // Whether the trace is sampled is contrail's decision, not the caller's flag.
        let parent = parent.map(|parent| self.inner.sampler.decide(parent));
        if let Some(parent) = parent {
            parent.adopt(&span);
        }
        let context = trace::continued(parent, &span);
        let outcome = self
            .publish_in_trace(records, origin, context)
            .instrument(span.clone())
            .await;
        if let Ok(outcome) = &outcome {
            span.record("accepted", outcome.accepted);
            span.record("rejected", outcome.rejected);
            span.record("failed", outcome.failed);
            if let [record] = outcome.records.as_slice() {
                if let Some(event_id) = &record.event_id {
                    span.record("event.id", event_id.as_str());
                }
                if let Some(flight_key) = &record.flight_key {
                    span.record("flight.key", flight_key.as_str());
                }
            }
        }
        outcome
    }

    async fn publish_in_trace(
        &self,
        records: Vec<BodyRecord>,
        origin: &Origin,
        context: Option<TraceParent>,
    ) -> Result<BatchOutcome, IngestError> {
        let inner = &self.inner;
        // Printed once: every record of the request carries the same context.
        let traceparent = context.map(|context| context.header());
        let label = origin.label();
        if self.is_paused() {
            return Err(IngestError::BrokerUnavailable(
                "ingest is paused by an operator".to_owned(),
            ));
        }
        let count = records.len();
        if count == 0 {
            return Ok(BatchOutcome::default());
        }
        inner
            .metrics
            .records_received
            .with_label_values(&[label])
            .inc_by(count as u64);
        let refused = |in_flight: usize, limit: usize, unit: &'static str| {
            inner.metrics.requests_throttled.with_label_values(&[label]).inc();
            IngestError::OverCapacity {
                in_flight,
                limit,
                unit,
            }
        };
        let permit = u32::try_from(count)
            .ok()
            .and_then(|permits| inner.capacity.clone().try_acquire_many_owned(permits).ok())
            .ok_or_else(|| refused(self.in_flight(), inner.max_in_flight, "records"))?;
        let bytes: usize = records.iter().map(BodyRecord::raw_len).sum();
        let byte_permit = u32::try_from(bytes)
            .ok()
            .and_then(|permits| inner.byte_capacity.clone().try_acquire_many_owned(permits).ok())
            .ok_or_else(|| {
                let in_flight = inner.max_in_flight_bytes - inner.byte_capacity.available_permits();
                refused(in_flight, inner.max_in_flight_bytes, "bytes")
            })?;
        inner.metrics.in_flight_records.add(count as i64);
        // One delivery tracker for the whole batch: it holds the capacity permit (and the records in
        // the in-flight gauge) until the broker resolved every record — even after a timeout here
        // or an early return — and answers once.
        let (request, answer) = Request::new(count, vec![permit, byte_permit], inner.metrics.clone());
        let started = Instant::now();

        // Parsing, validation and encoding are CPU work: keep them off the async workers.
        let limits = inner.limits;
        let sizes = RecordSizes {
            max_record_bytes: inner.max_record_bytes,
            max_message_bytes: inner.max_message_bytes,
            max_clock_skew_us: inner.max_clock_skew_us,
        };
        let origin_text = origin.describe();
        let validated =
            tokio::task::spawn_blocking(move || validate_batch(records, &limits, sizes, &origin_text))
                .await
                .map_err(|error| {
                    IngestError::BrokerUnavailable(format!("validation task failed: {error}"))
                })?;

        let mut outcomes = Vec::with_capacity(count);
        for (index, item) in validated.into_iter().enumerate() {
            match item {
                Validated::Valid {
                    event_id,
                    flight_key,
                    payload,
                } => {
                    let mut record = BaseRecord::with_opaque_to(&inner.topics.raw, request.record(index))
                        .key(flight_key.as_bytes())
                        .payload(&payload);
                    if let Some(traceparent) = &traceparent {
                        record = record.headers(trace::traceparent_headers(traceparent.as_bytes()));
                    }
                    enqueue(&inner.producer, record, &request, index);
                    outcomes.push(RecordOutcome {
                        index,
                        event_id: Some(event_id),
                        flight_key: Some(flight_key),
                        status: RecordStatus::Accepted,
                    });
                }
                Validated::Invalid {
                    event_id,
                    errors,
                    dead_letter,
                } => {
                    let key = event_id.clone().unwrap_or_default();
                    let mut record = BaseRecord::with_opaque_to(&inner.topics.dlq, request.record(index))
                        .key(key.as_bytes())
                        .payload(&dead_letter);
                    if let Some(traceparent) = &traceparent {
                        record = record.headers(trace::traceparent_headers(traceparent.as_bytes()));
                    }
                    enqueue(&inner.producer, record, &request, index);
                    outcomes.push(RecordOutcome {
                        index,
                        event_id,
                        flight_key: None,
                        status: RecordStatus::Rejected(errors),
                    });
                }
            }
        }
        request.sent();
        drop(request);
        let delivery_errors = match tokio::time::timeout(inner.produce_timeout, answer).await {
            Ok(Ok(errors)) => errors,
            Ok(Err(_)) | Err(_) => {
                let reason = format!(
                    "broker did not acknowledge within {} ms; retry the record",
                    inner.produce_timeout.as_millis()
                );
                (0..count).map(|index| (index, reason.clone())).collect()
            }
        };
        for (index, reason) in delivery_errors {
            if let Some(outcome) = outcomes.get_mut(index) {
                outcome.status = RecordStatus::Failed(reason);
            }
        }

        let mut outcome = BatchOutcome {
            records: outcomes,
            ..BatchOutcome::default()
        };
        for record in &outcome.records {
            match record.status {
                RecordStatus::Accepted => outcome.accepted += 1,
                RecordStatus::Rejected(_) => outcome.rejected += 1,
                RecordStatus::Failed(_) => outcome.failed += 1,
            }
        }
        inner
            .metrics
            .events_accepted
            .with_label_values(&[label])
            .inc_by(outcome.accepted as u64);
        inner
            .metrics
            .records_rejected
            .with_label_values(&[label])
            .inc_by(outcome.rejected as u64);
        inner
            .metrics
            .records_failed
            .with_label_values(&[label])
            .inc_by(outcome.failed as u64);
        if outcome.failed == 0 {
            inner
                .metrics
                .publish_latency
                .observe(started.elapsed().as_secs_f64());
        } else {
            tracing::warn!(origin = %origin.describe(), failed = outcome.failed, "records not acknowledged by the broker");
        }
        Ok(outcome)
    }
}

/// Hands record `index` to the producer; when it cannot take it, the record is resolved as failed
/// with the refusal, said for the client.
fn enqueue(
    producer: &IngestProducer,
    record: BaseRecord<'_, [u8], Vec<u8>, Box<Pending>>,
    request: &Request,
    index: usize,
) {
    if let Err((error, _record)) = producer.send(record) {
        let reason = match error {
            rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull) => {
                "producer queue is full; retry the record".to_owned()
            }
            other => format!("the producer refused the record: {other}"),
        };
        request.resolve(index, Some(reason));
    }
}

/// Size limits of one record.
#[derive(Debug, Clone, Copy)]
struct RecordSizes {
    max_record_bytes: usize,
    max_message_bytes: usize,
    /// Not a size, but a per-record limit all the same: how far ahead of the clock an
    /// `event_time` may be.
    max_clock_skew_us: i64,
}

/// The plausible-time rule (docs/CONTRACT.md) on a valid event, with ingest's clock `now_us`.
fn plausible(
    event: &contrail_events::OperationalEvent,
    now_us: i64,
    max_clock_skew_us: i64,
) -> Result<(), FieldError> {
    let Some(service_date) = contrail_events::service_date_of_key(&event.flight_key) else {
        return Err(FieldError {
            field: "flight.date".to_owned(),
            message: format!("flight key {:?} has no service date", event.flight_key),
        });
    };
    contrail_events::check_plausible_time(event.event_time_us, service_date, now_us, max_clock_skew_us)
}

/// Room left in a message for a record's value besides its key and the record overhead.
fn fits_in_a_message(payload: &[u8], key: &str, sizes: RecordSizes) -> bool {
    payload.len() + key.len() + contrail_common::dead_letter::RECORD_OVERHEAD_BYTES <= sizes.max_message_bytes
}

fn validate_batch(
    records: Vec<BodyRecord>,
    limits: &Limits,
    sizes: RecordSizes,
    origin: &str,
) -> Vec<Validated> {
    let now_us = chrono::Utc::now().timestamp_micros();
    let event_id_of = |value: &serde_json::Value| -> Option<String> {
        let id = value.get("event_id")?.as_str()?;
        Some(id.chars().take(limits.max_event_id_chars).collect())
    };
    let classify = |index: usize,
                    result: Result<contrail_events::OperationalEvent, Vec<FieldError>>,
                    raw: Vec<u8>,
                    event_id: &dyn Fn(&[u8]) -> Option<String>| {
        let result = result.and_then(|event| {
            plausible(&event, now_us, sizes.max_clock_skew_us).map_err(|error| vec![error])?;
            let payload = event.encode_to_vec();
            if fits_in_a_message(&payload, &event.flight_key, sizes) {
                Ok((event, payload))
            } else {
                Err(vec![FieldError {
                    field: String::new(),
                    message: format!(
                        "record {index} encodes to {} bytes, more than the broker's message limit of {} bytes",
                        payload.len(),
                        sizes.max_message_bytes
                    ),
                }])
            }
        });
        match result {
            Ok((event, payload)) => Validated::Valid {
                event_id: event.event_id,
                flight_key: event.flight_key,
                payload,
            },
            Err(errors) => {
                let event_id = event_id(&raw);
                let dead_letter = dead_letter(
                    index,
                    raw,
                    &errors,
                    origin,
                    now_us,
                    event_id.as_deref().unwrap_or_default().len(),
                    sizes.max_message_bytes,
                );
                Validated::Invalid {
                    event_id,
                    errors,
                    dead_letter,
                }
            }
        }
    };
    let too_large = |index: usize, size: usize| {
        vec![FieldError {
            field: String::new(),
            message: format!(
                "record {index} is {size} bytes; limits.max_record_bytes = {}",
                sizes.max_record_bytes
            ),
        }]
    };
    records
        .into_iter()
        .map(|record| match record {
            BodyRecord::Parsed { index, raw, .. } if raw.len() > sizes.max_record_bytes => {
                classify(index, Err(too_large(index, raw.len())), raw, &|_| None)
            }
            BodyRecord::Raw { index, raw } if raw.len() > sizes.max_record_bytes => {
                classify(index, Err(too_large(index, raw.len())), raw.to_vec(), &|_| None)
            }
            BodyRecord::Parsed { index, value, raw } => {
                let result = validate_record(&value, limits, now_us);
                classify(index, result, raw, &|_| event_id_of(&value))
            }
            // Rare path on failure: parse again only to key the dead letter by its event id.
            BodyRecord::Raw { index, raw } => classify(
                index,
                validate_json(&raw, limits, now_us),
                raw.to_vec(),
                &|bytes| {
                    serde_json::from_slice::<serde_json::Value>(bytes)
                        .ok()
                        .as_ref()
                        .and_then(event_id_of)
                },
            ),
            BodyRecord::Malformed { index, raw, error } => {
                let errors = vec![FieldError {
                    field: String::new(),
                    message: error,
                }];
                classify(index, Err(errors), raw, &|_| None)
            }
        })
        .collect()
}

/// The dead letter of a rejected record, made to fit in one message with its key.
fn dead_letter(
    index: usize,
    raw: Vec<u8>,
    errors: &[FieldError],
    origin: &str,
    now_us: i64,
    key_len: usize,
    max_message_bytes: usize,
) -> Vec<u8> {
    let reason = errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    let mut letter = DeadLetter {
        stage: "ingest".to_owned(),
        reason,
        errors: errors
            .iter()
            .map(|error| contrail_proto::v1::FieldError {
                field: error.field.clone(),
                message: error.message.clone(),
            })
            .collect(),
        payload: raw,
        content_type: "application/json".to_owned(),
        record_index: u32::try_from(index).unwrap_or(u32::MAX),
        origin: origin.to_owned(),
        rejected_at_us: now_us,
        input: None,
        ..DeadLetter::default()
    };
    contrail_common::dead_letter::fit(&mut letter, key_len, max_message_bytes);
    letter.encode_to_vec()
}
