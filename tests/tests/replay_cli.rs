//! `contrail replay` against a running ingest: every generated delivery lands on the raw topic, and
//! the feed matches an independent generation with the same seed.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use contrail_integration_tests::{
    IngestOptions, event_ids, read_topic, shared_broker, start_ingest, workspace_binary,
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
}
