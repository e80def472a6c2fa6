//! The rotation processor: knock-on delay by aircraft rotation on the state engine — the second
//! processor dedup-state hosts (docs/ENGINE.md). Its input (`topics.raw` of a deployment with
//! `processor = "rotation"`) is flight states keyed by tail number — the flight processor's
//! curated states, re-keyed, on its `topics.by_tail`; per tail it keeps the
//! newest state of each of the tail's flights (map state, until a day after the flight's
//! scheduled times) and the last prediction emitted for each. After every new flight state it
//! predicts the tail's chain again ([`contrail_flight::rotation::predict`]) and emits the
//! predictions that changed on `topics.predictions` (keyed by flight key), and a `KNOCK_ON_DELAY`
//! alert when a flight's prediction, set by its inbound, passes the threshold (resolved when it
//! falls back below or the flight leaves).
//!
//! The input is written at least once (a restarted or restored flight processor sends copies):
//! a state whose version is not above the stored one changes nothing. Everything emitted is a
//! function of the input alone, so reprocessing regenerates byte-identical outputs.

use contrail_flight::rotation::{self, Prediction, TurnRules};
use contrail_proto::v1::{Alert, AlertState, FlightPrediction, FlightState, SourcePosition};
use contrail_state::{InputRecord, KeyContext, StateError, StatefulProcessor, Timer};
use prost::Message;

use crate::metrics::DedupMetrics;
use crate::processor::{DeadLetterOf, OutputTopics};

/// Map state: flight key → the flight's newest `FlightState`.
pub const LEGS: &str = "rotation_legs";
/// Map state: flight key → the last `FlightPrediction` emitted for it.
pub const EMITTED: &str = "rotation_predictions";
/// Alert kind of the knock-on rule.
pub const KNOCK_ON_DELAY: &str = "KNOCK_ON_DELAY";
/// A flight is kept this long after its scheduled times (event time).
pub const RETAIN_AFTER_US: i64 = 24 * 3_600_000_000;

/// The knock-on delay processor.
pub struct RotationProcessor {
    rules: TurnRules,
    topics: OutputTopics,
    partition: i32,
    metrics: Option<DedupMetrics>,
    max_message_bytes: usize,
}

impl RotationProcessor {
    /// A processor for the shard of `partition` of its input, `topics.raw`.
    pub fn new(
        rules: TurnRules,
        topics: OutputTopics,
        partition: i32,
        metrics: Option<DedupMetrics>,
        max_message_bytes: usize,
    ) -> Self {
        RotationProcessor {
            rules,
            topics,
            partition,
            metrics,
            max_message_bytes,
        }
    }

    fn count(&self, verdict: &str) {
        if let Some(metrics) = &self.metrics {
            metrics.verdicts.with_label_values(&[verdict]).inc();
        }
    }

    fn position(&self, offset: i64) -> SourcePosition {
        SourcePosition {
            topic: self.topics.raw.clone(),
            partition: self.partition,
            offset,
        }
    }

    fn dead_letter(&self, context: &mut KeyContext<'_>, record: &InputRecord<'_>, reason: String) {
        self.count("invalid");
        let dead = DeadLetterOf {
            position: self.position(record.offset),
            content_type: "application/x-protobuf; contrail.v1.FlightState",
            dlq: &self.topics.dlq,
            max_message_bytes: self.max_message_bytes,
        };
        dead.emit(context, record, reason);
    }
}

/// Why `state` (a by-tail record's payload with key `key`) is not a flight of that tail's
/// rotation, if it is not.
fn not_in_rotation(state: &FlightState, key: &[u8]) -> Option<String> {
    if state.flight_key.is_empty() {
        return Some("flight state without a flight key".to_owned());
    }
    if state.tail_number.as_deref().map(str::as_bytes) != Some(key) {
        return Some(format!(
            "flight state of {} has tail {:?}, not the record's key {:?}",
            state.flight_key,
            state.tail_number,
            String::from_utf8_lossy(key)
        ));
    }
    if !rotation::in_rotation(state) {
        return Some(format!(
            "flight state of {} has no scheduled out",
            state.flight_key
        ));
    }
    None
}

/// When a flight's state may be forgotten: a day after the later of its scheduled times.
fn leg_expiry(state: &FlightState) -> i64 {
    let latest = state
        .scheduled_in_us
        .unwrap_or_default()
        .max(state.scheduled_out_us.unwrap_or_default());
    latest.saturating_add(RETAIN_AFTER_US)
}

/// Whether `prediction` says something other than `emitted` did (a flight reinstated after its
/// cancellation, or re-timed, included).
fn changed(prediction: &Prediction, alert: bool, emitted: Option<&FlightPrediction>) -> bool {
    let Some(emitted) = emitted else {
        return true;
    };
    emitted.cancelled
        || emitted.scheduled_out_us != prediction.scheduled_out_us
        || emitted.predicted_out_us != prediction.predicted_out_us
        || emitted.predicted_in_us != prediction.predicted_in_us
        || emitted.knock_on_from != prediction.knock_on_from.clone().unwrap_or_default()
        || emitted.knock_on_alert != alert
}

