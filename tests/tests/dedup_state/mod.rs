//! dedup-state as a real process against the real broker: `kill -9` at random moments (also during
//! checkpoint uploads), restore of a lost shard directory from the checkpoint store, and rescale
//! (an instance leaves, the other takes its shards). Every test checks the outputs against the
//! oracle of `contrail_testkit::dedup`, computed from the raw topic's records.

use std::path::Path;
use std::time::{Duration, Instant};

use contrail_flightdata::ReplayConfig;
use contrail_testkit::dedup::{
    DedupOptions, DedupTopics, DedupUnderTest, OracleRules, check_outputs, expect, produce_events,
    raw_records, realistic_feed, replay_events, start_dedup_state,
};
use contrail_testkit::{Moments, create_topics, read_to_end_at_least, shared_broker, test_dir, unique};
use rdkafka::message::OwnedMessage;

mod commit_points;
mod outage;
mod rotation;

/// Every record of `topic` (the stage is caught up: up to each partition's true end, whatever
/// copies it holds — reading until a count could stop before a partition's tail); at least
/// `at_least`.
fn read_all(brokers: &str, topic: &str, at_least: usize) -> Vec<OwnedMessage> {
    let messages =
        read_to_end_at_least(brokers, topic, at_least, Duration::from_secs(120)).expect("read topic");
    assert!(
        messages.len() >= at_least,
        "{topic}: {} records, expected at least {at_least}",
        messages.len()
    );
    messages
}

/// Reads the raw topic and the outputs and checks them against the oracle; panics with the
/// violations. Returns (raw records, accepted events, duplicates, late events).
pub(crate) fn verify(brokers: &str, topics: &DedupTopics, raw_count: usize) -> (usize, usize, usize, usize) {
    let raw = raw_records(&read_all(brokers, &topics.raw, raw_count));
    assert_eq!(raw.len(), raw_count, "every produced event is on the raw topic");
    let expected = expect(&raw, OracleRules::default());
    let accepted_count: usize = expected.accepted.values().map(Vec::len).sum();
    let curated = read_all(brokers, &topics.curated, accepted_count);
    let accepted = read_all(brokers, &topics.accepted, accepted_count);
    let late = read_all(brokers, &topics.late, expected.late.len());
    let alerts = read_all(brokers, &topics.alerts, expected.alert_records());
    let problems = check_outputs(&expected, &curated, &accepted, &late, &alerts);
    println!(
        "{} DEPARTURE_OVERDUE alerts and {} resolutions expected and found",
        expected.alerts.len(),
        expected.resolutions.len()
    );
    assert!(
        problems.is_empty(),
        "{} violations of exactly-once (first 10):\n{}",
        problems.len(),
        problems.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
    (
        raw.len(),
        accepted_count,
        expected.duplicates,
        expected.late.len(),
    )
}

/// Epoch directories in the checkpoint store, and whether each has its manifest.
fn epochs(checkpoints: &Path) -> std::collections::BTreeMap<String, bool> {
    let Ok(entries) = std::fs::read_dir(checkpoints) else {
        return Default::default();
    };
    entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("epoch-"))
        .map(|entry| {
            (
                entry.file_name().to_string_lossy().into_owned(),
                entry.path().join("MANIFEST.json").exists(),
            )
        })
        .collect()
}

/// An epoch started since `known` was taken whose manifest is not written: an upload in progress.
fn upload_in_progress(
    checkpoints: &Path,
    known: &std::collections::BTreeMap<String, bool>,
) -> Option<String> {
    epochs(checkpoints)
        .into_iter()
        .find(|(epoch, complete)| !complete && !known.contains_key(epoch))
        .map(|(epoch, _)| epoch)
}

