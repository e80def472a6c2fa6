//! Held batches and commit points (docs/CONTRACT.md, "Guarantees across restarts"): dedup-state
//! keeps a shard's batches in memory and writes them only once the broker acknowledged their
//! outputs and the commit interval passed, with no outbox for them. A kill -9 in between loses the
//! held batches; the restart reprocesses them from the previous commit point and must regenerate
//! the very same bytes, which the oracle checks copy by copy.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use contrail_proto::v1::FlightState;
use contrail_testkit::dedup::{
    DedupOptions, DedupTopics, DedupUnderTest, produce_events, realistic_feed, replay_events,
    start_dedup_state,
};
use contrail_testkit::{Moments, create_topics, shared_broker, test_dir, unique};
use prost::Message;

use super::{read_all, verify};

/// A commit interval longer than most gaps between kills: nearly every kill lands after a batch's
/// outputs were produced (and acknowledged) and before its commit point.
const COMMIT_INTERVAL_MS: u64 = 2_500;

/// Records the running process has processed (its status counter; 0 until it does).
fn records_processed(stage: &DedupUnderTest) -> f64 {
    stage
        .status()
        .ok()
        .and_then(|status| status.counters.get("records_total").copied())
        .unwrap_or(0.0)
}

#[test]
fn kill_9_between_produce_and_commit_point_regenerates_byte_identical_outputs() {
    let broker = shared_broker();
    let topics = DedupTopics::unique();
    create_topics(&broker.address, &[&topics.raw], 2).expect("raw topic");
    // A week of January 2013 with 15 % redeliveries, disorder and stragglers.
    let events = replay_events((1, 1), (1, 7), realistic_feed(11));
    let total = events.len();
    let dir = test_dir("dedup-commit-points");
    let group = unique("g");
    let mut stage = start_dedup_state(DedupOptions {
        extra_env: vec![
            (
                "CONTRAIL_BATCH__COMMIT_INTERVAL_MS".into(),
                COMMIT_INTERVAL_MS.to_string(),
            ),
            ("CONTRAIL_BATCH__MAX_RECORDS".into(), "500".into()),
            ("CONTRAIL_GROUP__STATIC_MEMBERSHIP".into(), "true".into()),
        ],
        ..DedupOptions::single(&broker.address, &topics, &group, &dir)
    })
    .expect("dedup-state starts");

    let producer_brokers = broker.address.clone();
    let raw_topic = topics.raw.clone();
    let producer = std::thread::spawn(move || {
        // Slices for ≈ 100 s: the stream goes on through every kill and restart.
        for slice in events.chunks(500) {
            produce_events(&producer_brokers, &raw_topic, slice).expect("produce");
            std::thread::sleep(Duration::from_millis(1_000));
        }
    });
    let mut moments = Moments::from_clock();
    let started = Instant::now();
    let mut kills = 0;
    while kills < 10 {
        // Once this run processes records, a moment mostly inside the commit interval.
        let deadline = Instant::now() + Duration::from_secs(15);
        while records_processed(&stage) == 0.0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(moments.next_ms(200, 4_000)));
        stage.process.kill9();
        kills += 1;
        println!("kill {kills} at {:?}", started.elapsed());
        stage.restart().expect("restart after kill -9");
    }
    producer.join().expect("producer thread");
    stage
        .wait_caught_up(2, Duration::from_secs(300))
        .expect("caught up");

    // Every output against the oracle: one state per version and accepted event, copies
    // byte-identical, final states equal to the oracle's own fold.
    let (raw, accepted, duplicates, late) = verify(&broker.address, &topics, total);
    // The kills did land between produce and commit point: outputs were produced again.
    let curated = read_all(&broker.address, &topics.curated, accepted);
    let mut copies: BTreeMap<(String, u64), usize> = BTreeMap::new();
    for message in &curated {
        let state = FlightState::decode(rdkafka::Message::payload(message).unwrap_or_default())
            .expect("states decode");
        *copies.entry((state.flight_key, state.version)).or_default() += 1;
    }
    let regenerated = curated.len() - copies.len();
    println!(
        "{raw} events, {accepted} accepted, {duplicates} duplicates, {late} late; {kills} kills; \
         {regenerated} curated states produced again, identical"
    );
    assert!(
        regenerated > 0,
        "the kills fell between produce and commit point: states were regenerated"
    );
    let exit = stage
        .process
        .terminate(Duration::from_secs(30))
        .expect("graceful stop");
    assert!(exit.success(), "SIGTERM drains and exits 0: {exit:?}");
}