/// The `KNOCK_ON_DELAY` alert of `prediction` (raised when `firing`, else resolved), raised by
/// the flight's prediction of version `raised_version`.
fn knock_on_alert(
    prediction: &FlightPrediction,
    firing: bool,
    departed: bool,
    input: SourcePosition,
    raised_version: u64,
) -> Alert {
    let minutes = prediction.delay_minutes;
    let message = if firing {
        format!(
            "{} predicted to leave {minutes} minutes late: its aircraft {} arrives late on {}",
            prediction.flight_key, prediction.tail_number, prediction.knock_on_from
        )
    } else {
        format!(
            "{} no longer delayed by its inbound flight",
            prediction.flight_key
        )
    };
    Alert {
        alert_id: format!("{}/{KNOCK_ON_DELAY}/{raised_version}", prediction.flight_key),
        kind: KNOCK_ON_DELAY.to_owned(),
        flight_key: prediction.flight_key.clone(),
        fired_at_us: prediction.scheduled_out_us,
        message,
        input: Some(input),
        state: if firing {
            AlertState::Firing as i32
        } else {
            AlertState::Resolved as i32
        },
        resolved_at_us: if firing { 0 } else { prediction.predicted_out_us },
        resolution: match (firing, departed) {
            (true, _) => String::new(),
            (false, true) => "DEPARTED".to_owned(),
            (false, false) => "RECOVERED".to_owned(),
        },
        ..Alert::default()
    }
}

impl StatefulProcessor for RotationProcessor {
    fn handle_record(
        &mut self,
        context: &mut KeyContext<'_>,
        record: &InputRecord<'_>,
    ) -> Result<(), StateError> {
        if record.payload.len() > self.max_message_bytes {
            self.dead_letter(
                context,
                record,
                format!("{} bytes: larger than a message", record.payload.len()),
            );
            return Ok(());
        }
        let state = match FlightState::decode(record.payload) {
            Ok(state) => state,
            Err(error) => {
                self.dead_letter(context, record, format!("not a FlightState: {error}"));
                return Ok(());
            }
        };
        if let Some(reason) = not_in_rotation(&state, record.key) {
            self.dead_letter(context, record, reason);
            return Ok(());
        }
        // Event time, bounded by the flight's own retention: a state stamped far in the future
        // cannot move the shard's watermark past every other flight (they would all expire).
        context.observe_event_time(state.updated_at_us.min(leg_expiry(&state)));
        let stored = context.map_get::<FlightState>(LEGS, state.flight_key.as_bytes())?;
        if stored.is_some_and(|stored| stored.version >= state.version) {
            self.count("duplicate");
            return Ok(());
        }
        self.count("accepted");
        context.map_put(
            LEGS,
            state.flight_key.as_bytes(),
            &state,
            Some(leg_expiry(&state)),
        );
        let legs: Vec<FlightState> = context
            .map_entries::<FlightState>(LEGS)?
            .into_iter()
            .map(|(_, leg)| leg)
            .collect();
        let by_key: std::collections::BTreeMap<&str, &FlightState> =
            legs.iter().map(|leg| (leg.flight_key.as_str(), leg)).collect();
        let predictions = rotation::predict(&legs.iter().collect::<Vec<_>>(), &self.rules);
        let tail = state.tail_number.clone().unwrap_or_default();
        let input = self.position(record.offset);
        let mut index = 0u32;
        let mut alert_index = 0u32;
        for prediction in predictions {
            let emitted = context.map_get::<FlightPrediction>(EMITTED, prediction.flight_key.as_bytes())?;
            let leg = by_key.get(prediction.flight_key.as_str());
            let departed = leg.is_some_and(|leg| leg.actual_out_us.is_some());
            let alert = prediction.is_knock_on_alert(&self.rules) && !departed;
            if !changed(&prediction, alert, emitted.as_ref()) {
                continue;
            }
            let was_alerting = emitted.as_ref().is_some_and(|emitted| emitted.knock_on_alert);
            let version = emitted.as_ref().map_or(0, |emitted| emitted.version) + 1;
            let raised_before = emitted.as_ref().map_or(0, |emitted| emitted.alert_raised_version);
            let next = FlightPrediction {
                flight_key: prediction.flight_key.clone(),
                tail_number: tail.clone(),
                scheduled_out_us: prediction.scheduled_out_us,
                predicted_out_us: prediction.predicted_out_us,
                predicted_in_us: prediction.predicted_in_us,
                knock_on_from: prediction.knock_on_from.clone().unwrap_or_default(),
                delay_minutes: i32::try_from(prediction.delay_us() / rotation::MINUTE_US).unwrap_or(i32::MAX),
                version,
                input: Some(input.clone()),
                emitted_index: index,
                knock_on_alert: alert,
                cancelled: false,
                alert_raised_version: match (alert, was_alerting) {
                    (true, true) => raised_before,
                    (true, false) => version,
                    (false, _) => 0,
                },
            };
            index += 1;
            let expiry = leg.map_or(
                prediction.scheduled_out_us.saturating_add(RETAIN_AFTER_US),
                |leg| leg_expiry(leg),
            );
            context.map_put(EMITTED, prediction.flight_key.as_bytes(), &next, Some(expiry));
            let flight_key = next.flight_key.clone().into_bytes();
            context.emit(&self.topics.predictions, &flight_key, next.encode_to_vec());
            if alert != was_alerting {
                let raised_version = if alert { version } else { raised_before };
                let mut raised = knock_on_alert(&next, alert, departed, input.clone(), raised_version);
                raised.emitted_after_offset = record.offset;
                raised.emitted_index = alert_index;
                alert_index += 1;
                if let Some(metrics) = &self.metrics {
                    let label = if alert { "firing" } else { "resolved" };
                    metrics.alerts.with_label_values(&[label]).inc();
                }
                context.emit(&self.topics.alerts, &flight_key, raised.encode_to_vec());
            }
        }
        // A flight cancelled after it had a prediction: its last prediction says so (and its
        // alert, if raised, ends), so no stale departure time stays in the serving store.
        for leg in legs.iter().filter(|leg| leg.status == "CANCELLED") {
            let Some(emitted) = context.map_get::<FlightPrediction>(EMITTED, leg.flight_key.as_bytes())?
            else {
                continue;
            };
            if emitted.cancelled {
                continue;
            }
            let next = FlightPrediction {
                version: emitted.version + 1,
                input: Some(input.clone()),
                emitted_index: index,
                knock_on_alert: false,
                cancelled: true,
                alert_raised_version: 0,
                ..emitted.clone()
            };
            index += 1;
            context.map_put(EMITTED, leg.flight_key.as_bytes(), &next, Some(leg_expiry(leg)));
            let flight_key = next.flight_key.clone().into_bytes();
            context.emit(&self.topics.predictions, &flight_key, next.encode_to_vec());
            if emitted.knock_on_alert {
                let mut resolved =
                    knock_on_alert(&next, false, false, input.clone(), emitted.alert_raised_version);
                resolved.resolution = "CANCELLED".to_owned();
                resolved.emitted_after_offset = record.offset;
                resolved.emitted_index = alert_index;
                alert_index += 1;
                if let Some(metrics) = &self.metrics {
                    metrics.alerts.with_label_values(&["resolved"]).inc();
                }
                context.emit(&self.topics.alerts, &flight_key, resolved.encode_to_vec());
            }
        }
        Ok(())
    }

