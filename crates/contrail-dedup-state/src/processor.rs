//! The flight processor: docs/CONTRACT.md's processing rules on the state engine. Per flight key it
//! keeps the `FlightKeyState` (value state kept while the flight lives — until its horizon,
//! [`flight::horizon_us`] — and then until `dedup_ttl` after the later of its service date's end
//! and its last event, so redeliveries still count as duplicates), the dedup entries of accepted
//! event ids and the DEPARTURE_OVERDUE event-time timer; per record it checks plausible time,
//! decides duplicate / late / accepted with the pure [`contrail_flight::flight::decide`] and emits
//! the outputs.
//!
//! Everything emitted is a function of the input alone, so reprocessing after a crash or a restore
//! regenerates byte-identical outputs. The one clock read — plausible time's bound on how far
//! ahead an event may be — uses the record's broker timestamp, which is part of the input, capped
//! by the processing clock (a broker timestamp ahead of it is not trusted): see [`reference_clock_us`].

use contrail_common::dead_letter::Unprocessable;
use contrail_flight::flight::{self, LateReason, Rules, Verdict};
use contrail_proto::state::v1::FlightKeyState;
use contrail_proto::v1::{Alert, AlertState, FlightState, OperationalEvent, SourcePosition};
use contrail_state::{InputRecord, KeyContext, StateError, StatefulProcessor, TimeDomain, Timer};
use prost::Message;

use crate::metrics::DedupMetrics;

/// The value-state variable holding a flight's `FlightKeyState`.
pub const FLIGHT_STATE: &str = "flight";
/// The DEPARTURE_OVERDUE timer.
pub const OVERDUE_TIMER: &str = "departure_overdue";
/// Alert kind of the overdue rule.
pub const DEPARTURE_OVERDUE: &str = "DEPARTURE_OVERDUE";
/// State key used for input records whose key cannot be a state key (empty, or containing NUL).
pub const INVALID_KEY: &[u8] = b"\xffinvalid-key";

/// Where outputs go: the stage's topic configuration.
pub type OutputTopics = crate::config::TopicsConfig;

/// What an output adds to its input record's bytes at most: the input position, the late reason,
/// a state's own fields. An input record larger than the message limit less this cannot have its
/// outputs written: it is dead-lettered instead.
pub const OUTPUT_HEADROOM_BYTES: usize = 16 * 1024;

/// The flight processor (docs/CONTRACT.md, "Processing in dedup-state").
pub struct FlightProcessor {
    rules: Rules,
    topics: OutputTopics,
    partition: i32,
    metrics: Option<DedupMetrics>,
    /// The broker's message limit: no output may be larger.
    max_message_bytes: usize,
    /// The last alert's place in the input: `(input offset, index)` (see [`Alert::emitted_index`]).
    last_alert: Option<(i64, u32)>,
    /// The processing clock of this batch, µs (plausible time).
    clock_us: i64,
}

/// The clock an event time is checked against (plausible time): when the record reached the raw
/// topic — its broker timestamp — or the processing clock `clock_us` if the record has none or it
/// is later. For every record written by a client whose clock is not ahead of dedup-state's, this
/// is the broker timestamp, the same on every reprocessing, so the verdict is deterministic.
pub fn reference_clock_us(record_timestamp_us: Option<i64>, clock_us: i64) -> i64 {
    record_timestamp_us.map_or(clock_us, |timestamp| timestamp.min(clock_us))
}

impl FlightProcessor {
    /// A processor for the shard of `partition` whose outputs must fit in `max_message_bytes`.
    pub fn new(
        rules: Rules,
        topics: OutputTopics,
        partition: i32,
        metrics: Option<DedupMetrics>,
        max_message_bytes: usize,
    ) -> Self {
        FlightProcessor {
            rules,
            topics,
            partition,
            metrics,
            max_message_bytes,
            last_alert: None,
            clock_us: chrono::Utc::now().timestamp_micros(),
        }
    }

    /// The processor with `clock_us` as the processing clock (by default, the wall clock when it
    /// was made).
    pub fn with_clock(mut self, clock_us: i64) -> Self {
        self.clock_us = clock_us;
        self
    }

    /// Emits `alert` (raised or resolved) with its place in the shard's input: after the record
    /// at [`KeyContext::input_offset`], numbered from 0 among the alerts emitted there. Processing
    /// is deterministic, so a replay numbers them the same way.
    fn emit_alert(&mut self, context: &mut KeyContext<'_>, mut alert: Alert) {
        let offset = context.input_offset().unwrap_or(-1);
        let index = match self.last_alert {
            Some((last, index)) if last == offset => index + 1,
            _ => 0,
        };
        self.last_alert = Some((offset, index));
        alert.emitted_after_offset = offset;
        alert.emitted_index = index;
        if let Some(metrics) = &self.metrics {
            let state = match alert.state() {
                AlertState::Firing => "firing",
                AlertState::Resolved => "resolved",
            };
            metrics.alerts.with_label_values(&[state]).inc();
        }
        let key = context.key().to_vec();
        context.emit(&self.topics.alerts, &key, alert.encode_to_vec());
    }

