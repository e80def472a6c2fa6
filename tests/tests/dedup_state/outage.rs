//! dedup-state under a broker outage: outputs held in flight, then delivered in input order.

use std::time::Duration;

use contrail_testkit::dedup::{
    DedupOptions, DedupTopics, produce_events, realistic_feed, replay_events, start_dedup_state,
};
use contrail_testkit::{create_topics, test_dir, unique};

use super::{first_appearances_out_of_order, read_all, verify};

/// docs/CONTRACT.md's "Guarantees across restarts" under a broker outage: the broker freezes
/// while dedup-state has outputs in flight. Consumption pauses at the unacknowledged-output bound,
/// nothing is committed past what the broker holds, and when it returns every output arrives — in
/// input order per topic partition, with the in-flight count back at exactly 0.
#[test]
fn a_broker_outage_holds_the_outputs_and_they_arrive_in_input_order() {
    use contrail_testkit::Broker;
    let broker = Broker::start().expect("own broker: this test freezes it");
    let topics = DedupTopics::unique();
    create_topics(&broker.address, &[&topics.raw], 2).expect("raw topic");
    let events = replay_events((1, 1), (1, 3), realistic_feed(17));
    let total = events.len();
    let dir = test_dir("dedup-outage");
    let group = unique("do");
    let mut stage = start_dedup_state(DedupOptions {
        extra_env: vec![("CONTRAIL_BATCH__MAX_UNACKNOWLEDGED".into(), "2000".into())],
        ..DedupOptions::single(&broker.address, &topics, &group, &dir)
    })
    .expect("dedup-state starts");
    let producer_brokers = broker.address.clone();
    let raw_topic = topics.raw.clone();
    let producer = std::thread::spawn(move || {
        for slice in events.chunks(2_000) {
            produce_events(&producer_brokers, &raw_topic, slice).expect("produce");
        }
    });
    let grpc = stage.grpc_url.clone();
    let token = stage.token.clone();
    let processed = |status: &contrail_proto::admin::v1::StatusResponse| {
        status.counters.get("records_total").copied().unwrap_or_default()
    };
    stage
        .process
        .wait_until("5,000 records processed", Duration::from_secs(120), || {
            Ok(match contrail_testkit::dedup::status_of(&grpc, &token) {
                Ok(status) if processed(&status) >= 5_000.0 => contrail_testkit::Probe::Ready(()),
                Ok(status) => contrail_testkit::Probe::NotYet(format!("{} processed", processed(&status))),
                Err(error) => contrail_testkit::Probe::NotYet(format!("{error:#}")),
            })
        })
        .expect("processing");
    broker.pause();
    // Records fetched before the outage are still processed until the outputs in flight reach
    // their bound: wait until the count stops moving (3 s unchanged), then it must stay put.
    let (mut last, mut unchanged_since) = (None, std::time::Instant::now());
    let during = stage
        .process
        .wait_until(
            "consumption to stop (3 s unchanged)",
            Duration::from_secs(60),
            || {
                let now = contrail_testkit::dedup::status_of(&grpc, &token)?;
                if last != Some(processed(&now)) {
                    last = Some(processed(&now));
                    unchanged_since = std::time::Instant::now();
                }
                Ok(if unchanged_since.elapsed() >= Duration::from_secs(3) {
                    contrail_testkit::Probe::Ready(now)
                } else {
                    contrail_testkit::Probe::NotYet(format!("{} processed", processed(&now)))
                })
            },
        )
        .expect("the admin API answers during the outage, and consumption stops");
    std::thread::sleep(Duration::from_secs(8));
    let later = stage.status().expect("status");
    println!(
        "during the outage: {} then {} records processed, {} then {} outputs in flight",
        processed(&during),
        processed(&later),
        during.in_flight,
        later.in_flight
    );
    assert_eq!(
        processed(&during),
        processed(&later),
        "consumption waits for the broker"
    );
    // Longer than the session timeout (6 s): the consumer may have lost its partitions (their
    // shards closed, the unacknowledged outputs kept in their outboxes for the next open).
    println!(
        "during the outage: {} shards owned, {} outputs in flight",
        later.partitions.len(),
        later.in_flight
    );
    assert!(
        stage.process.is_running(),
        "an outage is waited out:\n{}",
        stage.process.log_tail(20)
    );
    broker.resume();
    producer.join().expect("producer");
    stage
        .wait_caught_up(2, Duration::from_secs(300))
        .expect("caught up with nothing in flight");
    verify(&broker.address, &topics, total);
    let input_of_event = |payload: &[u8]| {
        use prost::Message as _;
        let event = contrail_proto::v1::OperationalEvent::decode(payload).ok()?;
        event.input.map(|input| (input.partition, input.offset))
    };
    let input_of_state = |payload: &[u8]| {
        use prost::Message as _;
        let state = contrail_proto::v1::FlightState::decode(payload).ok()?;
        state.input.map(|input| (input.partition, input.offset))
    };
    let everything = |topic: &str| {
        let ends =
            contrail_testkit::settled_ends(&broker.address, topic, Duration::from_secs(2)).expect(topic);
        read_all(&broker.address, topic, ends.values().sum::<i64>() as usize)
    };
    for (topic, problems) in [
        (
            &topics.accepted,
            first_appearances_out_of_order(&everything(&topics.accepted), input_of_event),
        ),
        (
            &topics.late,
            first_appearances_out_of_order(&everything(&topics.late), input_of_event),
        ),
        (
            &topics.curated,
            first_appearances_out_of_order(&everything(&topics.curated), input_of_state),
        ),
    ] {
        assert!(
            problems.is_empty(),
            "{topic}: {:?}",
            &problems[..problems.len().min(5)]
        );
    }
    stage.process.terminate(Duration::from_secs(30)).expect("stops");
}
