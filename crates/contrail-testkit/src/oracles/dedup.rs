//! The oracle of dedup-state's outputs: what it must output for the records on the raw topic,
//! re-derived from the contract, and the check of what it did output against that.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use contrail_proto::v1::{FlightState, OperationalEvent, SourcePosition};
use prost::Message as _;
use rdkafka::message::{Message as _, OwnedMessage};

use crate::harness::dedup::feed::RawRecord;
use crate::oracles::fold::folded_state;

/// The contract's time rules for the oracle (docs/CONTRACT.md), µs.
pub struct OracleRules {
    /// Allowed lateness.
    pub lateness_us: i64,
    /// Dedup entry lifetime after the later of its event time and its flight's service date's end.
    pub dedup_ttl_us: i64,
    /// State lifetime after the later of a flight's service date's end and its newest event.
    pub state_ttl_us: i64,
    /// Most events a flight accepts in its life; later new ones are dead-lettered.
    pub max_events_per_flight: usize,
    /// How far an event time may be ahead of the receiving clock (the record's broker
    /// timestamp).
    pub max_clock_skew_us: i64,
}

const DAY_US: i64 = 86_400_000_000;

/// The start (00:00 UTC) of the service date in a flight key `{flight}-{YYYY-MM-DD}-{origin}`,
/// read with chrono's own date parser (independent of the stages' key parser).
fn service_date_start_us(flight_key: &str) -> Option<i64> {
    let date_text = flight_key.get(flight_key.len().checked_sub(14)?..flight_key.len() - 4)?;
    let date = chrono::NaiveDate::parse_from_str(date_text, "%Y-%m-%d").ok()?;
    Some(date.and_hms_opt(0, 0, 0)?.and_utc().timestamp_micros())
}

impl Default for OracleRules {
    fn default() -> Self {
        const HOUR: i64 = 3_600_000_000;
        OracleRules {
            lateness_us: HOUR,
            dedup_ttl_us: 72 * HOUR,
            state_ttl_us: 48 * HOUR,
            max_events_per_flight: 2_048,
            max_clock_skew_us: HOUR,
        }
    }
}

/// What dedup-state must output.
#[derive(Debug, Default)]
pub struct Expected {
    /// Per flight key, the accepted events in acceptance order with their positions.
    pub accepted: BTreeMap<String, Vec<(OperationalEvent, SourcePosition)>>,
    /// Positions of late events, with why they are late: `lateness` or `expired`.
    pub late: BTreeMap<(i32, i64), &'static str>,
    /// Positions of events outside their flight's plausible time window (later than the record's
    /// broker timestamp + the clock skew, more than 400 days before or 7 days after its date, or
    /// a key with no date): dead-lettered, never applied,
    /// never moving the watermark.
    pub implausible: BTreeSet<(i32, i64)>,
    /// Positions of new events of a flight that had accepted its maximum already: dead-lettered,
    /// never applied.
    pub full: BTreeSet<(i32, i64)>,
    /// Flights accepted again after their record was deleted (they would start again at version
    /// 1). The lifetime rule makes this impossible: a test asserts it stays empty.
    pub restarted: Vec<String>,
    /// Duplicates dropped.
    pub duplicates: usize,
    /// DEPARTURE_OVERDUE alerts: (flight key, fire time µs).
    pub alerts: BTreeSet<(String, i64)>,
    /// Their resolutions: (flight key, fire time µs, event time µs of the accepted event after
    /// which the flight has departed or is cancelled).
    pub resolutions: BTreeSet<(String, i64, i64)>,
}

impl Expected {
    /// Records on the alerts topic: raised plus resolved.
    pub fn alert_records(&self) -> usize {
        self.alerts.len() + self.resolutions.len()
    }
}

/// DEPARTURE_OVERDUE fires this long after the scheduled departure (docs/CONTRACT.md, "Timers").
const OVERDUE_AFTER_US: i64 = 15 * 60_000_000;

