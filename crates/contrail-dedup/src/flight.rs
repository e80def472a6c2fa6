//! What dedup-state decides for one event of one flight (DESIGN §3): duplicate, late, or accepted —
//! and, when accepted, the new per-flight state and the `FlightState` to emit. Pure: the caller
//! supplies whether the event id was seen and the shard's max event time, and persists the result.
//!
//! Invariant (property-tested): for any arrival order and any duplication of a flight's events
//! within the lateness bound, the final `FlightState` and `version` are those of folding the distinct
//! events in (event_time, event_id) order.

use contrail_proto::state::v1::FlightKeyState;
use contrail_proto::v1::{EventType, FlightState, OperationalEvent, SourcePosition};

use crate::fold::{apply, empty_state, order_key, status};

/// The time rules of DESIGN §3, in microseconds of event time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// How far behind the key's newest event an event may be and still be applied (default 1 h).
    pub allowed_lateness_us: i64,
    /// How long after its event time a dedup entry is kept (default 72 h).
    pub dedup_ttl_us: i64,
    /// How long after a flight's last event its state is kept (default 48 h).
    pub state_ttl_us: i64,
    /// DEPARTURE_OVERDUE fires this long after `scheduled_out` without OUT/CANCELLED (15 min).
    pub overdue_after_us: i64,
}

impl Default for Rules {
    fn default() -> Self {
        const HOUR: i64 = 3_600_000_000;
        Rules {
            allowed_lateness_us: HOUR,
            dedup_ttl_us: 72 * HOUR,
            state_ttl_us: 48 * HOUR,
            overdue_after_us: 15 * 60_000_000,
        }
    }
}

/// The verdict on one event.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Its event id was already accepted for this flight: dropped and counted.
    Duplicate,
    /// Older than the key's watermark (or than an expired key could be): to `ops.events.late`.
    Late {
        /// The watermark it missed, µs.
        watermark_us: i64,
    },
    /// Applied: emit `state` (version = accepted count) and the event itself.
    Accepted {
        /// The new `FlightState`.
        state: Box<FlightState>,
    },
}

/// Decides on `event` for a flight whose stored state is `key_state` (`None`: no state, new or
/// expired). `already_seen`: the event id is in the flight's dedup set. `shard_max_event_time_us`:
/// the max event time seen in the shard (for keys without state). On acceptance `key_state` is
/// updated in place (created if needed).
pub fn decide(
    key_state: &mut Option<FlightKeyState>,
    event: &OperationalEvent,
    input: &SourcePosition,
    already_seen: bool,
    shard_max_event_time_us: i64,
    rules: &Rules,
) -> Verdict {
    if already_seen {
        return Verdict::Duplicate;
    }
    let watermark_us = match key_state {
        Some(state) => state.max_event_time_us.saturating_sub(rules.allowed_lateness_us),
        // No state: either a new flight, or one whose state expired — an event that old would have
        // been late for the expired state, so it is late by construction.
        None => shard_max_event_time_us.saturating_sub(rules.state_ttl_us),
    };
    if event.event_time_us < watermark_us {
        return Verdict::Late { watermark_us };
    }
    let state = key_state.get_or_insert_with(|| FlightKeyState {
        base: Some(empty_state(event)),
        pending: Vec::new(),
        max_event_time_us: i64::MIN,
        accepted: 0,
        overdue_alerted: false,
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

/// When a flight's state expires: `state_ttl` after its last event.
pub fn state_expiry(key_state: &FlightKeyState, rules: &Rules) -> i64 {
    key_state.max_event_time_us.saturating_add(rules.state_ttl_us)
}

/// When a dedup entry for an event expires: `dedup_ttl` after its event time.
pub fn dedup_expiry(event: &OperationalEvent, rules: &Rules) -> i64 {
    event.event_time_us.saturating_add(rules.dedup_ttl_us)
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
                shard_max,
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
                let verdict = decide(&mut key_state, event, &input, false, i64::MIN, &rules);
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

    #[test]
    fn a_new_key_is_late_only_if_it_would_have_expired() {
        let rules = Rules::default();
        let shard_max = 100 * 60 * MINUTE;
        let input = SourcePosition::default();
        let mut fresh = None;
        let old = event("old", EventType::Out, 100 * 60 - 49 * 60);
        assert!(matches!(
            decide(&mut fresh, &old, &input, false, shard_max, &rules),
            Verdict::Late { .. }
        ));
        assert!(fresh.is_none(), "late events leave no state");
        let recent = event("recent", EventType::Out, 100 * 60 - 47 * 60);
        assert!(matches!(
            decide(&mut fresh, &recent, &input, false, shard_max, &rules),
            Verdict::Accepted { .. }
        ));
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
            if let Verdict::Accepted { state } =
                decide(&mut key_state, event, &input, false, i64::MIN, &Rules::default())
            {
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