#[test]
fn kill_9_at_random_moments_loses_nothing_and_doubles_nothing() {
    let broker = shared_broker();
    let topics = DedupTopics::unique();
    create_topics(&broker.address, &[&topics.raw], 4).expect("raw topic");
    // January 2013: ≈ 27,000 flights → > 200,000 events with 15 % redeliveries, 10 min disorder
    // and 1 % stragglers three hours late.
    let events = replay_events((1, 1), (1, 31), realistic_feed(7));
    assert!(
        events.len() >= 200_000,
        "a stream of at least 200,000 events, got {}",
        events.len()
    );
    let dir = test_dir("dedup-crash");
    let checkpoints = dir.join("checkpoints");
    let group = unique("g");
    let mut stage = start_dedup_state(DedupOptions {
        extra_env: vec![
            ("CONTRAIL_CHECKPOINT__INTERVAL_MS".into(), "700".into()),
            ("CONTRAIL_GROUP__STATIC_MEMBERSHIP".into(), "true".into()),
            // Batches of the four shards on three threads (more than this machine's cores):
            // checkpoints, kills and restarts while several batches commit at once.
            ("CONTRAIL_BATCH__THREADS".into(), "3".into()),
        ],
        ..DedupOptions::single(&broker.address, &topics, &group, &dir)
    })
    .expect("dedup-state starts");

    // The stream arrives while the stage is being killed: a producer thread feeds it in slices.
    let producer_brokers = broker.address.clone();
    let raw_topic = topics.raw.clone();
    let total = events.len();
    let producer = std::thread::spawn(move || {
        for slice in events.chunks(10_000) {
            produce_events(&producer_brokers, &raw_topic, slice).expect("produce");
            std::thread::sleep(Duration::from_millis(400));
        }
    });

    let mut moments = Moments::from_clock();
    let mut kills = 0;
    let mut kills_during_upload = 0;
    let started = Instant::now();
    while kills < 12 {
        // Epochs present now: anything newer was started by the running process.
        let known = epochs(&checkpoints);
        if kills % 3 == 2 {
            // Wait for an upload in progress, then kill right then.
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline && upload_in_progress(&checkpoints, &known).is_none() {
                std::thread::sleep(Duration::from_micros(200));
            }
        } else {
            std::thread::sleep(Duration::from_millis(moments.next_ms(300, 2_500)));
        }
        let uploading = upload_in_progress(&checkpoints, &known);
        stage.process.kill9();
        kills += 1;
        // Still without a manifest after the kill: the kill interrupted that epoch.
        let interrupted = uploading.filter(|epoch| epochs(&checkpoints).get(epoch) == Some(&false));
        if interrupted.is_some() {
            kills_during_upload += 1;
        }
        println!(
            "kill {kills} at {:?} (interrupted upload: {interrupted:?})",
            started.elapsed()
        );
        stage.restart().expect("restart after kill -9");
    }
    producer.join().expect("producer thread");
    let status = stage
        .wait_caught_up(4, Duration::from_secs(300))
        .expect("caught up");
    println!("final status: {:?}", status.counters);
    assert!(kills >= 10);
    assert!(
        kills_during_upload >= 1,
        "at least one kill interrupted a checkpoint upload"
    );

    let (raw, accepted, duplicates, late) = verify(&broker.address, &topics, total);
    println!(
        "{raw} events, {accepted} accepted, {duplicates} duplicates, {late} late; {kills} kills ({kills_during_upload} during uploads)"
    );
    assert!(
        duplicates * 10 >= raw,
        "≥ 10 % of the stream are duplicates ({duplicates} of {raw})"
    );
    assert!(late > 0, "the stream has late events");
    let exit = stage
        .process
        .terminate(Duration::from_secs(30))
        .expect("graceful stop");
    assert!(exit.success(), "SIGTERM drains and exits 0: {exit:?}");
    // Garbage collection: at most the `keep` (2) newest complete epochs remain, and no epoch
    // older than them — in particular none of the epochs the kills interrupted.
    let store = epochs(&checkpoints);
    let complete: Vec<&String> = store
        .iter()
        .filter(|(_, complete)| **complete)
        .map(|(epoch, _)| epoch)
        .collect();
    assert!(
        !complete.is_empty() && complete.len() <= 2,
        "complete epochs kept: {complete:?}"
    );
    assert!(
        store.keys().all(|epoch| epoch >= complete[0]),
        "nothing older than the kept epochs: {store:?}"
    );
}

fn half_and_half(events: &[contrail_proto::v1::OperationalEvent]) -> (usize, usize) {
    (events.len() / 2, events.len())
}

#[test]
fn a_lost_shard_directory_is_restored_from_the_checkpoint_store() {
    let dir = test_dir("dedup-restore");
    lost_shard_directory_restores(&dir, Vec::new());
}