/// When a flight's overdue timer should be set, from the contract's rule: scheduled out + 15 min
/// while it has not departed, is not cancelled, and was not alerted.
fn overdue_at(state: &FlightState, alerted: bool) -> Option<i64> {
    if alerted || state.actual_out_us.is_some() || state.status == "CANCELLED" {
        return None;
    }
    state
        .scheduled_out_us
        .map(|scheduled| scheduled + OVERDUE_AFTER_US)
}

/// Computes the expectation from the raw records (any order; they are sorted by position).
pub fn expect(records: &[RawRecord], rules: OracleRules) -> Expected {
    let mut expected = Expected::default();
    let mut by_partition: BTreeMap<i32, Vec<&RawRecord>> = BTreeMap::new();
    for record in records {
        by_partition
            .entry(record.position.partition)
            .or_default()
            .push(record);
    }
    for (_, mut records) in by_partition {
        records.sort_by_key(|record| record.position.offset);
        let mut shard_max = i64::MIN;
        // key → (newest accepted event time, accepted so far)
        let mut keys: HashMap<&str, (i64, usize)> = HashMap::new();
        // (key, event id) → event time of the accepted copy
        let mut seen: HashMap<(&str, &str), i64> = HashMap::new();
        // key → overdue timer; keys already alerted.
        let mut timers: BTreeMap<String, i64> = BTreeMap::new();
        // key → when its alert fired; keys whose alert was resolved.
        let mut alerted: HashMap<String, i64> = HashMap::new();
        let mut resolved: std::collections::HashSet<String> = std::collections::HashSet::new();
        let record_ttl = rules.dedup_ttl_us.max(rules.state_ttl_us);
        for record in records {
            let event = &record.event;
            let time = event.event_time_us;
            let key = event.flight_key.as_str();
            let position = (record.position.partition, record.position.offset);
            // Plausible time: no later than the receiving clock + skew, and within its dates:
            // [date − 400 days, date + 8 days).
            if let Some(clock) = record.timestamp_us
                && time > clock.saturating_add(rules.max_clock_skew_us)
            {
                expected.implausible.insert(position);
                continue;
            }
            let Some(date_start) = service_date_start_us(key) else {
                expected.implausible.insert(position);
                continue;
            };
            if time < date_start - 400 * DAY_US || time >= date_start + 8 * DAY_US {
                expected.implausible.insert(position);
                continue;
            }
            let service_end = date_start + DAY_US;
            shard_max = shard_max.max(time);
            let watermark = shard_max - rules.lateness_us;
            'decide: {
                // The flight's record, while it is kept: until dedup_ttl after the later of its
                // date's end and its newest event.
                let kept = keys
                    .get(key)
                    .filter(|(newest, _)| (*newest).max(service_end) + record_ttl > watermark)
                    .copied();
                // The flight lives until state_ttl after the later of its date's end and its
                // newest accepted event (only the date's end when nothing is kept).
                let lives_until =
                    kept.map_or(service_end, |(newest, _)| newest.max(service_end)) + rules.state_ttl_us;
                // A redelivery of an id accepted for this flight, while the flight lives or its
                // entry does (dedup_ttl after the later of its time and the date's end).
                if kept.is_some()
                    && seen.get(&(key, event.event_id.as_str())).is_some_and(|at| {
                        lives_until > watermark || (*at).max(service_end) + rules.dedup_ttl_us > watermark
                    })
                {
                    expected.duplicates += 1;
                    break 'decide;
                }
                let reason = if lives_until <= watermark {
                    Some("expired")
                } else {
                    match kept {
                        Some((newest, _)) if time < newest - rules.lateness_us => Some("lateness"),
                        _ => None,
                    }
                };
                if let Some(reason) = reason {
                    expected.late.insert(position, reason);
                    break 'decide;
                }
                if kept.is_some_and(|(_, count)| count >= rules.max_events_per_flight) {
                    expected.full.insert(position);
                    break 'decide;
                }
                if kept.is_none() && keys.contains_key(key) {
                    expected.restarted.push(key.to_owned());
                    expected.accepted.remove(key);
                }
                let (newest, count) = kept.unwrap_or((i64::MIN, 0));
                keys.insert(key, (newest.max(time), count + 1));
                seen.insert((key, event.event_id.as_str()), time);
                let accepted = expected.accepted.entry(key.to_owned()).or_default();
                accepted.push((event.clone(), record.position.clone()));
                let state = expected_final_state(accepted);
                // An alert ends once its flight has left the gate or is cancelled.
                if let Some(fired) = alerted.get(key)
                    && !resolved.contains(key)
                    && (state.actual_out_us.is_some() || state.status == "CANCELLED")
                {
                    resolved.insert(key.to_owned());
                    expected.resolutions.insert((key.to_owned(), *fired, time));
                }
                match overdue_at(&state, alerted.contains_key(key)) {
                    Some(at) => timers.insert(key.to_owned(), at),
                    None => timers.remove(key),
                };
            }
            // Event-time timers fire once the shard watermark passes them.
            let due: Vec<(String, i64)> = timers
                .iter()
                .filter(|(_, at)| **at <= watermark)
                .map(|(key, at)| (key.clone(), *at))
                .collect();
            for (key, at) in due {
                timers.remove(&key);
                let state = expected_final_state(&expected.accepted[&key]);
                if overdue_at(&state, alerted.contains_key(&key)) == Some(at) {
                    alerted.insert(key.clone(), at);
                    expected.alerts.insert((key, at));
                }
            }
        }
    }
    expected
}