    fn count(&self, verdict: &str) {
        if let Some(metrics) = &self.metrics {
            metrics.verdicts.with_label_values(&[verdict]).inc();
        }
    }

    /// Dead-letters `record` for `reason`, counted under `verdict` (`invalid`, `implausible`,
    /// `flight_full`, `state_too_large`).
    fn dead_letter(
        &self,
        context: &mut KeyContext<'_>,
        record: &InputRecord<'_>,
        verdict: &str,
        reason: String,
    ) {
        self.count(verdict);
        let dead = DeadLetterOf {
            position: self.position(record.offset),
            content_type: "application/x-protobuf; contrail.v1.OperationalEvent",
            dlq: &self.topics.dlq,
            max_message_bytes: self.max_message_bytes,
        };
        dead.emit(context, record, reason);
    }

    fn position(&self, offset: i64) -> SourcePosition {
        SourcePosition {
            topic: self.topics.raw.clone(),
            partition: self.partition,
            offset,
        }
    }
}

/// Where and how an input record a processor cannot process is dead-lettered.
pub(crate) struct DeadLetterOf<'a> {
    /// The record's input position.
    pub(crate) position: SourcePosition,
    /// What its payload should have been.
    pub(crate) content_type: &'a str,
    /// The dead-letter topic.
    pub(crate) dlq: &'a str,
    /// No dead letter is larger.
    pub(crate) max_message_bytes: usize,
}

impl DeadLetterOf<'_> {
    /// Emits the dead letter of `record`, saying `reason`.
    pub(crate) fn emit(self, context: &mut KeyContext<'_>, record: &InputRecord<'_>, reason: String) {
        tracing::warn!(partition = self.position.partition, offset = record.offset, %reason, "unprocessable input record to the dead-letter topic");
        let rejected = Unprocessable {
            position: self.position,
            key: record.key,
            payload: record.payload,
            content_type: self.content_type.to_owned(),
        };
        // Deterministic outputs: no wall clock. The input position identifies the record.
        let letter = rejected.dead_letter("dedup-state", reason, 0, self.max_message_bytes);
        context.emit(self.dlq, record.key, letter);
    }
}

/// The end of the service date in a state key (a flight key), µs; `i64::MIN` for a key without
/// one (no record of such a key is ever accepted, so only its events' times count).
pub(crate) fn flight_service_end(key: &[u8]) -> i64 {
    std::str::from_utf8(key)
        .ok()
        .and_then(flight::service_end_us)
        .unwrap_or(i64::MIN)
}

/// A DEPARTURE_OVERDUE alert of `flight_key` fired at `fired_at_us`; `message` follows the key.
/// The tail whose rotation `state` belongs to: its tail number when it takes part in one (a
/// scheduled out, a tail usable as a record key), else empty.
fn rotation_tail(state: &FlightState) -> &str {
    match state.tail_number.as_deref() {
        Some(tail) if contrail_flight::rotation::in_rotation(state) && !tail.contains('\0') => tail,
        _ => "",
    }
}

fn overdue_alert(
    flight_key: &str,
    fired_at_us: i64,
    message: String,
    input: Option<SourcePosition>,
) -> Alert {
    Alert {
        alert_id: format!("{flight_key}/{DEPARTURE_OVERDUE}"),
        kind: DEPARTURE_OVERDUE.to_owned(),
        flight_key: flight_key.to_owned(),
        fired_at_us,
        message: format!("{flight_key} {message}"),
        input,
        ..Alert::default()
    }
}

