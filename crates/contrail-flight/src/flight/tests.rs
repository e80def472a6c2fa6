//! Tests of the flight decisions: order, duplicates, lateness and a flight's lifetime.

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
            Verdict::Full { limit } => panic!("no flight here has {limit} events"),
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
                Verdict::Full { .. } => prop_assert!(false, "no flight here reaches the limit"),
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
                Verdict::Full { .. } => prop_assert!(false, "no flight here reaches the limit"),
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

#[test]
fn a_flight_accepts_at_most_its_limit_and_its_record_stays_bounded() {
    let rules = Rules {
        max_events_per_flight: 5,
        ..Rules::default()
    };
    let mut key_state = None;
    let mut verdicts = Vec::new();
    let mut shard_max = i64::MIN;
    let mut decide_at = |key_state: &mut Option<FlightKeyState>, event: &OperationalEvent| {
        shard_max = shard_max.max(event.event_time_us);
        decide(
            key_state,
            event,
            &SourcePosition::default(),
            false,
            SERVICE_END,
            shard_max - rules.allowed_lateness_us,
            &rules,
        )
    };
    // A source sending a new estimate every minute: 50 distinct events of one flight.
    for minute in 0..50 {
        let event = event(&format!("e{minute}"), EventType::Estimated, minute);
        verdicts.push(decide_at(&mut key_state, &event));
    }
    let versions: Vec<u64> = verdicts
        .iter()
        .filter_map(|verdict| match verdict {
            Verdict::Accepted { state } => Some(state.version),
            _ => None,
        })
        .collect();
    assert_eq!(versions, [1, 2, 3, 4, 5]);
    assert_eq!(
        verdicts[5..]
            .iter()
            .filter(|verdict| **verdict == Verdict::Full { limit: 5 })
            .count(),
        45,
        "every event past the limit is refused as full: {verdicts:?}"
    );
    let stored = key_state.clone().expect("the flight's record");
    assert_eq!(stored.accepted, 5);
    assert_eq!(stored.seen.len(), 5);
    assert!(stored.pending.len() <= 5);
    // A redelivery of an accepted event is still a duplicate, and an event behind the flight's
    // watermark still late: the limit refuses only what would have been applied.
    assert_eq!(
        decide_at(&mut key_state, &event("e3", EventType::Estimated, 3)),
        Verdict::Duplicate
    );
    assert!(matches!(
        decide_at(&mut key_state, &event("old", EventType::Estimated, -120)),
        Verdict::Late {
            reason: LateReason::Lateness,
            ..
        }
    ));
    assert_eq!(
        key_state,
        Some(stored),
        "refused events leave the record as it was"
    );
}
