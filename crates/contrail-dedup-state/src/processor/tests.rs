//! Tests of the flight processor: fuzzed input, broken clocks, bounded state, alerts, upgrades.

use super::*;
use contrail_state::{EngineConfig, OutboxRecord, Shard};
use proptest::prelude::*;

fn topics() -> OutputTopics {
    OutputTopics::default()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Arbitrary bytes as key and payload, mixed with valid events and events from broken
    /// clocks: no panic, no error; every arbitrary record that is not a valid event of its key
    /// and every implausible event becomes exactly one dead letter naming its input position,
    /// and every valid event is accepted.
    #[test]
    fn arbitrary_input_never_fails_and_bad_records_become_dead_letters(
        records in prop::collection::vec(
            prop_oneof![
                (prop::collection::vec(1u8..=255, 1..12), prop::collection::vec(any::<u8>(), 0..64))
                    .prop_map(|(key, payload)| (key, payload, Kind::Arbitrary)),
                (1u32..50, 0i64..60).prop_map(|(flight, minute)| valid_record(flight, minute, 0)),
                (1u32..50, prop_oneof![Just(-1i64), Just(1)]).prop_map(|(flight, era)| valid_record(flight, 0, era)),
            ],
            1..20,
        )
    ) {
        let mut processor = FlightProcessor::new(Rules::default(), topics(), 0, None, 1_000_000);
        let inputs: Vec<(Vec<u8>, Vec<u8>)> =
            records.iter().map(|(key, payload, _)| (key.clone(), payload.clone())).collect();
        let outputs = test_support::one_batch(&inputs, &mut processor);
        let dead = test_support::dead_letters(&outputs, &topics().dlq);
        let arbitrary_invalid = records
            .iter()
            .filter(|(key, payload, kind)| {
                *kind == Kind::Arbitrary
                    && OperationalEvent::decode(payload.as_slice()).map_or(true, |event| {
                        event.event_id.is_empty() || event.flight_key.as_bytes() != key.as_slice()
                    })
            })
            .count();
        let implausible = records.iter().filter(|(_, _, kind)| *kind == Kind::Implausible).count();
        // Distinct valid events (a repeated flight and minute is a redelivery: a duplicate).
        let valid = records
            .iter()
            .filter(|(_, _, kind)| *kind == Kind::Valid)
            .map(|(key, payload, _)| (key.clone(), payload.clone()))
            .collect::<std::collections::HashSet<_>>()
            .len();
        prop_assert_eq!(dead.len(), arbitrary_invalid + implausible);
        let accepted = outputs.iter().filter(|output| output.topic == topics().accepted).count();
        prop_assert_eq!(accepted, valid, "every distinct valid event (all within one hour) is accepted");
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Arbitrary,
    Valid,
    Implausible,
}

/// 2013-01-01T00:00:00Z, by hand (15,706 days after the epoch).
const JAN_1_2013_US: i64 = 15_706 * 86_400_000_000;

/// A valid event of flight `UA{flight}` on 2013-01-01 at `minute` past 10:00 (era 0), or the
/// same flight's event stamped in 1971 (era -1) or 2099 (era 1): a broken clock.
fn valid_record(flight: u32, minute: i64, era: i64) -> (Vec<u8>, Vec<u8>, Kind) {
    let key = format!("UA{flight}-2013-01-01-EWR");
    let event_time_us = match era {
        0 => JAN_1_2013_US + (600 + minute) * 60_000_000,
        -1 => 31_536_000_000_000,   // 1971-01-01
        _ => 4_070_908_800_000_000, // 2099-01-01
    };
    let event = OperationalEvent {
        event_id: format!("e{flight}-{minute}-{era}"),
        r#type: contrail_proto::v1::EventType::Delayed as i32,
        event_time_us,
        flight_key: key.clone(),
        ..Default::default()
    };
    let kind = if era == 0 { Kind::Valid } else { Kind::Implausible };
    (key.into_bytes(), event.encode_to_vec(), kind)
}

fn record_of(event: &OperationalEvent) -> (Vec<u8>, Vec<u8>) {
    (event.flight_key.clone().into_bytes(), event.encode_to_vec())
}

fn flight_event(id: &str, key: &str, kind: contrail_proto::v1::EventType, time_us: i64) -> OperationalEvent {
    OperationalEvent {
        event_id: id.to_owned(),
        r#type: kind as i32,
        event_time_us: time_us,
        flight_key: key.to_owned(),
        ..Default::default()
    }
}

fn decoded<T: Message + Default>(outputs: &[OutboxRecord], topic: &str) -> Vec<T> {
    outputs
        .iter()
        .filter(|output| output.topic == topic)
        .map(|output| T::decode(output.payload.as_slice()).expect("decodes"))
        .collect()
}

/// One record from a clock in 2099 and one from 1971 between the events of two flights: both
/// are dead-lettered naming `event_time`, and neither moves the shard's watermark — the other
/// flights' events after them are all applied (versions 1, 2, 3).
#[test]
fn broken_clocks_are_dead_lettered_and_never_move_the_watermark() {
    use contrail_proto::v1::EventType;
    const HOUR: i64 = 3_600_000_000;
    let at = |hours: i64| JAN_1_2013_US + 10 * HOUR + hours * HOUR;
    let (a, b) = ("AA1-2013-01-01-JFK", "B61-2013-01-01-JFK");
    let events = [
        flight_event("a1", a, EventType::Scheduled, at(0)),
        flight_event("future", b, EventType::Out, 4_070_908_800_000_000),
        flight_event("past", b, EventType::Out, 31_536_000_000_000),
        flight_event("b1", b, EventType::Scheduled, at(0)),
        flight_event("a2", a, EventType::Out, at(2)),
        flight_event("b2", b, EventType::Out, at(3)),
        flight_event("a3", a, EventType::In, at(5)),
    ];
    let records: Vec<(Vec<u8>, Vec<u8>)> = events.iter().map(record_of).collect();
    let mut processor = FlightProcessor::new(Rules::default(), topics(), 0, None, 1_000_000);
    let outputs = test_support::one_batch(&records, &mut processor);
    let letters = test_support::dead_letters(&outputs, &topics().dlq);
    assert_eq!(letters.len(), 2);
    assert!(
        letters[0].reason.contains("\"future\"")
            && letters[0]
                .reason
                .contains("event_time: 2099-01-01T00:00:00Z is implausible"),
        "{}",
        letters[0].reason
    );
    assert!(
        letters[1]
            .reason
            .contains("event_time: 1971-01-01T00:00:00Z is implausible"),
        "{}",
        letters[1].reason
    );
    let versions: Vec<(String, u64)> = decoded::<FlightState>(&outputs, &topics().curated)
        .into_iter()
        .map(|state| (state.flight_key, state.version))
        .collect();
    let expected = [(a, 1), (b, 1), (a, 2), (b, 2), (a, 3)].map(|(key, version)| (key.to_owned(), version));
    assert_eq!(versions, expected);
    assert!(
        decoded::<OperationalEvent>(&outputs, &topics().late).is_empty(),
        "nothing late"
    );
}

/// The bound on how far ahead an event may be is the record's broker timestamp when it is
/// earlier than the processing clock: the verdict is the same on every reprocessing.
#[test]
fn the_reference_clock_is_the_record_timestamp_capped_by_the_processing_clock() {
    assert_eq!(reference_clock_us(Some(5), 9), 5);
    assert_eq!(
        reference_clock_us(Some(12), 9),
        9,
        "a timestamp ahead of the clock is not trusted"
    );
    assert_eq!(reference_clock_us(None, 9), 9);
    // An event 2 h after its record reached the topic, processed 10 h later: implausible.
    let written = JAN_1_2013_US + 36_000_000_000;
    let event = flight_event(
        "e",
        "UA1-2013-01-01-EWR",
        contrail_proto::v1::EventType::Out,
        written + 7_200_000_000,
    );
    let payload = event.encode_to_vec();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut shard = Shard::open(&dir.path().join("s"), 0).expect("open");
    let inputs = [InputRecord {
        key: event.flight_key.as_bytes(),
        payload: &payload,
        offset: 0,
        trace: None,
        timestamp_us: Some(written),
    }];
    let mut processor = FlightProcessor::new(Rules::default(), topics(), 0, None, 1_000_000)
        .with_clock(written + 36_000_000_000);
    let engine = EngineConfig {
        allowed_lateness_us: 3_600_000_000,
    };
    let result = shard
        .process_batch(&inputs, &mut processor, &engine, 0)
        .expect("batch");
    let outputs: Vec<OutboxRecord> = result.outputs.into_iter().map(|(_, output)| output).collect();
    assert_eq!(test_support::dead_letters(&outputs, &topics().dlq).len(), 1);
}

/// Thousands of DELAYED events on one flight: every one is applied (versions 1..n), the state
/// keeps 32 delay codes; and an event that would make the state larger than a broker message
/// is dead-lettered with the stored state unchanged, the next event applied as the next
/// version — no error, no crash loop.
#[test]
fn per_key_state_is_bounded_and_a_state_too_large_is_dead_lettered() {
    use contrail_proto::v1::{EventData, EventType};
    let key = "UA1545-2013-01-01-EWR";
    let delayed: Vec<OperationalEvent> = (0..2_000)
        .map(|n| OperationalEvent {
            data: Some(EventData {
                delay_minutes: Some(5),
                delay_code: Some(format!("{:02}", n % 100)),
                ..EventData::default()
            }),
            ..flight_event(
                &format!("d{n}"),
                key,
                EventType::Delayed,
                JAN_1_2013_US + n * 1_000_000,
            )
        })
        .collect();
    let records: Vec<(Vec<u8>, Vec<u8>)> = delayed.iter().map(record_of).collect();
    let mut processor = FlightProcessor::new(Rules::default(), topics(), 0, None, 1_000_000);
    let outputs = test_support::one_batch(&records, &mut processor);
    let states = decoded::<FlightState>(&outputs, &topics().curated);
    assert_eq!(states.len(), 2_000);
    assert!(
        states
            .iter()
            .zip(1..)
            .all(|(state, version)| state.version == version)
    );
    let last = states.last().expect("a state");
    assert_eq!(last.delay_codes.len(), 32);
    assert_eq!(last.delay_codes.last().map(String::as_str), Some("99"));

    // A broker limit of 16 KiB of headroom + 4,000 bytes: each record fits, but a state with
    // a 2,500-byte gate and then a 2,500-byte terminal does not.
    let small_limit = OUTPUT_HEADROOM_BYTES + 4_000;
    let gate = |id: &str, gate: Option<String>, terminal: Option<String>, second: i64| OperationalEvent {
        data: Some(EventData {
            gate,
            terminal,
            ..EventData::default()
        }),
        ..flight_event(
            id,
            key,
            EventType::GateAssigned,
            JAN_1_2013_US + second * 1_000_000,
        )
    };
    let big_gate = "G".repeat(2_500);
    let events = [
        gate("g1", Some("C71".to_owned()), None, 1),
        gate("big", Some(big_gate.clone()), None, 2),
        gate("huge", None, Some("T".repeat(2_500)), 3),
        gate("g2", Some("C72".to_owned()), None, 4),
    ];
    let records: Vec<(Vec<u8>, Vec<u8>)> = events.iter().map(record_of).collect();
    let mut processor = FlightProcessor::new(Rules::default(), topics(), 0, None, small_limit);
    let outputs = test_support::one_batch(&records, &mut processor);
    let letters = test_support::dead_letters(&outputs, &topics().dlq);
    assert_eq!(letters.len(), 1);
    assert!(
        letters[0].reason.contains("\"huge\"") && letters[0].reason.contains("state"),
        "{}",
        letters[0].reason
    );
    let states: Vec<(u64, Option<String>, Option<String>)> =
        decoded::<FlightState>(&outputs, &topics().curated)
            .into_iter()
            .map(|state| (state.version, state.gate, state.terminal))
            .collect();
    assert_eq!(
        states,
        [
            (1, Some("C71".to_owned()), None),
            (2, Some(big_gate), None),
            (3, Some("C72".to_owned()), None)
        ],
        "the huge event changed nothing; the next one is version 3"
    );
}

/// What versions before the dedup entries moved into the key state wrote: an engine dedup
/// entry per accepted event id.
struct EarlierVersion;

impl StatefulProcessor for EarlierVersion {
    fn handle_record(
        &mut self,
        context: &mut KeyContext<'_>,
        record: &InputRecord<'_>,
    ) -> Result<(), StateError> {
        let event = OperationalEvent::decode(record.payload).expect("event");
        context.observe_event_time(event.event_time_us);
        context.dedup_insert(
            event.event_id.as_bytes(),
            flight::dedup_expiry(&event, i64::MIN, &Rules::default()),
        );
        Ok(())
    }

    fn handle_timer(&mut self, _: &mut KeyContext<'_>, _: &Timer) -> Result<(), StateError> {
        Ok(())
    }
}

/// A shard written by an earlier version keeps its dedup entries in the engine's dedup family:
/// after an upgrade (a reopen), a redelivery of an event accepted then is still a duplicate,
/// and an event never seen is accepted.
#[test]
fn dedup_entries_of_an_earlier_version_still_count_after_an_upgrade() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s");
    let event = |id: &str, minute: i64| OperationalEvent {
        event_id: id.to_owned(),
        r#type: contrail_proto::v1::EventType::Scheduled as i32,
        event_time_us: 1_357_000_000_000_000 + minute * 60_000_000,
        flight_key: "UA1545-2013-01-01-EWR".to_owned(),
        ..Default::default()
    };
    let config = EngineConfig {
        allowed_lateness_us: 3_600_000_000,
    };
    let old = event("e1", 0).encode_to_vec();
    let key = b"UA1545-2013-01-01-EWR";
    {
        let mut shard = Shard::open(&path, 0).expect("open");
        let inputs = [InputRecord {
            key,
            payload: &old,
            offset: 0,
            trace: None,
            timestamp_us: None,
        }];
        shard
            .process_batch(&inputs, &mut EarlierVersion, &config, 0)
            .expect("batch");
    }
    let mut shard = Shard::open(&path, 0).expect("reopen after the upgrade");
    let new = event("e2", 1).encode_to_vec();
    let inputs = [
        InputRecord {
            key,
            payload: &old,
            offset: 1,
            trace: None,
            timestamp_us: None,
        },
        InputRecord {
            key,
            payload: &new,
            offset: 2,
            trace: None,
            timestamp_us: None,
        },
    ];
    let mut processor = FlightProcessor::new(Rules::default(), topics(), 0, None, 1_000_000);
    let result = shard
        .process_batch(&inputs, &mut processor, &config, 0)
        .expect("batch");
    let accepted: Vec<String> = result
        .outputs
        .iter()
        .filter(|(_, output)| output.topic == topics().accepted)
        .map(|(_, output)| {
            OperationalEvent::decode(output.payload.as_slice())
                .expect("event")
                .event_id
        })
        .collect();
    assert_eq!(accepted, ["e2"], "e1 was accepted by the earlier version");
}