    fn handle_timer(&mut self, _context: &mut KeyContext<'_>, _timer: &Timer) -> Result<(), StateError> {
        // Only the engine's own TTL timers: the processor registers none.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state(key: &str, tail: &str, version: u64) -> FlightState {
        FlightState {
            flight_key: key.to_owned(),
            carrier: "UA".to_owned(),
            tail_number: Some(tail.to_owned()),
            status: "SCHEDULED".to_owned(),
            scheduled_out_us: Some(1_000_000_000),
            scheduled_in_us: Some(2_000_000_000),
            version,
            ..FlightState::default()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Any bytes as key and payload (valid states of the key's tail mixed in): no panic, no
        /// error, and every record that is not a flight state of its key's rotation becomes
        /// exactly one dead letter naming its input position.
        #[test]
        fn arbitrary_input_never_fails_and_bad_records_become_dead_letters(
            records in prop::collection::vec(
                prop_oneof![
                    (prop::collection::vec(1u8..=255, 1..12), prop::collection::vec(any::<u8>(), 0..64)),
                    (1u64..4, 0usize..3).prop_map(|(version, flight)| {
                        (b"N1".to_vec(), state(&format!("F{flight}"), "N1", version).encode_to_vec())
                    }),
                ],
                1..20,
            )
        ) {
            let topics = OutputTopics::default();
            let mut processor = RotationProcessor::new(TurnRules::default(), topics.clone(), 0, None, 1_000_000);
            let outputs = crate::processor::test_support::one_batch(&records, &mut processor);
            let dead = crate::processor::test_support::dead_letters(&outputs, &topics.dlq);
            let invalid = records
                .iter()
                .filter(|(key, payload)| {
                    FlightState::decode(payload.as_slice()).map_or(true, |state| not_in_rotation(&state, key).is_some())
                })
                .count();
            prop_assert_eq!(dead.len(), invalid);
            // A copy or an older version of a flight's state changes nothing: versions of the
            // predictions emitted per flight count up from 1 without a gap.
            let mut versions: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
            for output in outputs.iter().filter(|output| output.topic == topics.predictions) {
                let prediction = FlightPrediction::decode(output.payload.as_slice()).expect("prediction");
                let last = versions.entry(prediction.flight_key.clone()).or_default();
                prop_assert_eq!(prediction.version, *last + 1);
                *last = prediction.version;
            }
        }
    }
}