/// The same with the checkpoint store on Azure Blob Storage (Azurite) at the production URL form:
/// dedup-state uploads, lists, copies (incremental SSTs) and downloads through object_store's
/// Azure backend; Microsoft's client sees the complete epochs' manifests below the URL's path.
#[test]
fn a_lost_shard_directory_is_restored_from_azure_blob_storage() {
    use contrail_testkit::azurite::{ACCOUNT, ACCOUNT_KEY, Azurite};
    let dir = test_dir("dedup-restore-azure");
    let azurite = Azurite::start(&dir.join("azurite")).expect("Azurite starts");
    azurite.create_container("checkpoints").expect("container");
    let options = "CONTRAIL_CHECKPOINT_STORAGE_OPTIONS__";
    lost_shard_directory_restores(
        &dir,
        vec![
            (
                "CONTRAIL_CHECKPOINT_URL".into(),
                format!("abfss://checkpoints@{ACCOUNT}.dfs.core.windows.net/contrail/dedup-state"),
            ),
            (format!("{options}AZURE_STORAGE_USE_EMULATOR"), "true".into()),
            (format!("{options}AZURE_STORAGE_ACCOUNT_NAME"), ACCOUNT.into()),
            (format!("{options}AZURE_STORAGE_ACCOUNT_KEY"), ACCOUNT_KEY.into()),
            ("AZURITE_BLOB_STORAGE_URL".into(), azurite.blob_url.clone()),
        ],
    );
    let names = azurite.blob_names("checkpoints").expect("list");
    let manifests: Vec<&String> = names
        .iter()
        .filter(|name| name.ends_with("/MANIFEST.json"))
        .collect();
    assert!(
        manifests.len() >= 2,
        "two complete epochs in Blob storage: {manifests:?}"
    );
    assert!(
        names
            .iter()
            .all(|name| name.starts_with("contrail/dedup-state/epoch-")),
        "every object below the URL's path: {names:?}"
    );
    assert!(
        !dir.join("checkpoints").exists(),
        "nothing went to the local directory"
    );
}

/// A deployment under `dir` (with `extra_env`) checkpoints twice, loses its shards' volume, and
/// restores every shard from the newest checkpoint; the outputs are then checked against the
/// independent expectation.
fn lost_shard_directory_restores(dir: &Path, extra_env: Vec<(String, String)>) {
    let broker = shared_broker();
    let topics = DedupTopics::unique();
    create_topics(&broker.address, &[&topics.raw], 4).expect("raw topic");
    let events = replay_events((3, 1), (3, 3), realistic_feed(11));
    let (half, total) = half_and_half(&events);
    let group = unique("g");
    let mut env = vec![
        ("CONTRAIL_CHECKPOINT__INTERVAL_MS".to_owned(), "0".to_owned()),
        // Every batch on the polling thread (the other tests run a thread per CPU or more).
        ("CONTRAIL_BATCH__THREADS".to_owned(), "1".to_owned()),
    ];
    env.extend(extra_env);
    let mut stage = start_dedup_state(DedupOptions {
        extra_env: env,
        ..DedupOptions::single(&broker.address, &topics, &group, dir)
    })
    .expect("start");
    // Two checkpoints: the second copies the first one's unchanged SST files inside the store
    // (incremental), and is the one restored from below.
    let quarter = half / 2;
    produce_events(&broker.address, &topics.raw, &events[..quarter]).expect("first quarter");
    stage
        .wait_caught_up(4, Duration::from_secs(120))
        .expect("first quarter processed");
    let first = stage.trigger_checkpoint().expect("checkpoint");
    produce_events(&broker.address, &topics.raw, &events[quarter..half]).expect("second quarter");
    stage
        .wait_caught_up(4, Duration::from_secs(120))
        .expect("first half processed");
    let epoch = stage.trigger_checkpoint().expect("checkpoint");
    assert!(epoch > first);
    produce_events(&broker.address, &topics.raw, &events[half..]).expect("second half");
    stage
        .wait_caught_up(4, Duration::from_secs(120))
        .expect("second half processed");
    let exit = stage.process.terminate(Duration::from_secs(30)).expect("SIGTERM");
    assert!(
        exit.success(),
        "graceful shutdown exits 0: {exit:?}\n{}",
        stage.process.log()
    );

    // A new pod: the volume with the shards is gone.
    std::fs::remove_dir_all(stage.dir.join("shards")).expect("delete the shards");
    stage.restart().expect("restart on an empty volume");
    let status = stage
        .wait_caught_up(4, Duration::from_secs(120))
        .expect("caught up after restore");
    assert_eq!(
        status.counters.get("restores_total"),
        Some(&4.0),
        "all four shards restored: {:?}",
        status.counters
    );
    // The checkpoint's offsets are inside the stream: the second half was reprocessed.
    assert!(
        status.counters.get("records_total").copied().unwrap_or(0.0) >= (total - half) as f64 * 0.9,
        "input after the checkpoint was reprocessed: {:?}",
        status.counters
    );
    let (_, accepted, _, _) = verify(&broker.address, &topics, total);
    assert!(accepted > 0);

    // The state reader: a flight of the last day (older ones expired by the 48 h state TTL).
    let key = &events.last().expect("events").flight_key;
    let state = stage.read_key_state(key).expect("read key state");
    assert!(state.found, "{key} has state");
    let document: serde_json::Value = serde_json::from_str(&state.state_json).expect("state json");
    assert_eq!(document["flightKey"], key.as_str());
    assert!(!state.dedup_event_ids.is_empty(), "dedup entries are readable");
    assert!(
        state.timers.iter().any(|timer| timer.kind.starts_with("__ttl")),
        "the state TTL timer: {:?}",
        state.timers
    );
    stage.process.terminate(Duration::from_secs(30)).expect("stop");
}