impl StatefulProcessor for FlightProcessor {
    fn handle_record(
        &mut self,
        context: &mut KeyContext<'_>,
        record: &InputRecord<'_>,
    ) -> Result<(), StateError> {
        let largest = self.max_message_bytes.saturating_sub(OUTPUT_HEADROOM_BYTES);
        if record.payload.len() + record.key.len() > largest {
            self.dead_letter(
                context,
                record,
                "invalid",
                format!(
                    "record of {} bytes: what dedup-state writes for it would exceed the broker's message \
                     limit of {} bytes (at most {largest} bytes with its key)",
                    record.payload.len(),
                    self.max_message_bytes
                ),
            );
            return Ok(());
        }
        let event = match OperationalEvent::decode(record.payload) {
            Ok(event) => event,
            Err(error) => {
                self.dead_letter(
                    context,
                    record,
                    "invalid",
                    format!("not a contrail.v1.OperationalEvent: {error}"),
                );
                return Ok(());
            }
        };
        if event.event_id.is_empty() || event.flight_key.as_bytes() != record.key {
            let reason = format!(
                "event {:?}: record key {:?} does not equal flight_key {:?} (or event_id is empty)",
                event.event_id,
                String::from_utf8_lossy(record.key),
                event.flight_key
            );
            self.dead_letter(context, record, "invalid", reason);
            return Ok(());
        }
        let Some(service_date) = contrail_events::service_date_of_key(&event.flight_key) else {
            let reason = format!(
                "event {:?}: flight key {:?} has no service date ({{carrier}}{{number}}-{{YYYY-MM-DD}}-{{origin}})",
                event.event_id, event.flight_key
            );
            self.dead_letter(context, record, "invalid", reason);
            return Ok(());
        };
        // Plausible time, before the event can move the shard's watermark.
        let clock = reference_clock_us(record.timestamp_us, self.clock_us);
        if let Err(error) = contrail_events::check_plausible_time(
            event.event_time_us,
            service_date,
            clock,
            self.rules.max_clock_skew_us,
        ) {
            let reason = format!("event {:?} of {}: {error}", event.event_id, event.flight_key);
            self.dead_letter(context, record, "implausible", reason);
            return Ok(());
        }
        let service_end =
            contrail_events::date_start_us(service_date).saturating_add(contrail_events::DAY_US);
        context.observe_event_time(event.event_time_us);
        let position = self.position(record.offset);
        // The flight's dedup entries live in its key state; the engine's dedup family only holds
        // entries written by earlier versions, consulted while any are left.
        let already_seen = context.dedup_in_use() && context.dedup_contains(event.event_id.as_bytes())?;
        let mut key_state: Option<FlightKeyState> = context.get(FLIGHT_STATE)?;
        let shard_watermark = context.watermark_us();
        match flight::decide(
            &mut key_state,
            &event,
            &position,
            already_seen,
            service_end,
            shard_watermark,
            &self.rules,
        ) {
            Verdict::Duplicate => self.count("duplicate"),
            Verdict::Late { watermark_us, reason } => {
                self.count(match reason {
                    LateReason::Lateness => "late",
                    LateReason::Expired => "late_expired",
                });
                tracing::debug!(event_id = %event.event_id, flight_key = %event.flight_key, watermark_us, reason = reason.as_str(), "late event");
                let mut late = event;
                late.input = Some(position);
                late.late_reason = reason.as_str().to_owned();
                context.emit(&self.topics.late, record.key, late.encode_to_vec());
            }
            Verdict::Full { limit } => {
                // Bounded per-key state: the flight's record already holds its maximum of
                // accepted events; this one is not applied (the record stays as it was).
                let reason = format!(
                    "event {:?} of {}: the flight already accepted {limit} events, the most a flight \
                     accepts (rules.max_events_per_flight); not applied",
                    event.event_id, event.flight_key
                );
                self.dead_letter(context, record, "flight_full", reason);
            }
            Verdict::Accepted { state } => {
                let Some(mut key_state) = key_state else {
                    return Err(StateError::Processor(
                        "decide accepted without a key state".to_owned(),
                    ));
                };
                let resolution = flight::resolves_overdue(&key_state, &state);
                if resolution.is_some() {
                    key_state.overdue_resolved = true;
                }
                let encoded = state.encode_to_vec();
                let largest = self.max_message_bytes.saturating_sub(OUTPUT_HEADROOM_BYTES);
                if encoded.len() + record.key.len() > largest {
                    // Bounded per-key state: a state no broker message can carry is not applied
                    // (the stored state stays as it was); its event goes to the dead-letter topic.
                    let reason = format!(
                        "event {:?} of {}: the flight's state with it would be {} bytes, more than the \
                         {largest} bytes a state may have within the broker's message limit of {} bytes",
                        event.event_id,
                        event.flight_key,
                        encoded.len(),
                        self.max_message_bytes
                    );
                    self.dead_letter(context, record, "state_too_large", reason);
                    return Ok(());
                }
                self.count("accepted");
                // The rotation processor's input: the same state keyed by its aircraft; when the
                // aircraft changed, the previous one's rotation gets it too (it lets the flight go).
                if !self.topics.by_tail.is_empty() {
                    let tail = rotation_tail(&state);
                    if !key_state.rotation_tail.is_empty() && key_state.rotation_tail != tail {
                        context.emit(
                            &self.topics.by_tail,
                            key_state.rotation_tail.as_bytes(),
                            encoded.clone(),
                        );
                    }
                    if !tail.is_empty() {
                        context.emit(&self.topics.by_tail, tail.as_bytes(), encoded.clone());
                    }
                    key_state.rotation_tail = tail.to_owned();
                }
                context.set(
                    FLIGHT_STATE,
                    &key_state,
                    Some(flight::record_expiry(&key_state, service_end, &self.rules)),
                );
                match flight::overdue_timer(&state, key_state.overdue_alerted, &self.rules) {
                    Some(fire_at) => context.register_timer(OVERDUE_TIMER, TimeDomain::EventTime, fire_at),
                    None => context.delete_timer(OVERDUE_TIMER, TimeDomain::EventTime),
                }
                context.emit(&self.topics.curated, record.key, encoded);
                if let Some(resolution) = resolution {
                    let resolved = Alert {
                        state: AlertState::Resolved as i32,
                        resolved_at_us: event.event_time_us,
                        resolution: resolution.to_owned(),
                        ..overdue_alert(
                            &state.flight_key,
                            key_state.overdue_fired_at_us,
                            format!("is no longer overdue: {}", resolution.to_lowercase()),
                            Some(position.clone()),
                        )
                    };
                    self.emit_alert(context, resolved);
                }
                let mut accepted = event;
                accepted.input = Some(position);
                context.emit(&self.topics.accepted, record.key, accepted.encode_to_vec());
            }
        }
        Ok(())
    }

