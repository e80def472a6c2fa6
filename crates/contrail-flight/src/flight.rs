//! What dedup-state decides for one event of one flight (docs/CONTRACT.md, "Processing"):
//! duplicate, late, or accepted — and, when accepted, the new per-flight state and the
//! `FlightState` to emit. Pure: the caller supplies whether the event id was seen, the end of the
//! flight's service date and the shard watermark, and persists the result.
//!
//! Invariant (property-tested): for any arrival order and any duplication of a flight's events
//! within the lateness bound, the final `FlightState` and `version` are those of folding the distinct
//! events in (event_time, event_id) order.

use contrail_proto::state::v1::{FlightKeyState, SeenEvent};
use contrail_proto::v1::{EventType, FlightState, OperationalEvent, SourcePosition};

use crate::fold::{apply, empty_state, order_key, status};

/// The time rules of docs/CONTRACT.md, in microseconds of event time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// How far behind the key's newest event an event may be and still be applied (default 1 h).
    pub allowed_lateness_us: i64,
    /// How long after its event time a dedup entry is kept (default 72 h).
    pub dedup_ttl_us: i64,
    /// How long a flight's state is kept after the later of its service date's end and its last
    /// event (default 48 h): see [`horizon_us`].
    pub state_ttl_us: i64,
    /// DEPARTURE_OVERDUE fires this long after `scheduled_out` without OUT/CANCELLED (15 min).
    pub overdue_after_us: i64,
    /// How far ahead of the processing clock an event time may be (plausible time, 1 h).
    pub max_clock_skew_us: i64,
}

impl Default for Rules {
    fn default() -> Self {
        const HOUR: i64 = 3_600_000_000;
        Rules {
            allowed_lateness_us: HOUR,
            dedup_ttl_us: 72 * HOUR,
            state_ttl_us: 48 * HOUR,
            overdue_after_us: 15 * 60_000_000,
            max_clock_skew_us: HOUR,
        }
    }
}

/// Why an event is late (docs/CONTRACT.md, "Lateness" and "A flight's lifetime"). Carried on the
/// late event (`late_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateReason {
    /// Older than its flight's watermark (the flight's newest event − `allowed_lateness`).
    Lateness,
    /// Its flight's horizon is behind the shard watermark: the flight no longer operates, and
    /// applying the event would restart its versions.
    Expired,
}

impl LateReason {
    /// The `late_reason` text on the late event.
    pub fn as_str(self) -> &'static str {
        match self {
            LateReason::Lateness => "lateness",
            LateReason::Expired => "expired",
        }
    }
}

/// The verdict on one event.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Its event id was already accepted for this flight: dropped and counted.
    Duplicate,
    /// Not applied: to `ops.events.late`.
    Late {
        /// The watermark it missed, µs: the flight's watermark (`lateness`) or its horizon
        /// (`expired`).
        watermark_us: i64,
        /// Why.
        reason: LateReason,
    },
    /// Applied: emit `state` (version = accepted count) and the event itself.
    Accepted {
        /// The new `FlightState`.
        state: Box<FlightState>,
    },
}

/// The end of the service date written in `flight_key` (00:00 UTC of the day after
/// `flight.date`), µs; `None` for a key not of the form `{carrier}{number}-{date}-{origin}`.
pub fn service_end_us(flight_key: &str) -> Option<i64> {
    contrail_events::service_date_of_key(flight_key)
        .map(|date| contrail_events::date_start_us(date).saturating_add(contrail_events::DAY_US))
}

/// A flight's *horizon*: max(end of its service date, its latest accepted event time) +
/// `state_ttl`. The flight lives while the shard watermark is before it; once the watermark
/// reaches it the flight is expired, its state can go, and every further event of it is late
/// (`expired`). Decided from the key (`service_end_us`, see [`service_end_us`]) and the stored
/// state if any: without a stored state the horizon is the service date's alone, which is never
/// later than the horizon the deleted state had, so expiry holds with or without a tombstone and a
/// flight's versions never restart.
pub fn horizon_us(service_end_us: i64, key_state: Option<&FlightKeyState>, rules: &Rules) -> i64 {
    let newest = key_state.map_or(i64::MIN, |state| state.max_event_time_us);
    service_end_us.max(newest).saturating_add(rules.state_ttl_us)
}