#[test]
fn a_valid_event_is_accepted_and_a_redelivery_is_a_duplicate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut shard = Shard::open(&dir.path().join("s"), 0).expect("open");
    let event = OperationalEvent {
        event_id: "e1".to_owned(),
        r#type: contrail_proto::v1::EventType::Scheduled as i32,
        event_time_us: 1_357_000_000_000_000,
        flight_key: "UA1545-2013-01-01-EWR".to_owned(),
        ..Default::default()
    };
    let payload = event.encode_to_vec();
    let key = event.flight_key.as_bytes();
    let inputs = [
        InputRecord {
            key,
            payload: &payload,
            offset: 0,
            trace: None,
            timestamp_us: None,
        },
        InputRecord {
            key,
            payload: &payload,
            offset: 1,
            trace: None,
            timestamp_us: None,
        },
    ];
    let mut processor = FlightProcessor::new(Rules::default(), topics(), 0, None, 1_000_000);
    let result = shard
        .process_batch(
            &inputs,
            &mut processor,
            &EngineConfig {
                allowed_lateness_us: 3_600_000_000,
            },
            0,
        )
        .expect("batch");
    let by_topic: Vec<&str> = result
        .outputs
        .iter()
        .map(|(_, output)| output.topic.as_str())
        .collect();
    assert_eq!(
        by_topic,
        ["ops.flights.curated", "ops.events.accepted"],
        "one state and one accepted event"
    );
}

