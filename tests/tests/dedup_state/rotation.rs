//! The rotation processor as a deployment of its own, `kill -9`ed while flight states arrive.

use std::time::Duration;

use contrail_testkit::dedup::{DedupOptions, DedupTopics, realistic_feed, replay_events, start_dedup_state};
use contrail_testkit::{Moments, create_topics, shared_broker, test_dir, unique};

use super::read_all;

/// The second processor as a deployment of its own: dedup-state with
/// `processor = "rotation"` reads flight states keyed by tail number — five days of real flights
/// up to noon of the last, written at least once (every 50th record of each chunk sent twice, byte-identical, as a
/// restarted flight deployment does) — and is `kill -9`ed at random moments while they arrive.
/// Afterwards every flight's predictions on `ops.flights.predictions` count 1, 2, … without a gap
/// (in the version's low half)
/// (a version twice only as identical bytes), the last one is what `contrail_testkit::rotation`
/// expects from the states, and each flight's last KNOCK_ON_DELAY alert agrees with it.
#[test]
fn a_rotation_deployment_killed_9_predicts_every_flight_once_as_computed_independently() {
    use contrail_proto::v1::{Alert, AlertState, FlightPrediction};
    use contrail_testkit::rotation::{expected_predictions, has_rotation};
    use prost::Message as _;
    use rdkafka::Message as _;

    let broker = shared_broker();
    let topics = DedupTopics::unique();
    let predictions_topic = format!("{}.predictions", unique("p"));
    create_topics(&broker.address, &[&topics.raw], 4).expect("by-tail topic");
    // Five days of real flights, as known at noon in New York on the last (16:00 UTC, a stormy
    // day): the afternoon's flights have not left, so their predictions depend on their inbound.
    let cutoff_us = chrono::NaiveDate::from_ymd_opt(2013, 6, 10)
        .and_then(|day| day.and_hms_opt(16, 0, 0))
        .map(|time| time.and_utc().timestamp_micros())
        .expect("cutoff");
    let events: Vec<contrail_proto::v1::OperationalEvent> =
        replay_events((6, 6), (6, 10), realistic_feed(11))
            .into_iter()
            .filter(|event| event.event_time_us <= cutoff_us)
            .collect();
    let states: Vec<contrail_proto::v1::FlightState> = contrail_testkit::cosmos::curated_stream(&events)
        .into_iter()
        .filter(has_rotation)
        .collect();
    assert!(
        states.len() > 20_000,
        "five days of flight states with tails: {}",
        states.len()
    );
    let records: Vec<(String, Vec<u8>)> = states
        .iter()
        .map(|state| {
            (
                state.tail_number.clone().unwrap_or_default(),
                state.encode_to_vec(),
            )
        })
        .collect();
    let dir = test_dir("rotation-crash");
    let group = unique("g");
    let mut stage = start_dedup_state(DedupOptions {
        extra_env: vec![
            ("CONTRAIL_PROCESSOR".into(), "rotation".into()),
            ("CONTRAIL_TOPICS__PREDICTIONS".into(), predictions_topic.clone()),
            ("CONTRAIL_CHECKPOINT__INTERVAL_MS".into(), "700".into()),
            ("CONTRAIL_GROUP__STATIC_MEMBERSHIP".into(), "true".into()),
            ("CONTRAIL_BATCH__THREADS".into(), "2".into()),
        ],
        ..DedupOptions::single(&broker.address, &topics, &group, &dir)
    })
    .expect("dedup-state (rotation) starts");
    let producer_brokers = broker.address.clone();
    let input = topics.raw.clone();
    let producer = std::thread::spawn(move || {
        contrail_testkit::delta::produce_with_redeliveries(
            &producer_brokers,
            &input,
            &records,
            3_000,
            50,
            Duration::from_millis(300),
        )
        .expect("produce")
    });
    let mut moments = Moments::from_clock();
    for kill in 1..=6 {
        std::thread::sleep(Duration::from_millis(moments.next_ms(300, 2_000)));
        stage.process.kill9();
        println!("kill {kill}");
        stage.restart().expect("restart after kill -9");
    }
    let copies = producer.join().expect("producer thread");
    stage
        .wait_caught_up(4, Duration::from_secs(300))
        .expect("caught up");

    let mut by_flight: std::collections::BTreeMap<String, Vec<(u64, Vec<u8>)>> = Default::default();
    for message in read_all(&broker.address, &predictions_topic, 1) {
        let payload = message.payload().unwrap_or_default().to_vec();
        let prediction = FlightPrediction::decode(payload.as_slice()).expect("a FlightPrediction");
        assert_eq!(message.key(), Some(prediction.flight_key.as_bytes()));
        by_flight
            .entry(prediction.flight_key.clone())
            .or_default()
            .push((prediction.version, payload));
    }
    let mut last: std::collections::BTreeMap<String, FlightPrediction> = Default::default();
    let mut problems = Vec::new();
    for (key, versions) in &by_flight {
        let mut seen: std::collections::BTreeMap<u64, &Vec<u8>> = Default::default();
        for (version, payload) in versions {
            if let Some(first) = seen.insert(*version, payload)
                && first != payload
            {
                problems.push(format!("{key} version {version}: two different predictions"));
            }
        }
        // No tail changes here: one aircraft per flight, whose predictions count 1, 2, 3, … in
        // the low half of the version (the high half is the flight state's version).
        let counts: Vec<u64> = seen.keys().map(|version| version & 0xffff_ffff).collect();
        if counts != (1..=counts.len() as u64).collect::<Vec<_>>() {
            problems.push(format!("{key}: versions {:?}", seen.keys().collect::<Vec<_>>()));
        }
        let newest = seen.values().next_back().expect("a version");
        last.insert(
            key.clone(),
            FlightPrediction::decode(newest.as_slice()).expect("decodes"),
        );
    }
    let expected = expected_predictions(&states);
    for (key, want) in &expected {
        match last.get(key) {
            None => problems.push(format!("{key}: no prediction")),
            Some(got)
                if (
                    got.predicted_out_us,
                    got.predicted_in_us,
                    got.knock_on_from.as_str(),
                ) != (want.departure, want.arrival, want.cause.as_str()) =>
            {
                problems.push(format!("{key}: got {got:?}, want {want:?}"));
            }
            Some(_) => {}
        }
    }
    for (key, got) in &last {
        if !expected.contains_key(key) && !got.cancelled {
            problems.push(format!("{key}: predicted, neither flown nor cancelled"));
        }
    }
    // Alerts: each flight's last alert record says whether its last prediction raises one.
    let mut alerting: std::collections::BTreeMap<String, bool> = Default::default();
    for message in read_all(&broker.address, &topics.alerts, 0) {
        let alert = Alert::decode(message.payload().unwrap_or_default()).expect("an alert");
        let firing = alert.state() == AlertState::Firing;
        alerting.insert(alert.flight_key, firing);
    }
    for key in last.keys() {
        let wanted = expected.get(key).is_some_and(|want| want.alert);
        if alerting.get(key).copied().unwrap_or(false) != wanted {
            problems.push(format!(
                "{key}: alert state differs from the expectation ({wanted})"
            ));
        }
    }
    if !alerting.values().any(|firing| *firing) {
        problems.push("no knock-on raised an alert".to_owned());
    }
    let knocked_on = expected.values().filter(|want| !want.cause.is_empty()).count();
    println!(
        "{} states ({copies} sent twice), {} flights predicted, {knocked_on} delayed by their inbound, {} alerting",
        states.len(),
        last.len(),
        alerting.values().filter(|firing| **firing).count()
    );
    assert!(
        problems.is_empty(),
        "{} problems, e.g. {:?}",
        problems.len(),
        &problems[..problems.len().min(5)]
    );
    assert!(
        knocked_on >= 5,
        "the last day's real rotations knock on: {knocked_on}"
    );
    let exit = stage
        .process
        .terminate(Duration::from_secs(30))
        .expect("graceful stop");
    assert!(exit.success(), "SIGTERM drains and exits 0: {exit:?}");
}