#[test]
fn when_an_instance_leaves_the_other_takes_its_shards() {
    let broker = shared_broker();
    let topics = DedupTopics::unique();
    create_topics(&broker.address, &[&topics.raw], 4).expect("raw topic");
    let events = replay_events((5, 1), (5, 3), realistic_feed(13));
    let (half, total) = half_and_half(&events);
    let dir = test_dir("dedup-rescale");
    let group = unique("g");
    let port_a = contrail_testkit::free_port();
    let port_b = contrail_testkit::free_port();
    let peers = format!("[\"http://127.0.0.1:{port_a}\",\"http://127.0.0.1:{port_b}\"]");
    let mut a = start_dedup_state(DedupOptions {
        dir: dir.join("a"),
        grpc_port: Some(port_a),
        extra_env: vec![
            ("CONTRAIL_CHECKPOINT__INTERVAL_MS".into(), "0".into()),
            ("CONTRAIL_CHECKPOINT__PEERS".into(), peers),
        ],
        ..DedupOptions::single(&broker.address, &topics, &group, &dir)
    })
    .expect("instance a");
    let mut b = start_dedup_state(DedupOptions {
        instance: "dedup-state-1",
        dir: dir.join("b"),
        grpc_port: Some(port_b),
        extra_env: vec![("CONTRAIL_CHECKPOINT__COORDINATOR".into(), "false".into())],
        ..DedupOptions::single(&broker.address, &topics, &group, &dir)
    })
    .expect("instance b");
    produce_events(&broker.address, &topics.raw, &events[..half]).expect("first half");

    // Both own shards once the group settled.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (owned_a, owned_b) = loop {
        let owned_a = a.status().map(|status| status.partitions.len()).unwrap_or(0);
        let owned_b = b.status().map(|status| status.partitions.len()).unwrap_or(0);
        if (owned_a > 0 && owned_b > 0 && owned_a + owned_b == 4) || Instant::now() > deadline {
            break (owned_a, owned_b);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        owned_a > 0 && owned_b > 0,
        "both instances own shards: a {owned_a}, b {owned_b}"
    );
    wait_both_caught_up(&mut a, owned_a, &mut b, owned_b);
    a.trigger_checkpoint()
        .expect("a checkpoint covering both instances' shards");

    // b leaves (scale-in); a takes over b's shards from the checkpoint store.
    let exit = b.process.terminate(Duration::from_secs(30)).expect("b stops");
    assert!(exit.success(), "b drains and exits 0: {exit:?}");
    produce_events(&broker.address, &topics.raw, &events[half..]).expect("second half");
    let status = a
        .wait_caught_up(4, Duration::from_secs(120))
        .expect("a owns all four shards");
    assert_eq!(
        status.counters.get("restores_total"),
        Some(&(owned_b as f64)),
        "a restored b's shards from the checkpoint: {:?}",
        status.counters
    );
    verify(&broker.address, &topics, total);
    a.process.terminate(Duration::from_secs(30)).expect("stop");
}

fn wait_both_caught_up(a: &mut DedupUnderTest, owned_a: usize, b: &mut DedupUnderTest, owned_b: usize) {
    a.wait_caught_up(owned_a, Duration::from_secs(120))
        .expect("a caught up");
    b.wait_caught_up(owned_b, Duration::from_secs(120))
        .expect("b caught up");
}