/// Two flights overdue after one record, then one departs (twice: a correction) and the other
/// is cancelled: each alert is raised once and resolved once, numbered by where in the input it
/// was emitted, and splitting the input into other batches changes no byte of any alert.
#[test]
fn overdue_alerts_resolve_once_and_carry_their_place_in_the_input() {
    use contrail_proto::v1::{EventData, EventType};
    const MINUTE: i64 = 60_000_000;
    let base = 1_357_020_000_000_000;
    let event = |id: &str, flight: &str, kind: EventType, minute: i64| OperationalEvent {
        event_id: id.to_owned(),
        r#type: kind as i32,
        event_time_us: base + minute * MINUTE,
        flight_key: flight.to_owned(),
        data: Some(EventData {
            scheduled_out_us: (kind == EventType::Scheduled).then_some(base + 60 * MINUTE),
            ..Default::default()
        }),
        ..Default::default()
    };
    let events = [
        event("a1", "AA1-2013-01-01-JFK", EventType::Scheduled, 0),
        event("b1", "B61-2013-01-01-JFK", EventType::Scheduled, 1),
        // Moves the watermark (max event time − 60 min) past both flights' scheduled out + 15.
        event("a2", "AA1-2013-01-01-JFK", EventType::Delayed, 140),
        event("a3", "AA1-2013-01-01-JFK", EventType::Out, 141),
        event("a4", "AA1-2013-01-01-JFK", EventType::Out, 142),
        event("b2", "B61-2013-01-01-JFK", EventType::Cancelled, 143),
    ];
    let payloads: Vec<Vec<u8>> = events.iter().map(|event| event.encode_to_vec()).collect();
    let inputs: Vec<InputRecord<'_>> = events
        .iter()
        .zip(&payloads)
        .enumerate()
        .map(|(offset, (event, payload))| InputRecord {
            key: event.flight_key.as_bytes(),
            payload,
            offset: 100 + offset as i64,
            trace: None,
            timestamp_us: None,
        })
        .collect();
    let config = EngineConfig {
        allowed_lateness_us: 60 * MINUTE,
    };
    let alerts_of = |splits: &[usize]| -> Vec<Vec<u8>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut shard = Shard::open(&dir.path().join("s"), 0).expect("open");
        let mut processor = FlightProcessor::new(Rules::default(), topics(), 0, None, 1_000_000);
        let mut alerts = Vec::new();
        let mut start = 0;
        for end in splits.iter().copied().chain([inputs.len()]) {
            let result = shard
                .process_batch(&inputs[start..end], &mut processor, &config, 0)
                .expect("batch");
            alerts.extend(
                result
                    .outputs
                    .into_iter()
                    .filter(|(_, output)| output.topic == topics().alerts)
                    .map(|(_, output)| output.payload),
            );
            start = end;
        }
        alerts
    };
    let alerts = alerts_of(&[]);
    let decoded: Vec<(String, AlertState, i64, i64, u32, String)> = alerts
        .iter()
        .map(|bytes| {
            let alert = Alert::decode(bytes.as_slice()).expect("an alert");
            assert_eq!(
                alert.alert_id,
                format!("{}/{DEPARTURE_OVERDUE}", alert.flight_key)
            );
            assert_eq!(alert.fired_at_us, base + 75 * MINUTE, "{alert:?}");
            (
                alert.flight_key.clone(),
                alert.state(),
                alert.resolved_at_us,
                alert.emitted_after_offset,
                alert.emitted_index,
                alert.resolution.clone(),
            )
        })
        .collect();
    assert_eq!(
        decoded,
        [
            (
                "AA1-2013-01-01-JFK".to_owned(),
                AlertState::Firing,
                0,
                102,
                0,
                String::new()
            ),
            (
                "B61-2013-01-01-JFK".to_owned(),
                AlertState::Firing,
                0,
                102,
                1,
                String::new()
            ),
            (
                "AA1-2013-01-01-JFK".to_owned(),
                AlertState::Resolved,
                base + 141 * MINUTE,
                103,
                0,
                "DEPARTED".to_owned()
            ),
            (
                "B61-2013-01-01-JFK".to_owned(),
                AlertState::Resolved,
                base + 143 * MINUTE,
                105,
                0,
                "CANCELLED".to_owned()
            ),
        ]
    );
    for splits in [&[1, 3, 4][..], &[3], &[2, 5]] {
        assert_eq!(alerts_of(splits), alerts, "batches split at {splits:?}");
    }
}
