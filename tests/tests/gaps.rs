//! No silent gap in dedup-state: a shard whose stored input offset is not in the input topic any
//! more (here: the topic deleted and created again, which the local broker can do; it cannot
//! delete records) stops that partition and says so — status, readiness, metric, ERROR log —
//! instead of failing the process or reading on as if nothing happened. dedup-state refuses to
//! accept a gap past the end of its input: the new topic's records would be taken for ones the
//! shard already processed.

use std::time::Duration;

use contrail_testkit::dedup::{
    DedupOptions, DedupTopics, produce_events, realistic_feed, replay_events, start_dedup_state,
};
use contrail_testkit::{
    cosmos::metric_at, create_topics, http_get, read_to_end_at_least, recreate_topics, shared_broker,
    test_dir, unique,
};

#[test]
fn dedup_state_holds_a_partition_whose_input_topic_was_re_created() {
    let broker = shared_broker();
    let dir = test_dir("dedup-gap");
    let topics = DedupTopics::unique();
    create_topics(&broker.address, &[&topics.raw], 1).expect("raw topic");
    let events = replay_events((3, 1), (3, 2), realistic_feed(5));
    assert!(events.len() >= 600, "{} events", events.len());
    let (before, after) = (&events[..400], &events[400..500]);
    let group = unique("g");
    let mut stage = start_dedup_state(DedupOptions {
        extra_env: vec![
            ("CONTRAIL_CHECKPOINT__INTERVAL_MS".to_owned(), "0".to_owned()),
            ("CONTRAIL_BATCH__THREADS".to_owned(), "1".to_owned()),
        ],
        ..DedupOptions::single(&broker.address, &topics, &group, &dir)
    })
    .expect("start");
    produce_events(&broker.address, &topics.raw, before).expect("produce to the first topic");
    stage
        .wait_caught_up(1, Duration::from_secs(120))
        .expect("the first topic processed");
    let old_end = stage.raw_ends().expect("raw ends")[&0];
    assert!(old_end >= 400, "the shard's offset {old_end}");
    let curated_before = read_to_end_at_least(&broker.address, &topics.curated, 1, Duration::from_secs(60))
        .expect("curated")
        .len();
    let exit = stage.process.terminate(Duration::from_secs(30)).expect("SIGTERM");
    assert!(exit.success(), "{exit:?}\n{}", stage.process.log());

    // The input topic is deleted and created again, and receives fewer records than the shard had
    // read: its offsets start again below the shard's.
    recreate_topics(&broker.address, &[&topics.raw], 1).expect("raw re-created");
    produce_events(&broker.address, &topics.raw, after).expect("produce to the new topic");
    stage.spawn_again().expect("dedup-state starts again");

    let grpc_url = stage.grpc_url.clone();
    let token = stage.token.clone();
    let gap = stage
        .process
        .wait_gap_held(Duration::from_secs(120), || {
            contrail_testkit::dedup::status_of(&grpc_url, &token)
        })
        .expect("gap reported");
    assert_eq!(
        (gap.topic.as_str(), gap.partition),
        (topics.raw.as_str(), 0),
        "{gap:?}"
    );
    // Past the end: the shard's offset is the old topic's end, the new topic starts at 0.
    let found = (gap.cause.as_str(), gap.stored_next, gap.log_start);
    assert_eq!(found, ("past-end", old_end, 0), "{gap:?}");
    assert!(
        stage.process.is_running(),
        "the process goes on:\n{}",
        stage.process.log()
    );
    let answer = http_get(&format!("{}/readyz", stage.http_url)).expect("GET /readyz");
    assert!(
        answer.starts_with("HTTP/1.1 503") && answer.contains("1 partition(s) held at a gap"),
        "not ready, saying why: {answer}"
    );
    assert_eq!(
        metric_at(
            &stage.http_url,
            "contrail_consumer_gap_held",
            &format!("topic=\"{}\"", topics.raw)
        ),
        1.0
    );
    assert!(
        stage
            .process
            .log()
            .contains("GAP: the position stored for this partition is not in the topic"),
        "an ERROR log names the gap:\n{}",
        stage.process.log()
    );

    // Accepting it is refused, and it stays held: nothing of the new topic is processed.
    let refusal = stage
        .accept_gap(&topics.raw, 0)
        .expect("admin call")
        .expect_err("a gap past the end is not accepted");
    assert_eq!(refusal.code(), tonic::Code::FailedPrecondition, "{refusal:?}");
    assert!(
        refusal.message().contains("re-created input topic"),
        "{}",
        refusal.message()
    );
    std::thread::sleep(Duration::from_secs(3));
    let status = stage.status().expect("status");
    assert_eq!(status.gaps.len(), 1, "still held: {:?}", status.gaps);
    let curated_after = read_to_end_at_least(&broker.address, &topics.curated, 1, Duration::from_secs(60))
        .expect("curated")
        .len();
    assert_eq!(
        curated_after, curated_before,
        "no record of the new topic was processed while the partition is held"
    );
    stage.process.terminate(Duration::from_secs(30)).expect("stop");
}