/// The identities the Delta tables `events`, `flight_states`, `late_events` and `alerts` must hold exactly
/// once, from the oracle, as `verify_delta.py` joins the identity columns.
pub fn delta_identities(expected: &Expected) -> BTreeMap<&'static str, Vec<String>> {
    let mut identities = BTreeMap::new();
    identities.insert(
        "events",
        expected
            .accepted
            .values()
            .flatten()
            .map(|(event, _)| format!("{}#{}", event.flight_key, event.event_id))
            .collect(),
    );
    identities.insert(
        "flight_states",
        expected
            .accepted
            .iter()
            .flat_map(|(key, accepted)| (1..=accepted.len()).map(move |version| format!("{key}#{version}")))
            .collect(),
    );
    identities.insert(
        "late_events",
        expected
            .late
            .keys()
            .map(|(partition, offset)| format!("{partition}#{offset}"))
            .collect(),
    );
    // `alerts`: (alert_id, state); the alert id is the flight key and the rule
    // (docs/CONTRACT.md, "Timers").
    identities.insert(
        "alerts",
        expected
            .alerts
            .iter()
            .map(|(key, _)| format!("{key}/DEPARTURE_OVERDUE#FIRING"))
            .chain(
                expected
                    .resolutions
                    .iter()
                    .map(|(key, _, _)| format!("{key}/DEPARTURE_OVERDUE#RESOLVED")),
            )
            .collect(),
    );
    identities
}

/// The final `FlightState` of a flight's accepted events: the fold in (event_time, event_id)
/// order, by the oracles' own model of it ([`folded_state`]).
pub fn expected_final_state(accepted: &[(OperationalEvent, SourcePosition)]) -> FlightState {
    let events: Vec<&OperationalEvent> = accepted.iter().map(|(event, _)| event).collect();
    let mut state = folded_state(&events);
    state.version = accepted.len() as u64;
    state.input = accepted.last().map(|(_, position)| position.clone());
    state
}

