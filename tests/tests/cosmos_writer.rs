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
