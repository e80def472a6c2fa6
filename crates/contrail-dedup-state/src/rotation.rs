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

    /// Stores `next` as the flight's last prediction here (until `expiry`) and emits it.
    fn emit_prediction(
        &self,
        context: &mut KeyContext<'_>,
        out: &mut Emitter,
        mut next: FlightPrediction,
        expiry: i64,
    ) {
        next.input = Some(out.input.clone());
        next.emitted_index = out.index;
        out.index += 1;
        context.map_put(EMITTED, next.flight_key.as_bytes(), &next, Some(expiry));
        context.emit(
            &self.topics.predictions,
            next.flight_key.as_bytes(),
            next.encode_to_vec(),
        );
    }

    /// Emits the `KNOCK_ON_DELAY` alert of `prediction`: raised when `firing` (by the
    /// prediction of version `raised_version`), else resolved with `resolution`.
    fn emit_alert(
        &self,
        context: &mut KeyContext<'_>,
        out: &mut Emitter,
        prediction: &FlightPrediction,
        firing: bool,
        raised_version: u64,
        resolution: &str,
    ) {
        let mut alert = knock_on_alert(prediction, firing, resolution, out.input.clone(), raised_version);
        alert.emitted_after_offset = out.offset;
        alert.emitted_index = out.alert_index;
        out.alert_index += 1;
        if let Some(metrics) = &self.metrics {
            let label = if firing { "firing" } else { "resolved" };
            metrics.alerts.with_label_values(&[label]).inc();
        }
        context.emit(
            &self.topics.alerts,
            prediction.flight_key.as_bytes(),
            alert.encode_to_vec(),
        );
    }

    /// The last prediction of a flight predicted here as `emitted` and now cancelled (`leg`, its
    /// newest state): the previous times marked cancelled, and its alert resolved.
    fn cancel(
        &self,
        context: &mut KeyContext<'_>,
        out: &mut Emitter,
        emitted: &FlightPrediction,
        leg: &FlightState,
        tail: &str,
    ) {
        let next = FlightPrediction {
            tail_number: tail.to_owned(),
            version: prediction_version(leg.version, Some(emitted)),
            knock_on_alert: false,
            cancelled: true,
            alert_raised_version: 0,
            ..emitted.clone()
        };
        self.emit_prediction(context, out, next.clone(), leg_expiry(leg));
        if emitted.knock_on_alert {
            self.emit_alert(
                context,
                out,
                &next,
                false,
                emitted.alert_raised_version,
                "CANCELLED",
            );
        }
    }

    /// `state` says the flight of `emitted` (this tail's last prediction of it) left this
    /// rotation. Its alert from here ends (`REASSIGNED`). When another tail takes it over, that
    /// tail's predictions (newer versions) replace this one's; otherwise this tail says the last
    /// word: cancelled, or the flight's own times. The stored prediction names where the flight
    /// went, so a return to this tail predicts it again.
    fn leave(
        &self,
        context: &mut KeyContext<'_>,
        out: &mut Emitter,
        emitted: &FlightPrediction,
        state: &FlightState,
    ) {
        let went_to = state.tail_number.clone().unwrap_or_default();
        if emitted.knock_on_alert {
            self.emit_alert(
                context,
                out,
                emitted,
                false,
                emitted.alert_raised_version,
                "REASSIGNED",
            );
        }
        // A cancelled flight is predicted by no tail (the new one skips it): this one says so.
        let taken_over =
            rotation::in_rotation(state) && !went_to.contains('\0') && state.status != "CANCELLED";
        if !taken_over && state.status == "CANCELLED" {
            return self.cancel(context, out, emitted, state, &went_to);
        }
        let own = (!taken_over)
            .then(|| rotation::predict(&[state], &self.rules).into_iter().next())
            .flatten();
        let mut last = FlightPrediction {
            tail_number: went_to,
            knock_on_alert: false,
            alert_raised_version: 0,
            ..emitted.clone()
        };
        match own {
            Some(own) => {
                last.version = prediction_version(state.version, Some(emitted));
                last.scheduled_out_us = own.scheduled_out_us;
                last.predicted_out_us = own.predicted_out_us;
                last.predicted_in_us = own.predicted_in_us;
                last.knock_on_from = String::new();
                last.delay_minutes = i32::try_from(own.delay_us() / rotation::MINUTE_US).unwrap_or(i32::MAX);
                last.cancelled = false;
                self.emit_prediction(context, out, last, leg_expiry(state));
            }
            None => context.map_put(
                EMITTED,
                state.flight_key.as_bytes(),
                &last,
                Some(leg_expiry(state)),
            ),
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

/// Whether `state` (a by-tail record's payload with key `key`) is a flight of that tail's
/// rotation. A state of another tail (or of none) on this key says the flight left this
/// rotation: the flight processor sends it to the tail the flight had before.
fn in_this_rotation(state: &FlightState, key: &[u8]) -> bool {
    rotation::in_rotation(state) && state.tail_number.as_deref().map(str::as_bytes) == Some(key)
}

/// The version of the next prediction of a flight whose stored state has `state_version`, after
/// `emitted`, this tail's last prediction of it: the state version in the high half (clamped to
/// 2^31 - 1, so it fits Delta's signed column), a count of this tail's predictions of the flight
/// in the low half. Every tail that gets the flight later gets it with a newer state, so its
/// predictions are above all of this tail's: the versions are unique per flight and the newest
/// tail wins the serving store's guard.
pub fn prediction_version(state_version: u64, emitted: Option<&FlightPrediction>) -> u64 {
    let high = state_version.min(i32::MAX as u64);
    let count = emitted.map_or(0, |emitted| emitted.version & u64::from(u32::MAX));
    (high << 32) | count.saturating_add(1).min(u64::from(u32::MAX))
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
fn changed(prediction: &Prediction, alert: bool, emitted: Option<&FlightPrediction>, tail: &str) -> bool {
    let Some(emitted) = emitted else {
        return true;
    };
    // A flight that left this rotation and came back (its stored prediction names the tail it
    // left for): what that tail predicted is newer, so this tail says it again.
    emitted.tail_number != tail
        || emitted.cancelled
        || emitted.scheduled_out_us != prediction.scheduled_out_us
        || emitted.predicted_out_us != prediction.predicted_out_us
        || emitted.predicted_in_us != prediction.predicted_in_us
        || emitted.knock_on_from != prediction.knock_on_from.clone().unwrap_or_default()
        || emitted.knock_on_alert != alert
}

/// Where the outputs of one input record stand: the record's position, and how many
/// predictions and alerts it emitted so far (their `emitted_index`).
struct Emitter {
    input: SourcePosition,
    offset: i64,
    index: u32,
    alert_index: u32,
}

/// The `KNOCK_ON_DELAY` alert of `prediction` (raised when `firing`, else resolved with
/// `resolution`), raised by the flight's prediction of version `raised_version`.
fn knock_on_alert(
    prediction: &FlightPrediction,
    firing: bool,
    resolution: &str,
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
        resolution: if firing {
            String::new()
        } else {
            resolution.to_owned()
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
        if state.flight_key.is_empty() {
            self.dead_letter(context, record, "flight state without a flight key".to_owned());
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
        let joins = in_this_rotation(&state, record.key);
        self.count(if joins { "accepted" } else { "left_rotation" });
        // A flight that left stays stored (its newer state) until it expires, so an older copy
        // of its state cannot bring it back; it takes no part in the chain.
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
            .filter(|leg| in_this_rotation(leg, record.key))
            .collect();
        let by_key: std::collections::BTreeMap<&str, &FlightState> =
            legs.iter().map(|leg| (leg.flight_key.as_str(), leg)).collect();
        let predictions = rotation::predict(&legs.iter().collect::<Vec<_>>(), &self.rules);
        let tail = String::from_utf8_lossy(record.key).into_owned();
        let mut out = Emitter {
            input: self.position(record.offset),
            offset: record.offset,
            index: 0,
            alert_index: 0,
        };
        for prediction in predictions {
            let emitted = context.map_get::<FlightPrediction>(EMITTED, prediction.flight_key.as_bytes())?;
            let Some(leg) = by_key.get(prediction.flight_key.as_str()) else {
                continue;
            };
            let departed = leg.actual_out_us.is_some();
            let alert = prediction.is_knock_on_alert(&self.rules) && !departed;
            if !changed(&prediction, alert, emitted.as_ref(), &tail) {
                continue;
            }
            let was_alerting = emitted.as_ref().is_some_and(|emitted| emitted.knock_on_alert);
            let version = prediction_version(leg.version, emitted.as_ref());
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
                input: None,
                emitted_index: 0,
                knock_on_alert: alert,
                cancelled: false,
                alert_raised_version: match (alert, was_alerting) {
                    (true, true) => raised_before,
                    (true, false) => version,
                    (false, _) => 0,
                },
            };
            self.emit_prediction(context, &mut out, next.clone(), leg_expiry(leg));
            if alert != was_alerting {
                let raised_version = if alert { version } else { raised_before };
                let resolution = if departed { "DEPARTED" } else { "RECOVERED" };
                self.emit_alert(context, &mut out, &next, alert, raised_version, resolution);
            }
        }
        // A flight cancelled after it had a prediction: its last prediction says so (and its
        // alert, if raised, ends), so no stale departure time stays in the serving store.
        for leg in legs.iter().filter(|leg| leg.status == "CANCELLED") {
            let Some(emitted) = context.map_get::<FlightPrediction>(EMITTED, leg.flight_key.as_bytes())?
            else {
                continue;
            };
            // Cancelled already, or predicted here before the flight left (then the tail it came
            // back from, cancelled, said so: one tail says it, one version).
            if emitted.cancelled || emitted.tail_number != tail {
                continue;
            }
            self.cancel(context, &mut out, &emitted, leg, &tail);
        }
        // The flight left this rotation: its alert from here ends, and unless another tail takes
        // it over (with newer predictions), its last prediction here is replaced by one from its
        // own times (or a cancelled one), so no knock-on from this aircraft stays behind.
        if !joins
            && let Some(emitted) =
                context.map_get::<FlightPrediction>(EMITTED, state.flight_key.as_bytes())?
            && emitted.tail_number == tail
        {
            self.leave(context, &mut out, &emitted, &state);
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
        /// error, and every record that is not a flight's state becomes exactly one dead letter
        /// naming its input position (a flight's state of another tail says the flight left).
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
                .filter(|(_, payload)| {
                    FlightState::decode(payload.as_slice()).map_or(true, |state| state.flight_key.is_empty())
                })
                .count();
            prop_assert_eq!(dead.len(), invalid);
            // A copy or an older version of a flight's state changes nothing: the versions of
            // the predictions emitted per flight rise, their counts (low half) by one each.
            let mut versions: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
            for output in outputs.iter().filter(|output| output.topic == topics.predictions) {
                let prediction = FlightPrediction::decode(output.payload.as_slice()).expect("prediction");
                let last = versions.entry(prediction.flight_key.clone()).or_default();
                prop_assert!(prediction.version > *last);
                prop_assert_eq!(prediction.version & 0xffff_ffff, (*last & 0xffff_ffff) + 1);
                *last = prediction.version;
            }
        }
    }
}