/// Whether a flight is expired: its horizon is at or behind the shard watermark.
pub fn is_expired(
    service_end_us: i64,
    key_state: Option<&FlightKeyState>,
    shard_watermark_us: i64,
    rules: &Rules,
) -> bool {
    horizon_us(service_end_us, key_state, rules) <= shard_watermark_us
}

/// Decides on `event` for a flight whose stored record is `key_state` (`None`: a flight never
/// seen, or whose record was deleted after it expired). `service_end_us`: the end of the service
/// date in the event's key ([`service_end_us`]). `already_seen`: a live dedup entry for the event id
/// kept outside `key_state` (the engine's dedup family, written by earlier versions); the ids
/// accepted into `key_state` are checked here, and the event's id is added to them when accepted.
/// `shard_watermark_us`: the shard's max event time − `allowed_lateness`, with this event
/// observed. In order:
/// 1. a live dedup entry (in `key_state`'s `seen`, or `already_seen` from elsewhere) → duplicate;
/// 2. the flight's horizon is at or behind the shard watermark → late, `expired`;
/// 3. older than the flight's watermark (its newest event − `allowed_lateness`) → late;
/// 4. otherwise accepted: `key_state` is updated in place (created for a new flight).
pub fn decide(
    key_state: &mut Option<FlightKeyState>,
    event: &OperationalEvent,
    input: &SourcePosition,
    already_seen: bool,
    service_end_us: i64,
    shard_watermark_us: i64,
    rules: &Rules,
) -> Verdict {
    let horizon = horizon_us(service_end_us, key_state.as_ref(), rules);
    if already_seen
        || key_state
            .as_ref()
            .is_some_and(|state| has_seen(state, &event.event_id, horizon, shard_watermark_us))
    {
        return Verdict::Duplicate;
    }
    if horizon <= shard_watermark_us {
        return Verdict::Late {
            watermark_us: horizon,
            reason: LateReason::Expired,
        };
    }
    if let Some(state) = key_state.as_ref() {
        let watermark_us = state.max_event_time_us.saturating_sub(rules.allowed_lateness_us);
        if event.event_time_us < watermark_us {
            return Verdict::Late {
                watermark_us,
                reason: LateReason::Lateness,
            };
        }
    }
    let state = key_state.get_or_insert_with(|| FlightKeyState {
        base: Some(empty_state(event)),
        pending: Vec::new(),
        max_event_time_us: i64::MIN,
        accepted: 0,
        overdue_alerted: false,
        seen: Vec::new(),
        overdue_resolved: false,
        overdue_fired_at_us: 0,
        rotation_tail: String::new(),
    });
    state
        .seen
        .retain(|seen| entry_is_live(seen.expires_at_us, horizon, shard_watermark_us));
    state.seen.push(SeenEvent {
        event_id: event.event_id.clone(),
        expires_at_us: dedup_expiry(event, service_end_us, rules),
    });
    let position = state
        .pending
        .partition_point(|pending| order_key(pending) < order_key(event));
    let mut stored = event.clone();
    stored.input = Some(input.clone());
    state.pending.insert(position, stored);
    state.max_event_time_us = state.max_event_time_us.max(event.event_time_us);
    state.accepted += 1;

    // Events below the new watermark are final: fold them into the base.
    let new_watermark = state.max_event_time_us.saturating_sub(rules.allowed_lateness_us);
    let final_count = state
        .pending
        .partition_point(|pending| pending.event_time_us < new_watermark);
    let base = state.base.get_or_insert_with(|| empty_state(event));
    for finished in state.pending.drain(..final_count) {
        apply(base, &finished);
    }
    let mut current = base.clone();
    for pending in &state.pending {
        apply(&mut current, pending);
    }
    current.version = state.accepted;
    current.input = Some(input.clone());
    Verdict::Accepted {
        state: Box::new(current),
    }
}