/// Checks dedup-state's outputs against the expectation; returns a list of violations (empty:
/// exactly-once held). `curated`, `accepted`, `late`: every message of those topics.
pub fn check_outputs(
    expected: &Expected,
    curated: &[OwnedMessage],
    accepted: &[OwnedMessage],
    late: &[OwnedMessage],
    alerts: &[OwnedMessage],
) -> Vec<String> {
    let mut problems = Vec::new();
    // Curated: every (key, version) once or as identical copies; versions 1..N; last = fold.
    let mut versions: BTreeMap<(String, u64), Vec<u8>> = BTreeMap::new();
    for message in curated {
        let payload = message.payload().unwrap_or_default().to_vec();
        let Ok(state) = FlightState::decode(payload.as_slice()) else {
            problems.push("undecodable FlightState on the curated topic".to_owned());
            continue;
        };
        let key = (state.flight_key.clone(), state.version);
        if let Some(existing) = versions.get(&key) {
            if *existing != payload {
                problems.push(format!("{} version {}: two different states", key.0, key.1));
            }
        } else {
            versions.insert(key, payload);
        }
    }
    let mut per_flight: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (key, version) in versions.keys() {
        per_flight.entry(key.as_str()).or_default().push(*version);
    }
    for (key, events) in &expected.accepted {
        let n = events.len() as u64;
        let got = per_flight.remove(key.as_str()).unwrap_or_default();
        if got != (1..=n).collect::<Vec<u64>>() {
            problems.push(format!("{key}: versions {got:?}, expected 1..={n}"));
            continue;
        }
        let last = FlightState::decode(versions[&(key.clone(), n)].as_slice()).expect("decoded above");
        let want = expected_final_state(events);
        if last != want {
            problems.push(format!(
                "{key}: final state differs\n  got  {last:?}\n  want {want:?}"
            ));
        }
    }
    for (key, got) in per_flight {
        problems.push(format!(
            "{key}: states {got:?} for a flight with no accepted event"
        ));
    }
    // Accepted: exactly the expected event ids per flight, copies identical.
    let mut accepted_ids: BTreeMap<(String, String), Vec<u8>> = BTreeMap::new();
    for message in accepted {
        let payload = message.payload().unwrap_or_default().to_vec();
        let event = OperationalEvent::decode(payload.as_slice()).expect("accepted events decode");
        let key = (event.flight_key.clone(), event.event_id.clone());
        if accepted_ids
            .get(&key)
            .is_some_and(|existing| *existing != payload)
        {
            problems.push(format!("accepted {key:?}: two different copies"));
        }
        accepted_ids.insert(key, payload);
    }
    let want_ids: BTreeSet<(String, String)> = expected
        .accepted
        .iter()
        .flat_map(|(key, events)| {
            events
                .iter()
                .map(move |(event, _)| (key.clone(), event.event_id.clone()))
        })
        .collect();
    let got_ids: BTreeSet<(String, String)> = accepted_ids.into_keys().collect();
    let missing: Vec<_> = want_ids.difference(&got_ids).take(5).collect();
    let extra: Vec<_> = got_ids.difference(&want_ids).take(5).collect();
    if !missing.is_empty() || !extra.is_empty() {
        problems.push(format!(
            "accepted events: {} missing (e.g. {missing:?}), {} unexpected (e.g. {extra:?})",
            want_ids.difference(&got_ids).count(),
            got_ids.difference(&want_ids).count()
        ));
    }
    // Late: exactly the expected positions, each with the expected reason.
    let got_late: BTreeMap<(i32, i64), String> = late
        .iter()
        .map(|message| {
            let event =
                OperationalEvent::decode(message.payload().unwrap_or_default()).expect("late events decode");
            let input = event.input.unwrap_or_default();
            ((input.partition, input.offset), event.late_reason)
        })
        .collect();
    let want_positions: BTreeSet<&(i32, i64)> = expected.late.keys().collect();
    let got_positions: BTreeSet<&(i32, i64)> = got_late.keys().collect();
    if got_positions != want_positions {
        problems.push(format!(
            "late events: {} expected, {} on the topic, {} missing, {} unexpected",
            want_positions.len(),
            got_positions.len(),
            want_positions.difference(&got_positions).count(),
            got_positions.difference(&want_positions).count()
        ));
    }
    let wrong_reasons: Vec<String> = expected
        .late
        .iter()
        .filter_map(|(position, want)| {
            let got = got_late.get(position)?;
            (got != want).then(|| format!("{position:?}: {got:?}, expected {want:?}"))
        })
        .collect();
    if !wrong_reasons.is_empty() {
        problems.push(format!(
            "{} late events with the wrong reason, e.g. {:?}",
            wrong_reasons.len(),
            &wrong_reasons[..wrong_reasons.len().min(3)]
        ));
    }
    // Alerts: exactly the expected (flight, fire time) pairs, raised and resolved.
    let (got_alerts, got_resolutions) = alerts_on_topic(alerts);
    if got_resolutions != expected.resolutions {
        problems.push(format!(
            "alert resolutions: {} expected, {} on the topic, {} missing (e.g. {:?}), {} unexpected (e.g. {:?})",
            expected.resolutions.len(),
            got_resolutions.len(),
            expected.resolutions.difference(&got_resolutions).count(),
            expected.resolutions.difference(&got_resolutions).next(),
            got_resolutions.difference(&expected.resolutions).count(),
            got_resolutions.difference(&expected.resolutions).next(),
        ));
    }
    if got_alerts != expected.alerts {
        problems.push(format!(
            "alerts: {} expected, {} on the topic, {} missing (e.g. {:?}), {} unexpected (e.g. {:?})",
            expected.alerts.len(),
            got_alerts.len(),
            expected.alerts.difference(&got_alerts).count(),
            expected.alerts.difference(&got_alerts).next(),
            got_alerts.difference(&expected.alerts).count(),
            got_alerts.difference(&expected.alerts).next(),
        ));
    }
    problems
}

