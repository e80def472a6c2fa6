//! cosmos-writer as a real process against the real broker and the Cosmos DB dev endpoint (the
//! SDK's in-memory emulator behind HTTP), checked through the ordinary client from this process.

use std::time::Duration;

use contrail_testkit::cosmos::{
    CosmosDev, CosmosStage, contract_documents, contract_problems, curated_stream, produce_states, writer_env,
};
use contrail_testkit::dedup::{realistic_feed, replay_events};
use contrail_testkit::{Moments, create_topics, shared_broker, test_dir, unique};

#[test]
fn kill_9_and_replays_leave_every_flight_at_its_highest_version() {
    let broker = shared_broker();
    let dir = test_dir("cosmos-writer");
    let dev = CosmosDev::start(&dir).expect("cosmos-dev");
    let topic = format!("{}.ops.flights.curated", unique("w"));
    create_topics(&broker.address, &[&topic], 4).expect("topic");
    // Nine days of January 2013 → > 50,000 curated states (one per distinct accepted event).
    let events = replay_events((1, 1), (1, 9), realistic_feed(11));
    let states = curated_stream(&events);
    assert!(
        states.len() >= 50_000,
        "at least 50,000 records, got {}",
        states.len()
    );
    let expected = contract_documents(&events);
    println!("{} curated records for {} flights", states.len(), expected.len());

    let group = unique("cw");
    let mut stage = CosmosStage::start(
        "cosmos-writer",
        writer_env(&broker.address, &topic, &group, &dev),
        &dir,
    )
    .expect("cosmos-writer starts");
    let producer_brokers = broker.address.clone();
    let producer_topic = topic.clone();
    let slices: Vec<Vec<_>> = states.chunks(5_000).map(<[_]>::to_vec).collect();
    let producer = std::thread::spawn(move || {
        for slice in slices {
            produce_states(&producer_brokers, &producer_topic, &slice).expect("produce");
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    let mut moments = Moments::from_clock();
    for kill in 1..=6 {
        std::thread::sleep(Duration::from_millis(moments.next_ms(500, 3_000)));
        stage.restart_after_kill9().expect("restart after kill -9");
        println!("kill {kill} done");
    }
    producer.join().expect("producer");
    stage
        .wait_committed(&broker.address, &topic, states.len(), Duration::from_secs(300))
        .expect("caught up");
    let problems = contract_problems(&dev, &expected);
    assert!(
        problems.is_empty(),
        "{} problems after kills, e.g. {:?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );

    // The same stream again, newest first: a replay and maximal disorder. Nothing may move back.
    let written_before = stage.metric("contrail_cosmos_writer_documents_written_total", "");
    let mut reversed = states.clone();
    reversed.reverse();
    produce_states(&broker.address, &topic, &reversed).expect("replay");
    stage
        .wait_committed(
            &broker.address,
            &topic,
            2 * states.len(),
            Duration::from_secs(300),
        )
        .expect("caught up");
    let problems = contract_problems(&dev, &expected);
    assert!(
        problems.is_empty(),
        "{} problems after the replay, e.g. {:?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );
    let stale = stage.metric("contrail_cosmos_writer_stale_skipped_total", "");
    let coalesced = stage.metric("contrail_cosmos_writer_coalesced_total", "");
    let written_after = stage.metric("contrail_cosmos_writer_documents_written_total", "");
    println!("replay: stale {stale}, coalesced {coalesced}, written {written_before} → {written_after}");
    assert_eq!(
        written_after, written_before,
        "the replay must not write anything"
    );
    assert!(
        stale > 0.0 && coalesced > 0.0,
        "stale {stale}, coalesced {coalesced}"
    );
}

#[test]
fn injected_throttling_slows_writes_but_loses_nothing() {
    let broker = shared_broker();
    let dir = test_dir("cosmos-throttle");
    let dev = CosmosDev::start(&dir).expect("cosmos-dev");
    let topic = format!("{}.ops.flights.curated", unique("t"));
    create_topics(&broker.address, &[&topic], 4).expect("topic");
    let events = replay_events((1, 2), (1, 2), realistic_feed(5));
    let states = curated_stream(&events);
    let expected = contract_documents(&events);
    produce_states(&broker.address, &topic, &states).expect("produce");
    let mut env = writer_env(&broker.address, &topic, &unique("ct"), &dev);
    // The SDK's fault injection answers 10 % of requests with 429; the SDK itself does not retry
    // them here, so every one reaches the stage's own backoff.
    env.push((
        "CONTRAIL_COSMOS__FAULT_INJECTION__THROTTLE_PROBABILITY".to_owned(),
        "0.1".to_owned(),
    ));
    env.push(("CONTRAIL_COSMOS__SDK_THROTTLE_RETRIES".to_owned(), "0".to_owned()));
    let mut stage = CosmosStage::start("cosmos-writer", env, &dir).expect("cosmos-writer starts");
    stage
        .wait_committed(&broker.address, &topic, states.len(), Duration::from_secs(300))
        .expect("caught up");
    let throttled = stage.metric("contrail_cosmos_writer_retries_total", "cause=\"429\"");
    println!(
        "{} records, {} flights, {throttled} throttled requests retried",
        states.len(),
        expected.len()
    );
    assert!(
        throttled > 100.0,
        "throttling was injected: {throttled} retries of 429"
    );
    let problems = contract_problems(&dev, &expected);
    assert!(
        problems.is_empty(),
        "{} problems, e.g. {:?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );
}

/// Two writers, one document per flight: a flight states' deployment and a
/// predictions deployment (`input = "predictions"`) write the same documents at once — real
/// curated states of three June days, and the knock-on predictions of their rotations (the
/// testkit's, versions counting per flight, packed as the rotation processor packs them)
/// interleaved with them — the first of them before any state (they land in stub documents, which
/// the states replace), the rest often before their flight's document or between two of its
/// versions — while both are killed with `kill -9` in turn. Afterwards every flight's state fields are its highest version (the
/// contract check) and its prediction fields its highest prediction, checked against the
/// records themselves; a replay of all predictions, newest first, writes nothing.
#[test]
fn flight_states_and_predictions_compose_in_one_document_under_kill_9() {
    use contrail_testkit::cosmos::{produce_predictions, read_documents};
    use contrail_testkit::delta::HistoryStream;

    let broker = shared_broker();
    let dir = test_dir("cosmos-predictions");
    let dev = CosmosDev::start(&dir).expect("cosmos-dev");
    let curated = format!("{}.ops.flights.curated", unique("cs"));
    let predictions_topic = format!("{}.ops.flights.predictions", unique("cp"));
    create_topics(&broker.address, &[&curated, &predictions_topic], 4).expect("topics");
    let events = replay_events((6, 8), (6, 10), realistic_feed(19));
    let states = curated_stream(&events);
    // Versions as the rotation processor writes them: the state's version in the high half.
    let predictions: Vec<contrail_proto::v1::FlightPrediction> = HistoryStream::from_raw(&events)
        .predictions
        .into_iter()
        .map(|mut prediction| {
            prediction.version = (prediction.version << 32) | 1;
            prediction
        })
        .collect();
    let expected = contract_documents(&events);
    // The newest prediction of each flight, from the records alone.
    let mut newest: std::collections::BTreeMap<&str, &contrail_proto::v1::FlightPrediction> =
        Default::default();
    for prediction in &predictions {
        let entry = newest.entry(prediction.flight_key.as_str()).or_insert(prediction);
        if prediction.version > entry.version {
            *entry = prediction;
        }
    }
    println!(
        "{} states of {} flights, {} predictions of {} flights ({} knocked on)",
        states.len(),
        expected.len(),
        predictions.len(),
        newest.len(),
        newest.values().filter(|p| !p.knock_on_from.is_empty()).count()
    );
    assert!(newest.len() > 1_000 && newest.values().any(|p| !p.knock_on_from.is_empty()));

    let env = |topic: &str, input: &str, instance: &str| {
        let mut env = writer_env(&broker.address, topic, &unique("cg"), &dev);
        env.retain(|(key, _)| key != "CONTRAIL_INSTANCE");
        env.push(("CONTRAIL_INSTANCE".to_owned(), instance.to_owned()));
        env.push(("CONTRAIL_INPUT".to_owned(), input.to_owned()));
        env.push((
            "CONTRAIL_TOPICS__PREDICTIONS".to_owned(),
            predictions_topic.clone(),
        ));
        env
    };
    let state_slices: Vec<Vec<_>> = states.chunks(2_000).map(<[_]>::to_vec).collect();
    let per_slice = predictions.len().div_ceil(state_slices.len() + 1);
    let prediction_slices: Vec<Vec<_>> = predictions.chunks(per_slice.max(1)).map(<[_]>::to_vec).collect();
    let mut prediction_writer = CosmosStage::start(
        "cosmos-writer",
        env(&curated, "predictions", "cosmos-predictions-0"),
        &dir.join("predictions"),
    )
    .expect("the predictions' writer starts");
    // The first predictions before any state: they land in stub documents (version 0).
    produce_predictions(&broker.address, &predictions_topic, &prediction_slices[0]).expect("produce");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let containers = runtime.block_on(dev.containers()).expect("client");
    let probe = &prediction_slices[0][0];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let stub = runtime
            .block_on(contrail_testkit::cosmos::point_read(
                &containers,
                &probe.flight_key,
            ))
            .expect("point read");
        if stub
            .as_ref()
            .is_some_and(|stub| stub["version"] == 0 && stub["predictionVersion"].is_u64())
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no stub document of {} after 60 s: {stub:?}",
            probe.flight_key
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut state_writer = CosmosStage::start(
        "cosmos-writer",
        env(&curated, "flight_states", "cosmos-writer-0"),
        &dir.join("states"),
    )
    .expect("the flight states' writer starts");

    let brokers = broker.address.clone();
    let (states_topic, predicted_topic) = (curated.clone(), predictions_topic.clone());
    let producer = std::thread::spawn(move || {
        for (index, states) in state_slices.iter().enumerate() {
            // Predictions a slice ahead of the states: many arrive before their flight's document.
            if let Some(slice) = prediction_slices.get(index + 1) {
                produce_predictions(&brokers, &predicted_topic, slice).expect("produce predictions");
            }
            produce_states(&brokers, &states_topic, states).expect("produce states");
            std::thread::sleep(Duration::from_millis(300));
        }
        for slice in prediction_slices.iter().skip(state_slices.len() + 1) {
            produce_predictions(&brokers, &predicted_topic, slice).expect("produce predictions");
        }
    });
    let mut moments = Moments::from_clock();
    for kill in 1..=6 {
        std::thread::sleep(Duration::from_millis(moments.next_ms(500, 2_500)));
        let stage = if kill % 2 == 0 {
            &mut state_writer
        } else {
            &mut prediction_writer
        };
        stage.restart_after_kill9().expect("restart after kill -9");
        println!("kill {kill} done");
    }
    producer.join().expect("producer");
    state_writer
        .wait_committed(&broker.address, &curated, states.len(), Duration::from_secs(300))
        .expect("states written");
    prediction_writer
        .wait_committed(
            &broker.address,
            &predictions_topic,
            predictions.len(),
            Duration::from_secs(300),
        )
        .expect("predictions written");

    let problems = contract_problems(&dev, &expected);
    assert!(
        problems.is_empty(),
        "{} state problems, e.g. {:?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );
    let prediction_problems = || {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let documents = runtime.block_on(async {
            let containers = dev.containers().await.expect("client");
            read_documents(&containers, expected.keys())
                .await
                .expect("read documents")
        });
        let mut problems = Vec::new();
        for (key, document) in &documents {
            let Some(want) = newest.get(key.as_str()) else {
                if document.get("predictionVersion").is_some() {
                    problems.push(format!("{key}: a prediction without one sent"));
                }
                continue;
            };
            let at = |field: &str| {
                document[field]
                    .as_str()
                    .and_then(|text| chrono::DateTime::parse_from_rfc3339(text).ok())
                    .map(|time| time.timestamp_micros())
            };
            let got = (
                document["predictionVersion"].as_u64(),
                at("predictedOut"),
                at("predictedIn"),
                document["knockOnFrom"].as_str().unwrap_or_default(),
                document["knockOnDelayMinutes"].as_i64(),
            );
            let wanted = (
                Some(want.version),
                Some(want.predicted_out_us),
                want.predicted_in_us,
                want.knock_on_from.as_str(),
                Some(i64::from(want.delay_minutes)),
            );
            if got != wanted {
                problems.push(format!("{key}: got {got:?}, want {wanted:?}"));
            }
        }
        let missing = newest.keys().filter(|key| !documents.contains_key(**key)).count();
        if missing > 0 {
            problems.push(format!("{missing} predicted flights have no document"));
        }
        problems
    };
    let problems = prediction_problems();
    assert!(
        problems.is_empty(),
        "{} prediction problems, e.g. {:?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );

    // Every prediction again, newest first: all stale, nothing written, nothing moves back.
    let written_before = prediction_writer.metric("contrail_cosmos_writer_documents_written_total", "");
    let mut reversed = predictions.clone();
    reversed.reverse();
    produce_predictions(&broker.address, &predictions_topic, &reversed).expect("replay");
    prediction_writer
        .wait_committed(
            &broker.address,
            &predictions_topic,
            2 * predictions.len(),
            Duration::from_secs(300),
        )
        .expect("replay written");
    let written_after = prediction_writer.metric("contrail_cosmos_writer_documents_written_total", "");
    println!("predictions written {written_before} → {written_after} by the replay");
    assert_eq!(
        written_after, written_before,
        "the replay must not write anything"
    );
    let problems = prediction_problems();
    assert!(
        problems.is_empty(),
        "after the replay: {:?}",
        &problems[..problems.len().min(10)]
    );
    assert!(
        contract_problems(&dev, &expected).is_empty(),
        "the replay moved a state"
    );
    let dead = contrail_testkit::read_topic(
        &broker.address,
        &format!("{curated}.dlq"),
        0,
        Duration::from_secs(2),
    )
    .expect("the dead-letter topic");
    assert!(dead.is_empty(), "{} records dead-lettered", dead.len());
}
