//! `contrail replay` against a running ingest: every generated delivery lands on the raw topic, and
//! the feed matches an independent generation with the same seed.

use std::collections::{BTreeMap, BTreeSet};

use contrail_proto::v1::OperationalEvent;
use prost::Message as _;
use rdkafka::Message as _;
use std::process::Command;
use std::time::Duration;

use contrail_testkit::{IngestOptions, event_ids, read_topic, shared_broker, start_ingest, workspace_binary};

#[test]
fn replay_posts_one_day_of_real_flights_with_duplicates() {
    let ingest = start_ingest(IngestOptions {
        brokers: &shared_broker().address,
        extra_env: Vec::new(),
        dir: None,
        topic_prefix: None,
    })
    .expect("ingest starts");
    let output = Command::new(workspace_binary("contrail").expect("contrail binary"))
        .args([
            "replay",
            "--url",
            &ingest.http_url,
            "--from",
            "2013-03-05",
            "--to",
            "2013-03-05",
        ])
        .args([
            "--seed",
            "11",
            "--duplicate-rate",
            "0.2",
            // As the in-process generation below (stragglers change which deliveries repeat).
            "--straggler-rate",
            "0",
            "--concurrency",
            "3",
            "--batch-size",
            "400",
            "--gzip",
            "--quiet",
        ])
        .env("CONTRAIL_INGEST_TOKEN", &ingest.token)
        .output()
        .expect("run contrail replay");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "replay failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // Independently: the same generation in-process.
    let data_dir = contrail_flightdata::default_data_dir().expect("data");
    let day = chrono::NaiveDate::from_ymd_opt(2013, 3, 5);
    let data = contrail_flightdata::FlightData::load(&data_dir, day, day).expect("load");
    let config = contrail_flightdata::ReplayConfig {
        seed: 11,
        duplicate_rate: 0.2,
        ..Default::default()
    };
    let deliveries: Vec<_> = contrail_flightdata::ReplayStream::new(data, config).collect();
    let expected_ids: BTreeSet<String> = deliveries.iter().map(|d| d.event.event_id.clone()).collect();
    let duplicates = deliveries.len() - expected_ids.len();
    assert!(
        duplicates * 100 / deliveries.len() >= 15,
        "about 20 % duplicates: {duplicates} of {}",
        deliveries.len()
    );
    assert!(
        stdout.contains(&format!(
            "{} events sent, {} accepted",
            deliveries.len(),
            deliveries.len()
        )),
        "{stdout}"
    );

    let messages = read_topic(
        &shared_broker().address,
        &ingest.raw_topic,
        deliveries.len(),
        Duration::from_secs(60),
    )
    .expect("read");
    assert_eq!(
        messages.len(),
        deliveries.len(),
        "every delivery (duplicates included) is on the topic once"
    );
    let landed: BTreeSet<String> = event_ids(&messages).into_iter().collect();
    assert_eq!(landed, expected_ids);

    // With 3 requests in flight, each flight's events still arrive in the feed's order (the raw
    // topic is partitioned by flight key, so per-key topic order is ingest's receive order).
    let limits = contrail_events::Limits::default();
    let mut expected_order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for delivery in &deliveries {
        let event = contrail_events::validate_record(&delivery.event.to_json(), &limits, 0).expect("valid");
        expected_order
            .entry(event.flight_key)
            .or_default()
            .push(event.event_id);
    }
    let mut sorted = messages.clone();
    sorted.sort_by_key(|message| (message.partition(), message.offset()));
    let mut landed_order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for message in &sorted {
        let event = OperationalEvent::decode(message.payload().unwrap_or_default()).expect("event");
        landed_order
            .entry(event.flight_key)
            .or_default()
            .push(event.event_id);
    }
    assert_eq!(
        landed_order, expected_order,
        "every flight's events in the feed's arrival order"
    );
}