#[test]
fn undecodable_and_mismatched_records_go_to_the_dead_letter_topic_and_processing_goes_on() {
    use prost::Message as _;
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    let broker = shared_broker();
    let topics = DedupTopics::unique();
    create_topics(&broker.address, &[&topics.raw], 4).expect("raw topic");
    let dir = test_dir("dedup-dlq");
    let group = unique("g");
    let mut stage =
        start_dedup_state(DedupOptions::single(&broker.address, &topics, &group, &dir)).expect("start");
    let events = replay_events(
        (6, 1),
        (6, 1),
        ReplayConfig {
            duplicate_rate: 0.0,
            straggler_rate: 0.0,
            ..realistic_feed(3)
        },
    );
    let valid = &events[..50];
    let mismatched = {
        let mut event = events[50].clone();
        event.flight_key = "XX1-2013-06-01-JFK".to_owned();
        event
    };
    let producer: ThreadedProducer<DefaultProducerContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &broker.address)
        .create()
        .expect("producer");
    let garbage = b"\xff\x00not a protobuf event".to_vec();
    producer
        .send(
            BaseRecord::to(&topics.raw)
                .key("AA1-2013-06-01-JFK")
                .payload(&garbage),
        )
        .map_err(|(error, _)| error)
        .expect("send garbage");
    let mismatched_payload = mismatched.encode_to_vec();
    producer
        .send(
            BaseRecord::to(&topics.raw)
                .key(&events[50].flight_key)
                .payload(&mismatched_payload),
        )
        .map_err(|(error, _)| error)
        .expect("send mismatched");
    producer.flush(Duration::from_secs(10)).expect("flush");
    produce_events(&broker.address, &topics.raw, valid).expect("valid events");
    let status = stage
        .wait_caught_up(4, Duration::from_secs(60))
        .expect("caught up");
    assert_eq!(
        status.counters.get("invalid_records_total"),
        Some(&2.0),
        "{:?}",
        status.counters
    );
    assert!(stage.process.is_running(), "bad input does not stop the stage");

    let letters: Vec<contrail_proto::v1::DeadLetter> = read_all(&broker.address, &topics.dlq, 2)
        .iter()
        .map(|message| {
            use rdkafka::Message as _;
            contrail_proto::v1::DeadLetter::decode(message.payload().unwrap_or_default())
                .expect("dead letter")
        })
        .collect();
    assert_eq!(letters.len(), 2, "{letters:?}");
    assert!(letters.iter().any(
        |letter| letter.reason.contains("not a contrail.v1.OperationalEvent") && letter.payload == garbage
    ));
    assert!(
        letters
            .iter()
            .any(|letter| letter.reason.contains("does not equal flight_key"))
    );
    assert!(
        letters
            .iter()
            .all(|letter| letter.stage == "dedup-state" && letter.input.is_some())
    );
    // The valid events were all processed: 50 accepted (no duplicates in this feed).
    assert_eq!(
        status.counters.get("events_accepted_total"),
        Some(&50.0),
        "{:?}",
        status.counters
    );
    // The same counts on the Prometheus endpoint, with the commit and state metrics.
    let metrics = contrail_testkit::http_get(&format!("{}/metrics", stage.http_url)).expect("metrics");
    for expected in [
        "contrail_dedup_events_total{verdict=\"invalid\"} 2",
        "contrail_dedup_events_total{verdict=\"accepted\"} 50",
        "contrail_dedup_commits_total",
        "contrail_dedup_state_bytes{partition=",
        "contrail_dedup_commit_seconds_bucket",
    ] {
        assert!(
            metrics.contains(expected),
            "/metrics lacks {expected}:\n{metrics}"
        );
    }
    stage.process.terminate(Duration::from_secs(30)).expect("stop");
}

/// Every output topic partition must receive each input partition's outputs in input order: a
/// position may repeat (a copy), but its first appearance comes after the first appearances of
/// every lower position of the same input partition. Downstream exact de-duplication drops
/// anything at or below the highest position it applied (docs/CONTRACT.md,
/// "Exact de-duplication"), so a first appearance out of order would be lost there. Returns the
/// violations.
fn first_appearances_out_of_order(
    messages: &[OwnedMessage],
    position: impl Fn(&[u8]) -> Option<(i32, i64)>,
) -> Vec<String> {
    use rdkafka::Message as _;
    let mut highest: std::collections::BTreeMap<(i32, i32), i64> = Default::default();
    let mut seen: std::collections::BTreeSet<(i32, i32, i64)> = Default::default();
    let mut ordered: Vec<&OwnedMessage> = messages.iter().collect();
    ordered.sort_by_key(|message| (message.partition(), message.offset()));
    let mut problems = Vec::new();
    for message in ordered {
        let Some((input_partition, input_offset)) = position(message.payload().unwrap_or_default()) else {
            problems.push(format!(
                "{}/{}: no input position",
                message.partition(),
                message.offset()
            ));
            continue;
        };
        if !seen.insert((message.partition(), input_partition, input_offset)) {
            continue;
        }
        let high = highest
            .entry((message.partition(), input_partition))
            .or_insert(i64::MIN);
        if input_offset < *high {
            problems.push(format!(
                "topic partition {} offset {}: input {input_partition}/{input_offset} first appears after input offset {high}",
                message.partition(),
                message.offset()
            ));
        }
        *high = (*high).max(input_offset);
    }
    problems
}
