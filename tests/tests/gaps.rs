//! No silent gap. dedup-state: a shard whose stored input offset is not in the input topic any
//! more (here: the topic deleted and created again, which the local broker can do; it cannot
//! delete records) stops that partition and says so — status, readiness, metric, ERROR log —
//! instead of failing the process or reading on as if nothing happened. dedup-state refuses to
//! accept a gap past the end of its input: the new topic's records would be taken for ones the
//! shard already processed. cosmos-writer: a committed offset the topic does not have holds the
//! partition the same way until an operator accepts the gap, then the new records are written.

use std::time::Duration;

use contrail_testkit::cosmos::{
    CosmosDev, CosmosStage, contract_documents, contract_problems, curated_stream, produce_states, writer_env,
};
use contrail_testkit::dedup::{
    DedupOptions, DedupTopics, produce_events, realistic_feed, replay_events, start_dedup_state,
};
use contrail_testkit::{
    answers_200, commit_group_offsets, cosmos::metric_at, create_topics, http_get, read_to_end_at_least,
    recreate_topics, shared_broker, test_dir, unique,
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

/// cosmos-writer keeps its position only as the consumer group's committed offsets, and the broker
/// drops those with a deleted topic; on Event Hubs the position outlives the records it points
/// at when retention deletes them. Made here by committing, for the re-created topic, the offset
/// the writer had reached on the old one (an offset the new topic does not have): the partition
/// is held, reported, nothing of the new topic is written, and after `contrail admin accept-gap`
/// the new topic is written from its first offset, every flight exactly as the contract says.
#[test]
fn cosmos_writer_holds_a_partition_whose_committed_offset_the_topic_does_not_have() {
    let broker = shared_broker();
    let dir = test_dir("cosmos-gap");
    let dev = CosmosDev::start(&dir).expect("cosmos-dev");
    let topic = format!("{}.ops.flights.curated", unique("wg"));
    create_topics(&broker.address, &[&topic], 1).expect("topic");
    let events = replay_events((2, 1), (2, 1), realistic_feed(3));
    let mut flights: Vec<&str> = events.iter().map(|event| event.flight_key.as_str()).collect();
    flights.sort_unstable();
    flights.dedup();
    // Two disjoint sets of flights: the old topic's, and a smaller set for the new topic.
    let old_flights: std::collections::BTreeSet<&str> = flights.iter().step_by(2).copied().collect();
    let new_flights: std::collections::BTreeSet<&str> = flights.iter().skip(1).step_by(8).copied().collect();
    let of = |set: &std::collections::BTreeSet<&str>| -> Vec<_> {
        events
            .iter()
            .filter(|event| set.contains(event.flight_key.as_str()))
            .cloned()
            .collect()
    };
    let (old_events, new_events) = (of(&old_flights), of(&new_flights));
    let (old_states, new_states) = (curated_stream(&old_events), curated_stream(&new_events));
    assert!(
        new_states.len() >= 100 && new_states.len() < old_states.len(),
        "{} old and {} new records",
        old_states.len(),
        new_states.len()
    );

    let group = unique("cwg");
    let mut env = writer_env(&broker.address, &topic, &group, &dev);
    // A member that leaves on SIGTERM: the group is empty when the offset is committed from outside.
    env.retain(|(key, _)| key != "CONTRAIL_GROUP__STATIC_MEMBERSHIP");
    env.push(("CONTRAIL_GROUP__STATIC_MEMBERSHIP".to_owned(), "false".to_owned()));
    let mut stage = CosmosStage::start("cosmos-writer", env, &dir).expect("cosmos-writer starts");
    produce_states(&broker.address, &topic, &old_states).expect("produce to the old topic");
    stage
        .wait_committed(
            &broker.address,
            &topic,
            old_states.len(),
            Duration::from_secs(120),
        )
        .expect("the old topic written");
    let old_end = old_states.len() as i64;
    let exit = stage.process.terminate(Duration::from_secs(30)).expect("SIGTERM");
    assert!(exit.success(), "{exit:?}\n{}", stage.log_text());

    recreate_topics(&broker.address, &[&topic], 1).expect("topic re-created");
    commit_group_offsets(&broker.address, &group, &topic, &[(0, old_end)]).expect("the old position stored");
    produce_states(&broker.address, &topic, &new_states).expect("produce to the new topic");
    stage.start_again().expect("cosmos-writer starts again");

    let gap = stage
        .wait_gap_reported(&topic)
        .expect("the gap held and reported: status, readiness, metric, ERROR log");
    assert_eq!(
        (
            gap.topic.as_str(),
            gap.partition,
            gap.cause.as_str(),
            gap.stored_next,
            gap.log_start
        ),
        (topic.as_str(), 0, "past-end", old_end, 0),
        "{gap:?}"
    );
    let readyz = format!("{}/readyz", stage.http_url);
    // Nothing of the new topic is written while the partition is held: the container holds the
    // old flights exactly, and no other document.
    let problems = contract_problems(&dev, &contract_documents(&old_events));
    assert!(
        problems.is_empty(),
        "while held: {:?}",
        &problems[..problems.len().min(10)]
    );

    stage
        .accept_gap_with_cli(&topic, 0)
        .expect("contrail admin accept-gap accepts the gap");
    stage
        .wait_committed(
            &broker.address,
            &topic,
            new_states.len(),
            Duration::from_secs(120),
        )
        .expect("the new topic written after the gap was accepted");
    stage
        .process
        .wait_until("ready again", Duration::from_secs(30), || {
            Ok(answers_200(&readyz))
        })
        .expect("ready again");
    assert_eq!(stage.metric("contrail_consumer_gap_held", ""), 0.0, "no gap held");
    assert!(stage.status().expect("status").gaps.is_empty());
    let mut every_event = old_events;
    every_event.extend(new_events);
    let problems = contract_problems(&dev, &contract_documents(&every_event));
    assert!(
        problems.is_empty(),
        "after the accept: {:?}",
        &problems[..problems.len().min(10)]
    );

    // A restart finds the accepted position committed, not the gap again.
    stage.process.terminate(Duration::from_secs(30)).expect("SIGTERM");
    stage.start_again().expect("cosmos-writer starts once more");
    stage
        .process
        .wait_until("ready after the restart", Duration::from_secs(60), || {
            Ok(answers_200(&readyz))
        })
        .expect("ready after the restart, no gap");
    assert!(stage.status().expect("status").gaps.is_empty());
    stage.process.terminate(Duration::from_secs(30)).expect("SIGTERM");
}