/// Whether a dedup entry expiring at `expires_at_us` still counts: until its own expiry, and in
/// any case while its flight lives (the watermark is before the flight's `horizon_us`). Dedup
/// entries therefore live at least as long as the state.
fn entry_is_live(expires_at_us: i64, horizon_us: i64, shard_watermark_us: i64) -> bool {
    expires_at_us > shard_watermark_us || horizon_us > shard_watermark_us
}

/// Whether `event_id` was accepted for this flight and its dedup entry is live (see
/// [`dedup_expiry`]; while the flight lives, every entry is). `horizon_us`: the flight's
/// [`horizon_us`].
pub fn has_seen(
    key_state: &FlightKeyState,
    event_id: &str,
    horizon_us: i64,
    shard_watermark_us: i64,
) -> bool {
    key_state.seen.iter().any(|seen| {
        seen.event_id == event_id && entry_is_live(seen.expires_at_us, horizon_us, shard_watermark_us)
    })
}

/// The flight's live dedup entries: accepted event ids and when each expires.
pub fn live_dedup_entries(
    key_state: &FlightKeyState,
    horizon_us: i64,
    shard_watermark_us: i64,
) -> Vec<(&str, i64)> {
    key_state
        .seen
        .iter()
        .filter(|seen| entry_is_live(seen.expires_at_us, horizon_us, shard_watermark_us))
        .map(|seen| (seen.event_id.as_str(), seen.expires_at_us))
        .collect()
}

/// When the DEPARTURE_OVERDUE timer of a flight should fire: `scheduled_out + 15 min`, while the
/// flight has a schedule, has not departed, is not cancelled, and was not alerted yet.
pub fn overdue_timer(state: &FlightState, alerted: bool, rules: &Rules) -> Option<i64> {
    if alerted || state.actual_out_us.is_some() || state.status == status::CANCELLED {
        return None;
    }
    state
        .scheduled_out_us
        .map(|scheduled| scheduled + rules.overdue_after_us)
}

/// Whether the overdue rule still holds when its timer fires at `fire_at_us`.
pub fn is_overdue(state: &FlightState, fire_at_us: i64, rules: &Rules) -> bool {
    overdue_timer(state, false, rules) == Some(fire_at_us)
}

/// How a raised DEPARTURE_OVERDUE alert ends: `CANCELLED` once the flight is cancelled, else
/// `DEPARTED` once it has an actual out time; `None` while it is still overdue.
pub fn overdue_resolution(state: &FlightState) -> Option<&'static str> {
    if state.status == status::CANCELLED {
        Some(status::CANCELLED)
    } else if state.actual_out_us.is_some() {
        Some(status::DEPARTED)
    } else {
        None
    }
}

/// Whether accepting the event that produced `state` resolves the flight's alert: it was raised,
/// not resolved yet, and the flight has now departed or is cancelled. Returns how it ended.
pub fn resolves_overdue(key_state: &FlightKeyState, state: &FlightState) -> Option<&'static str> {
    if !key_state.overdue_alerted || key_state.overdue_resolved {
        return None;
    }
    overdue_resolution(state)
}

/// When a flight's stored record is deleted: `dedup_ttl` after the later of its service date's
/// end and its last event (at least its horizon, as `dedup_ttl >= state_ttl` is required at start).
/// From the horizon on the flight is expired ([`is_expired`]); the record stays until then so that
/// a redelivery is still counted a duplicate, not a late event.
pub fn record_expiry(key_state: &FlightKeyState, service_end_us: i64, rules: &Rules) -> i64 {
    service_end_us
        .max(key_state.max_event_time_us)
        .saturating_add(rules.dedup_ttl_us.max(rules.state_ttl_us))
}

/// When a dedup entry for an event expires: `dedup_ttl` after the later of its event time and its
/// flight's service date's end. While the flight lives the entry counts in any case
/// ([`has_seen`]).
pub fn dedup_expiry(event: &OperationalEvent, service_end_us: i64, rules: &Rules) -> i64 {
    event
        .event_time_us
        .max(service_end_us)
        .saturating_add(rules.dedup_ttl_us)
}

