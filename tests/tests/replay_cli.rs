//! `contrail replay` against a running ingest: every generated delivery lands on the raw topic, and
//! the feed matches an independent generation with the same seed.

use std::collections::{BTreeMap, BTreeSet};

use contrail_proto::v1::OperationalEvent;
use prost::Message as _;
use rdkafka::Message as _;
use std::process::Command;
use std::time::Duration;

use contrail_testkit::{
    IngestOptions, event_ids, read_to_end, read_topic, shared_broker, start_ingest, test_dir,
    workspace_binary,
};

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
    let messages = all_accepted_and_on_the_topic(&stdout, &ingest.raw_topic, deliveries.len());
    let landed: BTreeSet<String> = event_ids(&messages).into_iter().collect();
    assert_eq!(landed, expected_ids);

    // With 3 requests in flight, each flight's events still arrive in the feed's order (the raw
    // topic is partitioned by flight key, so per-key topic order is ingest's receive order).
    let sent: Vec<serde_json::Value> = deliveries
        .iter()
        .map(|delivery| delivery.event.to_json())
        .collect();
    assert_eq!(
        landed_order(&messages),
        order_by_flight(&sent),
        "every flight's events in the feed's arrival order"
    );
}

/// Checks that the replay's output reports all `sent` deliveries accepted and none rejected, and
/// that `topic` holds each of them once (duplicates included); returns the records.
fn all_accepted_and_on_the_topic(
    stdout: &str,
    topic: &str,
    sent: usize,
) -> Vec<rdkafka::message::OwnedMessage> {
    assert!(
        stdout.contains(&format!("{sent} events sent, {sent} accepted, 0 rejected")),
        "{stdout}"
    );
    let messages = read_topic(&shared_broker().address, topic, sent, Duration::from_secs(60)).expect("read");
    assert_eq!(
        messages.len(),
        sent,
        "every delivery (duplicates included) is on the topic once"
    );
    messages
}

/// Each flight's event ids in the order the raw topic holds them (per partition, by offset).
fn landed_order(messages: &[rdkafka::message::OwnedMessage]) -> BTreeMap<String, Vec<String>> {
    let mut sorted: Vec<&rdkafka::message::OwnedMessage> = messages.iter().collect();
    sorted.sort_by_key(|message| (message.partition(), message.offset()));
    let mut landed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for message in sorted {
        let event = OperationalEvent::decode(message.payload().unwrap_or_default()).expect("event");
        landed.entry(event.flight_key).or_default().push(event.event_id);
    }
    landed
}

/// Each flight's event ids in the order of `events` (the ingest format).
fn order_by_flight(events: &[serde_json::Value]) -> BTreeMap<String, Vec<String>> {
    let limits = contrail_events::Limits::default();
    let mut order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for event in events {
        let event = contrail_events::validate_record(event, &limits, 0).expect("valid");
        order.entry(event.flight_key).or_default().push(event.event_id);
    }
    order
}

#[test]
fn replay_posts_a_recorded_gzip_feed_in_its_order_and_refuses_a_broken_one_naming_the_line() {
    use std::io::Write as _;
    let dir = test_dir("replay-input");
    let contrail = workspace_binary("contrail").expect("contrail binary");
    // A recorded feed: a day's deliveries (duplicates, disorder) as NDJSON, then gzip-compressed
    // under a name that does not say so.
    let ndjson = dir.join("feed.ndjson");
    let written = Command::new(&contrail)
        .args([
            "replay",
            "--from",
            "2013-04-02",
            "--to",
            "2013-04-02",
            "--seed",
            "5",
            "--quiet",
        ])
        .arg("--output")
        .arg(&ndjson)
        .output()
        .expect("write the feed");
    assert!(
        written.status.success(),
        "{}",
        String::from_utf8_lossy(&written.stderr)
    );
    let text = std::fs::read_to_string(&ndjson).expect("feed");
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("json line"))
        .collect();
    assert!(events.len() > 2_000, "a day of deliveries: {}", events.len());
    let feed = dir.join("feed.json");
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(text.as_bytes()).expect("compress");
    std::fs::write(&feed, encoder.finish().expect("finish")).expect("write");

    let ingest = start_ingest(IngestOptions {
        brokers: &shared_broker().address,
        extra_env: Vec::new(),
        dir: None,
        topic_prefix: None,
    })
    .expect("ingest starts");
    let output = Command::new(&contrail)
        .args([
            "replay",
            "--url",
            &ingest.http_url,
            "--concurrency",
            "3",
            "--batch-size",
            "300",
            "--quiet",
        ])
        .arg("--input")
        .arg(&feed)
        .env("CONTRAIL_INGEST_TOKEN", &ingest.token)
        .output()
        .expect("run contrail replay --input");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "replay failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let messages = all_accepted_and_on_the_topic(&stdout, &ingest.raw_topic, events.len());
    assert_eq!(
        landed_order(&messages),
        order_by_flight(&events),
        "every flight's events in the file's order"
    );

    // Not an event on line 3 (of stdin): nothing is posted, and the message says where.
    let mut child = Command::new(&contrail)
        .args(["replay", "--url", &ingest.http_url, "--quiet", "--input", "-"])
        .env("CONTRAIL_INGEST_TOKEN", &ingest.token)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let first = serde_json::to_string(&events[0]).expect("json");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{first}\n\n\"flight\"\n").as_bytes())
        .expect("write stdin");
    let refused = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a broken feed fails");
    assert!(
        stderr.contains("stdin line 3: a string is not an event"),
        "{stderr}"
    );
    let after = read_to_end(
        &shared_broker().address,
        &ingest.raw_topic,
        Duration::from_secs(60),
    )
    .expect("read");
    assert_eq!(after.len(), events.len(), "nothing of the broken feed was posted");
    let _ = std::fs::remove_dir_all(&dir);
}