/// The distinct alerts of records of the alerts topic, as [`Expected`] holds them: raised
/// `(flight key, fire time)` and resolved `(flight key, fire time, resolution event time)`.
#[allow(clippy::type_complexity)]
pub fn alerts_on_topic(messages: &[OwnedMessage]) -> (BTreeSet<(String, i64)>, BTreeSet<(String, i64, i64)>) {
    let mut raised = BTreeSet::new();
    let mut resolved = BTreeSet::new();
    for message in messages {
        let alert = contrail_proto::v1::Alert::decode(message.payload().unwrap_or_default())
            .expect("records of the alerts topic decode as Alert");
        match alert.state() {
            contrail_proto::v1::AlertState::Firing => {
                raised.insert((alert.flight_key, alert.fired_at_us));
            }
            contrail_proto::v1::AlertState::Resolved => {
                resolved.insert((alert.flight_key, alert.fired_at_us, alert.resolved_at_us));
            }
        }
    }
    (raised, resolved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use contrail_proto::v1::{EventType, FlightRef};
    use rdkafka::Timestamp;

    const MINUTE: i64 = 60_000_000;

    fn event(id: &str, event_type: EventType, minute: i64) -> OperationalEvent {
        OperationalEvent {
            event_id: id.to_owned(),
            source: "test".to_owned(),
            r#type: event_type as i32,
            event_time_us: 1_357_000_000_000_000 + minute * MINUTE,
            flight: Some(FlightRef {
                carrier: "UA".to_owned(),
                number: 1545,
                origin: "EWR".to_owned(),
                service_date: "2013-01-01".to_owned(),
            }),
            flight_key: "UA1545-2013-01-01-EWR".to_owned(),
            ..Default::default()
        }
    }

    fn raw(offset: i64, event: OperationalEvent) -> RawRecord {
        RawRecord {
            position: SourcePosition {
                topic: "raw".to_owned(),
                partition: 0,
                offset,
            },
            event,
            timestamp_us: None,
        }
    }

    fn message(payload: Vec<u8>) -> OwnedMessage {
        OwnedMessage::new(
            Some(payload),
            None,
            "out".to_owned(),
            Timestamp::NotAvailable,
            0,
            0,
            None,
        )
    }

    /// Outputs exactly as a correct dedup-state would write them.
    fn correct(
        expected: &Expected,
    ) -> (
        Vec<OwnedMessage>,
        Vec<OwnedMessage>,
        Vec<OwnedMessage>,
        Vec<RawRecord>,
    ) {
        let events = &expected.accepted["UA1545-2013-01-01-EWR"];
        let curated = (1..=events.len())
            .map(|n| message(expected_final_state(&events[..n]).encode_to_vec()))
            .collect();
        let accepted = events
            .iter()
            .map(|(event, position)| {
                let mut event = event.clone();
                event.input = Some(position.clone());
                message(event.encode_to_vec())
            })
            .collect();
        (curated, accepted, Vec::new(), Vec::new())
    }

    /// The oracle is only worth something if it fails on wrong outputs.
    #[test]
    fn the_oracle_accepts_correct_outputs_and_names_every_kind_of_violation() {
        let records = vec![
            raw(0, event("e1", EventType::Scheduled, 0)),
            raw(1, event("e3", EventType::Out, 30)),
            raw(2, event("e1", EventType::Scheduled, 0)), // duplicate
            raw(3, event("e2", EventType::GateAssigned, 10)), // out of order, within lateness
            raw(4, event("e4", EventType::Off, 200)),
            raw(5, event("e0", EventType::Estimated, 5)), // late: 195 min behind the newest
        ];
        let expected = expect(&records, OracleRules::default());
        assert_eq!(expected.duplicates, 1);
        assert_eq!(expected.late, [((0, 5), "lateness")].into());
        assert_eq!(expected.accepted["UA1545-2013-01-01-EWR"].len(), 4);

        let late_message = {
            let mut late = records[5].event.clone();
            late.input = Some(records[5].position.clone());
            late.late_reason = "lateness".to_owned();
            message(late.encode_to_vec())
        };
        let (curated, accepted, _, _) = correct(&expected);
        let late = vec![late_message.clone()];
        assert_eq!(
            check_outputs(&expected, &curated, &accepted, &late, &[]),
            Vec::<String>::new()
        );
        // Redelivered identical copies are fine.
        let doubled: Vec<OwnedMessage> = curated.iter().chain(curated.iter()).cloned().collect();
        assert!(check_outputs(&expected, &doubled, &accepted, &late, &[]).is_empty());

        let missing_version: Vec<OwnedMessage> = curated
            .iter()
            .enumerate()
            .filter(|(n, _)| *n != 1)
            .map(|(_, m)| m.clone())
            .collect();
        assert!(
            check_outputs(&expected, &missing_version, &accepted, &late, &[])[0]
                .contains("versions [1, 3, 4]")
        );
        let mut different = FlightState::decode(curated[3].payload().unwrap_or_default()).expect("state");
        different.gate = Some("X1".to_owned());
        let mut conflicting = curated.clone();
        conflicting.push(message(different.encode_to_vec()));
        assert!(
            check_outputs(&expected, &conflicting, &accepted, &late, &[])[0].contains("two different states")
        );
        let mut wrong_final = curated.clone();
        wrong_final[3] = message(different.encode_to_vec());
        assert!(
            check_outputs(&expected, &wrong_final, &accepted, &late, &[])[0].contains("final state differs")
        );
        assert!(check_outputs(&expected, &curated, &accepted[1..], &late, &[])[0].contains("1 missing"));
        assert!(check_outputs(&expected, &curated, &accepted, &[], &[])[0].contains("1 missing"));
        let unexpected_alert = contrail_proto::v1::Alert {
            flight_key: "UA1545-2013-01-01-EWR".to_owned(),
            fired_at_us: 42,
            ..Default::default()
        };
        let alerts = [message(unexpected_alert.encode_to_vec())];
        assert!(check_outputs(&expected, &curated, &accepted, &late, &alerts)[0].contains("1 unexpected"));
        let mut wrong_reason = records[5].event.clone();
        wrong_reason.input = Some(records[5].position.clone());
        wrong_reason.late_reason = "expired".to_owned();
        assert!(
            check_outputs(
                &expected,
                &curated,
                &accepted,
                &[message(wrong_reason.encode_to_vec())],
                &[]
            )[0]
            .contains("wrong reason")
        );
    }

    /// The lifetime rule written out: a flight of 2013-01-01 (its date ends 2013-01-02T00:00Z, so
    /// it lives until 2013-01-04T00:00Z), then another flight's events until the shard watermark
    /// passes that, then a correction for the first flight — late (expired), its versions
    /// unchanged. A flight never seen of the same date is expired too; one of a later date (a
    /// schedule published ahead) is accepted; events outside the plausible window are not applied.
    #[test]
    fn the_oracle_expires_flights_by_their_date_and_never_restarts_them() {
        // The test events start at 2013-01-01T00:26:40Z (1,357,000,000 s).
        let other = |n: i64, minute: i64| {
            let mut event = event(&format!("o{n}"), EventType::Estimated, minute);
            event.flight_key = "DL1-2013-01-03-JFK".to_owned();
            event
        };
        let mut records = vec![
            raw(0, event("e1", EventType::Scheduled, 0)),
            raw(1, event("e2", EventType::Out, 30)),
        ];
        // Until 2013-01-04T00:56:40Z: the watermark (1 h behind) is just before the first flight's
        // horizon.
        for hour in 1..=72 {
            records.push(raw(records.len() as i64, other(hour, 30 + hour * 60)));
        }
        let before = records.len() as i64;
        // A correction stamped before the date's end (so it does not move the horizon).
        records.push(raw(before, event("e3", EventType::Delayed, 60)));
        let expected = expect(&records, OracleRules::default());
        assert_eq!(
            expected.late.get(&(0, before)),
            None,
            "watermark 2013-01-03T23:56:40Z: the flight still lives"
        );
        // One more hour: the watermark (2013-01-04T00:56:40Z) is past the horizon.
        records.push(raw(before + 1, other(73, 30 + 73 * 60)));
        let correction = before + 2;
        records.push(raw(correction, event("e4", EventType::Delayed, 30 + 73 * 60)));
        let expected = expect(&records, OracleRules::default());
        assert_eq!(expected.late.get(&(0, correction)), Some(&"expired"));
        assert_eq!(
            expected.accepted["UA1545-2013-01-01-EWR"].len(),
            3,
            "versions 1 to 3 only"
        );
        assert!(expected.restarted.is_empty());
        let mut never_seen = event("a1", EventType::Scheduled, 30 + 73 * 60);
        never_seen.flight_key = "AA9-2013-01-01-LGA".to_owned();
        let mut ahead = event("b1", EventType::Scheduled, 30 + 73 * 60);
        ahead.flight_key = "B61-2013-12-01-JFK".to_owned();
        let mut too_far_ahead = event("b2", EventType::Scheduled, 30 + 73 * 60);
        too_far_ahead.flight_key = "B61-2014-02-10-JFK".to_owned();
        let mut after_the_week = event("c1", EventType::Out, 30 + 73 * 60);
        after_the_week.flight_key = "AA9-2012-12-27-LGA".to_owned();
        for (offset, event) in [never_seen, ahead, too_far_ahead, after_the_week]
            .into_iter()
            .enumerate()
        {
            records.push(raw(correction + 1 + offset as i64, event));
        }
        let expected = expect(&records, OracleRules::default());
        assert_eq!(expected.late.get(&(0, correction + 1)), Some(&"expired"));
        assert_eq!(expected.accepted["B61-2013-12-01-JFK"].len(), 1);
        assert_eq!(
            expected.implausible,
            [(0, correction + 3), (0, correction + 4)].into(),
            "more than 400 days before its date, and 8 days after it"
        );
    }
}