/// The current `FlightState` of a stored key state (for reads through the admin API).
pub fn current_state(key_state: &FlightKeyState) -> FlightState {
    let mut current = key_state.base.clone().unwrap_or_default();
    for pending in &key_state.pending {
        apply(&mut current, pending);
    }
    current.version = key_state.accepted;
    current.input = key_state.pending.last().and_then(|event| event.input.clone());
    current
}

/// Whether an event type ends the overdue watch (used by callers deciding to delete the timer).
pub fn ends_departure_watch(event: &OperationalEvent) -> bool {
    matches!(
        EventType::try_from(event.r#type),
        Ok(EventType::Out | EventType::Cancelled)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use contrail_proto::v1::EventData;
    use proptest::prelude::*;
    use std::collections::HashSet;

    const MINUTE: i64 = 60_000_000;
    const HOUR: i64 = 60 * MINUTE;
    const DAY: i64 = 24 * HOUR;
    /// The service date's end of the test events' flight, as the tests below take it: the test
    /// events happen at minute 0–6,000 of event time, so a day after minute 2,000 is in their range.
    const SERVICE_END: i64 = 2_000 * MINUTE;

    fn event(id: &str, event_type: EventType, minute: i64) -> OperationalEvent {
        let data = EventData {
            gate: Some(format!("G{minute}")),
            delay_minutes: Some(i32::try_from(minute).unwrap_or(0)),
            delay_code: Some(id.to_owned()),
            scheduled_out_us: Some(600 * MINUTE),
            ..EventData::default()
        };
        crate::fold::tests::event(id, event_type, minute, data)
    }

    /// Runs arrivals through `decide` with a dedup set, as the engine does; returns the last emitted
    /// state and the verdict counts.
    fn run(arrivals: &[OperationalEvent], rules: &Rules) -> (Option<FlightState>, usize, usize, usize) {
        let mut key_state = None;
        let mut seen = HashSet::new();
        let mut last = None;
        let (mut accepted, mut duplicates, mut late) = (0, 0, 0);
        let mut shard_max = i64::MIN;
        for (offset, event) in arrivals.iter().enumerate() {
            shard_max = shard_max.max(event.event_time_us);
            let input = SourcePosition {
                topic: "raw".into(),
                partition: 0,
                offset: offset as i64,
            };
            match decide(
                &mut key_state,
                event,
                &input,
                seen.contains(&event.event_id),
                SERVICE_END,
                shard_max.saturating_sub(rules.allowed_lateness_us),
                rules,
            ) {
                Verdict::Accepted { state } => {
                    seen.insert(event.event_id.clone());
                    accepted += 1;
                    assert_eq!(state.version, accepted as u64, "version = accepted count");
                    last = Some(*state);
                }
                Verdict::Duplicate => duplicates += 1,
                Verdict::Late { .. } => late += 1,
            }
        }
        (last, accepted, duplicates, late)
    }

    /// The independent expectation: fold the distinct events in (event_time, event_id) order.
    fn reference(events: &[OperationalEvent]) -> FlightState {
        let mut sorted: Vec<&OperationalEvent> = events.iter().collect();
        sorted.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
        let mut state = empty_state(sorted[0]);
        for event in &sorted {
            apply(&mut state, event);
        }
        state.version = events.len() as u64;
        state
    }

    fn without_input(mut state: FlightState) -> FlightState {
        state.input = None;
        state
    }

    const TYPES: [EventType; 8] = [
        EventType::Scheduled,
        EventType::GateAssigned,
        EventType::Delayed,
        EventType::Boarding,
        EventType::Out,
        EventType::Off,
        EventType::On,
        EventType::In,
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        /// Any permutation and any duplication of events within the lateness bound yields the
        /// reference fold and version.
        #[test]
        fn arrival_order_and_duplicates_do_not_change_the_result(
            specs in prop::collection::vec((0usize..8, 0i64..60), 1..10),
            order in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
            duplicates in prop::collection::vec(any::<prop::sample::Index>(), 0..10),
        ) {
            // Distinct ids; times within 60 minutes, inside the 1 h lateness bound.
            let events: Vec<OperationalEvent> = specs
                .iter()
                .enumerate()
                .map(|(n, (kind, minute))| event(&format!("e{n}"), TYPES[*kind], 1000 + minute))
                .collect();
            let mut arrivals = events.clone();
            for pick in &duplicates {
                arrivals.push(events[pick.index(events.len())].clone());
            }
            for (position, pick) in order.iter().enumerate() {
                let length = arrivals.len();
                arrivals.swap(position % length, pick.index(length));
            }
            let (last, accepted, duplicate_count, late) = run(&arrivals, &Rules::default());
            prop_assert_eq!(late, 0);
            prop_assert_eq!(accepted, events.len());
            prop_assert_eq!(duplicate_count, duplicates.len());
            prop_assert_eq!(without_input(last.expect("accepted")), reference(&events));
        }

        /// Whatever the arrival order, an event more than the lateness behind the key's newest
        /// accepted event is late, and everything accepted still folds to the reference of the
        /// accepted events.
        #[test]
        fn late_events_are_never_applied(
            minutes in prop::collection::vec(0i64..300, 1..12),
        ) {
            let events: Vec<OperationalEvent> = minutes
                .iter()
                .enumerate()
                .map(|(n, minute)| event(&format!("e{n}"), TYPES[n % 8], *minute))
                .collect();
            let rules = Rules::default();
            let mut key_state = None;
            let mut accepted_events = Vec::new();
            let mut max_accepted = i64::MIN;
            for (offset, event) in events.iter().enumerate() {
                let input = SourcePosition { topic: "raw".into(), partition: 0, offset: offset as i64 };
                let verdict = decide(&mut key_state, event, &input, false, SERVICE_END, i64::MIN, &rules);
                let expected_late = max_accepted != i64::MIN && event.event_time_us < max_accepted - rules.allowed_lateness_us;
                match verdict {
                    Verdict::Late { .. } => prop_assert!(expected_late),
                    Verdict::Accepted { state } => {
                        prop_assert!(!expected_late);
                        accepted_events.push(event.clone());
                        max_accepted = max_accepted.max(event.event_time_us);
                        prop_assert_eq!(without_input(*state), reference(&accepted_events));
                    }
                    Verdict::Duplicate => prop_assert!(false, "no duplicates were sent"),
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Events of one flight at any times, with the shard's watermark moving on (other
        /// flights) by any amount between them, and the flight's stored record deleted whenever
        /// the engine would: the versions emitted are 1, 2, 3, … with no restart and no gap, and
        /// every verdict is the one the lifetime rule written out here gives (horizon = max(end of
        /// the service date, newest accepted event) + state_ttl, checked against the watermark).
        #[test]
        fn versions_never_restart_and_each_late_event_names_its_rule(
            steps in prop::collection::vec((0i64..12_000, 0i64..8_000), 1..16),
            service_end_minute in 0i64..6_000,
        ) {
            let rules = Rules::default();
            let service_end = service_end_minute * MINUTE;
            let mut key_state: Option<FlightKeyState> = None;
            let mut shard_max = i64::MIN;
            let mut version = 0u64;
            let mut newest = i64::MIN;
            for (n, (minute, jump)) in steps.iter().enumerate() {
                let arriving = event(&format!("e{n}"), TYPES[n % 8], *minute);
                // Other flights move the shard on by `jump` minutes beyond this event.
                shard_max = shard_max.max(arriving.event_time_us).max(newest.saturating_add(jump * MINUTE));
                let watermark = shard_max - rules.allowed_lateness_us;
                // The engine deletes the record once the watermark passes its expiry.
                if key_state.as_ref().is_some_and(|state| record_expiry(state, service_end, &rules) <= watermark) {
                    key_state = None;
                }
                let time = arriving.event_time_us;
                // By hand: 48 h after the later of the date's end and the newest accepted event.
                let lives_until = service_end.max(newest) + 48 * HOUR;
                let expected = if lives_until <= watermark {
                    Some(LateReason::Expired)
                } else if newest != i64::MIN && time < newest - HOUR {
                    Some(LateReason::Lateness)
                } else {
                    None
                };
                let input = SourcePosition { topic: "raw".into(), partition: 0, offset: n as i64 };
                match decide(&mut key_state, &arriving, &input, false, service_end, watermark, &rules) {
                    Verdict::Accepted { state } => {
                        prop_assert_eq!(expected, None);
                        version += 1;
                        prop_assert_eq!(state.version, version, "no restart, no gap");
                        newest = newest.max(time);
                    }
                    Verdict::Late { reason, .. } => prop_assert_eq!(Some(reason), expected),
                    Verdict::Duplicate => prop_assert!(false, "no duplicates were sent"),
                }
            }
        }
    }

    /// A schedule published 330 days ahead, then the shard moves on to the day (other flights'
    /// events): the flight's OUT on its day is applied as version 2, its state DEPARTED.
    #[test]
    fn a_schedule_published_months_ahead_lives_until_its_flight_operates() {
        let rules = Rules::default();
        let input = SourcePosition::default();
        let service_end = 400 * DAY;
        let published = event("s", EventType::Scheduled, (service_end - 331 * DAY) / MINUTE);
        let mut key_state = None;
        let watermark = published.event_time_us - rules.allowed_lateness_us;
        assert!(matches!(
            decide(
                &mut key_state,
                &published,
                &input,
                false,
                service_end,
                watermark,
                &rules
            ),
            Verdict::Accepted { .. }
        ));
        let out = event("o", EventType::Out, (service_end - DAY + 10 * HOUR) / MINUTE);
        let watermark = out.event_time_us - rules.allowed_lateness_us;
        match decide(
            &mut key_state,
            &out,
            &input,
            false,
            service_end,
            watermark,
            &rules,
        ) {
            Verdict::Accepted { state } => {
                assert_eq!(state.version, 2);
                assert_eq!(state.status, crate::fold::status::DEPARTED);
            }
            other => panic!("the departure must be applied: {other:?}"),
        }
        // Its horizon: the service date's end + 48 h (the OUT is before the date's end).
        let stored = key_state.expect("state");
        assert_eq!(
            horizon_us(service_end, Some(&stored), &rules),
            service_end + 48 * HOUR
        );
        assert!(!is_expired(
            service_end,
            Some(&stored),
            service_end + 48 * HOUR - 1,
            &rules
        ));
        assert!(is_expired(
            service_end,
            Some(&stored),
            service_end + 48 * HOUR,
            &rules
        ));
    }

    /// Expiry is decided from the key's date and the watermark: with no stored record at all
    /// (deleted long ago), an event of a flight whose date ended more than `state_ttl` before the
    /// watermark is late (`expired`) even when its own time is recent, and leaves no state.
    #[test]
    fn an_event_of_a_flight_long_over_is_expired_without_a_tombstone() {
        let rules = Rules::default();
        let service_end = 100 * DAY;
        let watermark = service_end + 48 * HOUR;
        let correction = event("c", EventType::Delayed, (watermark + 2 * HOUR) / MINUTE);
        let mut nothing = None;
        assert_eq!(
            decide(
                &mut nothing,
                &correction,
                &SourcePosition::default(),
                false,
                service_end,
                watermark,
                &rules
            ),
            Verdict::Late {
                watermark_us: service_end + 48 * HOUR,
                reason: LateReason::Expired
            }
        );
        assert!(nothing.is_none(), "late events leave no state");
        // One microsecond earlier the flight still lives: a first event is version 1.
        assert!(matches!(
            decide(
                &mut nothing,
                &correction,
                &SourcePosition::default(),
                false,
                service_end,
                watermark - 1,
                &rules
            ),
            Verdict::Accepted { .. }
        ));
    }

    /// The scenario of a correction days later: a flight's events on its day, then the shard
    /// moves on past its horizon (other flights), then a DELAYED correction with a recent event
    /// time. It is late (`expired`), the stored record keeps its version, and nothing restarts at
    /// 1. While the flight lives, the same correction is applied as the next version.
    #[test]
    fn a_correction_for_an_expired_flight_is_late_and_its_versions_never_restart() {
        let rules = Rules::default();
        let input = SourcePosition::default();
        let mut key_state = None;
        let mut shard_max = i64::MIN;
        let first_minute = SERVICE_END / MINUTE - 600;
        for (n, kind) in TYPES.iter().enumerate() {
            let arriving = event(&format!("e{n}"), *kind, first_minute + n as i64);
            shard_max = shard_max.max(arriving.event_time_us);
            let verdict = decide(
                &mut key_state,
                &arriving,
                &input,
                false,
                SERVICE_END,
                shard_max - rules.allowed_lateness_us,
                &rules,
            );
            assert!(matches!(verdict, Verdict::Accepted { .. }), "{verdict:?}");
        }
        // 49 hours after the service date's end; the correction is stamped now.
        let now = SERVICE_END + 49 * HOUR;
        let correction = event("correction", EventType::Delayed, now / MINUTE);
        let verdict = decide(
            &mut key_state,
            &correction,
            &input,
            false,
            SERVICE_END,
            now - rules.allowed_lateness_us,
            &rules,
        );
        assert_eq!(
            verdict,
            Verdict::Late {
                watermark_us: SERVICE_END + 48 * HOUR,
                reason: LateReason::Expired
            }
        );
        let stored = key_state.expect("the record is kept until its expiry");
        assert_eq!(stored.accepted, 8, "the version stays at the flight's last");
        assert_eq!(
            record_expiry(&stored, SERVICE_END, &rules),
            SERVICE_END + 72 * HOUR,
            "kept until dedup_ttl after the service date's end"
        );
        // While the flight lives (47 h after its date's end), the correction is version 9.
        let mut live = Some(stored.clone());
        let live_now = SERVICE_END + 47 * HOUR;
        let correction = event("correction", EventType::Delayed, live_now / MINUTE);
        match decide(
            &mut live,
            &correction,
            &input,
            false,
            SERVICE_END,
            live_now - rules.allowed_lateness_us,
            &rules,
        ) {
            Verdict::Accepted { state } => assert_eq!(state.version, 9),
            other => panic!("a live flight accepts its correction: {other:?}"),
        }
    }

    /// The flight's own record holds its dedup entries: with nothing passed as `already_seen`, a
    /// redelivery is a duplicate while the flight lives, whatever the entry's own expiry (a
    /// schedule published long ahead), and until dedup_ttl after the later of its event time and
    /// the service date's end; a different event with the same id in another flight is not (ids
    /// are per flight).
    #[test]
    fn the_key_state_remembers_accepted_ids_while_the_flight_lives() {
        let rules = Rules::default();
        let input = SourcePosition::default();
        let service_end = 300 * DAY;
        let first = event("e1", EventType::Scheduled, 10 * DAY / MINUTE);
        let mut key_state = None;
        let watermark = first.event_time_us - rules.allowed_lateness_us;
        assert!(matches!(
            decide(
                &mut key_state,
                &first,
                &input,
                false,
                service_end,
                watermark,
                &rules
            ),
            Verdict::Accepted { .. }
        ));
        let stored = key_state.clone().expect("state");
        let horizon = horizon_us(service_end, Some(&stored), &rules);
        assert_eq!(horizon, service_end + 48 * HOUR);
        let entry_expiry = service_end + 72 * HOUR;
        assert_eq!(
            live_dedup_entries(&stored, horizon, watermark),
            [("e1", entry_expiry)]
        );
        // 200 days later (far beyond the event time + 72 h), the redelivery is still a duplicate.
        let later = 210 * DAY;
        assert_eq!(
            decide(&mut key_state, &first, &input, false, service_end, later, &rules),
            Verdict::Duplicate
        );
        assert!(has_seen(&stored, "e1", horizon, entry_expiry - 1));
        assert!(!has_seen(&stored, "e1", horizon, entry_expiry));
        // Past its dedup TTL the redelivery is no duplicate any more: the flight is expired.
        assert!(matches!(
            decide(
                &mut key_state,
                &first,
                &input,
                false,
                service_end,
                entry_expiry,
                &rules
            ),
            Verdict::Late {
                reason: LateReason::Expired,
                ..
            }
        ));
        let mut other_flight = None;
        assert!(matches!(
            decide(
                &mut other_flight,
                &first,
                &input,
                false,
                service_end,
                watermark,
                &rules
            ),
            Verdict::Accepted { .. }
        ));
    }

    #[test]
    fn the_service_date_end_of_a_key() {
        // 2013-01-02T00:00:00Z = 15,707 days after the epoch (by hand).
        assert_eq!(service_end_us("UA1545-2013-01-01-EWR"), Some(15_707 * DAY));
        assert_eq!(service_end_us("not a key"), None);
    }

    #[test]
    fn overdue_timer_follows_the_schedule_and_stops_at_out_or_cancel() {
        let rules = Rules::default();
        let mut state = FlightState {
            scheduled_out_us: Some(600 * MINUTE),
            ..FlightState::default()
        };
        assert_eq!(overdue_timer(&state, false, &rules), Some(615 * MINUTE));
        assert!(is_overdue(&state, 615 * MINUTE, &rules));
        assert_eq!(overdue_timer(&state, true, &rules), None, "alerted once only");
        state.status = status::CANCELLED.to_owned();
        assert_eq!(overdue_timer(&state, false, &rules), None);
        state.status = status::DEPARTED.to_owned();
        state.actual_out_us = Some(620 * MINUTE);
        assert!(!is_overdue(&state, 615 * MINUTE, &rules));
    }

    #[test]
    fn a_raised_overdue_alert_resolves_once_at_departure_or_cancellation() {
        let mut state = FlightState {
            scheduled_out_us: Some(600 * MINUTE),
            status: status::BOARDING.to_owned(),
            ..FlightState::default()
        };
        let mut key_state = FlightKeyState::default();
        assert_eq!(overdue_resolution(&state), None, "still at the gate");
        state.actual_out_us = Some(640 * MINUTE);
        state.status = status::DEPARTED.to_owned();
        assert_eq!(
            resolves_overdue(&key_state, &state),
            None,
            "never raised: nothing to resolve"
        );
        key_state.overdue_alerted = true;
        assert_eq!(resolves_overdue(&key_state, &state), Some(status::DEPARTED));
        key_state.overdue_resolved = true;
        assert_eq!(resolves_overdue(&key_state, &state), None, "resolved once only");
        let cancelled = FlightState {
            status: status::CANCELLED.to_owned(),
            ..FlightState::default()
        };
        assert_eq!(overdue_resolution(&cancelled), Some(status::CANCELLED));
    }

    #[test]
    fn current_state_matches_the_last_emitted_state() {
        let events: Vec<OperationalEvent> = (0..6)
            .map(|n| event(&format!("e{n}"), TYPES[n], 1000 + (n as i64) * 20))
            .collect();
        let mut key_state = None;
        let mut last = None;
        for (offset, event) in events.iter().rev().enumerate() {
            let input = SourcePosition {
                topic: "raw".into(),
                partition: 0,
                offset: offset as i64,
            };
            if let Verdict::Accepted { state } = decide(
                &mut key_state,
                event,
                &input,
                false,
                SERVICE_END,
                i64::MIN,
                &Rules::default(),
            ) {
                last = Some(*state);
            }
        }
        let stored = key_state.expect("state");
        assert!(
            stored.pending.len() < events.len(),
            "old events were folded into the base"
        );
        assert_eq!(
            without_input(current_state(&stored)),
            without_input(last.expect("emitted"))
        );
    }
}