    fn handle_timer(&mut self, context: &mut KeyContext<'_>, timer: &Timer) -> Result<(), StateError> {
        if timer.name != OVERDUE_TIMER {
            return Ok(());
        }
        let Some(mut key_state) = context.get::<FlightKeyState>(FLIGHT_STATE)? else {
            return Ok(());
        };
        let service_end = flight_service_end(context.key());
        if flight::is_expired(service_end, Some(&key_state), context.watermark_us(), &self.rules) {
            return Ok(());
        }
        let current = flight::current_state(&key_state);
        if key_state.overdue_alerted || !flight::is_overdue(&current, timer.fire_at_us, &self.rules) {
            return Ok(());
        }
        key_state.overdue_alerted = true;
        key_state.overdue_fired_at_us = timer.fire_at_us;
        context.set(
            FLIGHT_STATE,
            &key_state,
            Some(flight::record_expiry(&key_state, service_end, &self.rules)),
        );
        let alert = overdue_alert(
            &current.flight_key,
            timer.fire_at_us,
            format!(
                "has not left the gate {} minutes after its scheduled departure",
                self.rules.overdue_after_us / 60_000_000
            ),
            current.input.clone(),
        );
        if let Some(metrics) = &self.metrics {
            metrics.timers_fired.inc();
        }
        self.emit_alert(context, alert);
        Ok(())
    }
}

/// Scaffolding of the processors' fuzz tests.
#[cfg(test)]
pub(crate) mod test_support {
    use contrail_proto::v1::DeadLetter;
    use contrail_state::{EngineConfig, InputRecord, OutboxRecord, Shard, StatefulProcessor};
    use prost::Message;

    /// `records` (key, payload) as one batch through `processor` on a fresh shard; the outputs.
    pub(crate) fn one_batch<P: StatefulProcessor>(
        records: &[(Vec<u8>, Vec<u8>)],
        processor: &mut P,
    ) -> Vec<OutboxRecord> {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut shard = Shard::open(&dir.path().join("s"), 0).expect("open");
        let inputs: Vec<InputRecord<'_>> = records
            .iter()
            .enumerate()
            .map(|(offset, (key, payload))| InputRecord {
                key,
                payload,
                offset: offset as i64,
                trace: None,
                timestamp_us: None,
            })
            .collect();
        let engine = EngineConfig {
            allowed_lateness_us: 3_600_000_000,
        };
        let result = shard
            .process_batch(&inputs, processor, &engine, 0)
            .expect("a batch of arbitrary records commits");
        result.outputs.into_iter().map(|(_, output)| output).collect()
    }

    /// The dead letters among `outputs`, each checked to name the stage, a reason and the
    /// record's input position.
    pub(crate) fn dead_letters(outputs: &[OutboxRecord], dlq: &str) -> Vec<DeadLetter> {
        let letters: Vec<DeadLetter> = outputs
            .iter()
            .filter(|output| output.topic == dlq)
            .map(|output| DeadLetter::decode(output.payload.as_slice()).expect("dead letter"))
            .collect();
        for letter in &letters {
            assert_eq!(letter.stage, "dedup-state");
            assert!(!letter.reason.is_empty());
            assert!(letter.input.is_some());
        }
        letters
    }
}

#[cfg(test)]
mod tests;
