//! delta-archiver as a real process against the real broker, writing real Delta tables on disk,
//! read back by an independent reader (delta-rs' Python binding and polars, `verify_delta.py`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use contrail_testkit::azurite::{ACCOUNT, Azurite};
use contrail_testkit::cosmos::{CosmosStage, metric_at, status_at};
use contrail_testkit::dedup::{realistic_feed, replay_events};
use contrail_testkit::delta::{
    HistoryStream, TableReport, produce_with_redeliveries, topic_ends, verify_tables, verify_tables_at,
};
use contrail_testkit::{Moments, Probe, create_topics, shared_broker, test_dir, unique, workspace_binary};

const TABLES: [&str; 5] = [
    "events",
    "flight_states",
    "late_events",
    "serving_changes",
    "predictions",
];

struct Topics {
    by_table: BTreeMap<&'static str, String>,
    dlq: String,
}

impl Topics {
    fn unique() -> Topics {
        let prefix = unique("d");
        let by_table = [
            ("events", format!("{prefix}.ops.events.accepted")),
            ("flight_states", format!("{prefix}.ops.flights.curated")),
            ("late_events", format!("{prefix}.ops.events.late")),
            ("serving_changes", format!("{prefix}.ops.flights.changes")),
            ("predictions", format!("{prefix}.ops.flights.predictions")),
        ]
        .into_iter()
        .collect();
        Topics {
            by_table,
            dlq: format!("{prefix}.ops.events.dlq"),
        }
    }

    /// Unique topics, created on the broker with `partitions` partitions each.
    fn create(brokers: &str, partitions: i32) -> Topics {
        let topics = Topics::unique();
        let mut names: Vec<&str> = topics.by_table.values().map(String::as_str).collect();
        names.push(&topics.dlq);
        create_topics(brokers, &names, partitions).expect("topics");
        topics
    }

    fn env(&self, brokers: &str, group: &str, root: &Path) -> Vec<(String, String)> {
        vec![
            ("CONTRAIL_KAFKA__BROKERS".to_owned(), brokers.to_owned()),
            (
                "CONTRAIL_TOPICS__ACCEPTED".to_owned(),
                self.by_table["events"].clone(),
            ),
            (
                "CONTRAIL_TOPICS__CURATED".to_owned(),
                self.by_table["flight_states"].clone(),
            ),
            (
                "CONTRAIL_TOPICS__LATE".to_owned(),
                self.by_table["late_events"].clone(),
            ),
            (
                "CONTRAIL_TOPICS__CHANGES".to_owned(),
                self.by_table["serving_changes"].clone(),
            ),
            (
                "CONTRAIL_TOPICS__PREDICTIONS".to_owned(),
                self.by_table["predictions"].clone(),
            ),
            // The alerts table has its own exactly-once test (exactly_once.rs, from dedup-state).
            ("CONTRAIL_TOPICS__ALERTS".to_owned(), String::new()),
            ("CONTRAIL_TOPICS__DLQ".to_owned(), self.dlq.clone()),
            ("CONTRAIL_TOPICS__CREATE".to_owned(), "false".to_owned()),
            ("CONTRAIL_DELTA_ROOT".to_owned(), root.display().to_string()),
            ("CONTRAIL_GROUP__ID".to_owned(), group.to_owned()),
            ("CONTRAIL_GROUP__SESSION_TIMEOUT_MS".to_owned(), "6000".to_owned()),
            ("CONTRAIL_GROUP__STATIC_MEMBERSHIP".to_owned(), "true".to_owned()),
            ("CONTRAIL_INSTANCE".to_owned(), "delta-archiver-0".to_owned()),
            ("CONTRAIL_MAINTENANCE__ENABLED".to_owned(), "false".to_owned()),
        ]
    }

    fn app_ids(&self, partitions: i32) -> BTreeMap<&'static str, Vec<String>> {
        self.by_table
            .iter()
            .map(|(table, topic)| {
                (
                    *table,
                    (0..partitions).map(|p| format!("{table}-{topic}-{p}")).collect(),
                )
            })
            .collect()
    }
}

/// A producer thread per topic: `(table, records produced, thread answering the copies made)`.
type Producers = Vec<(&'static str, usize, std::thread::JoinHandle<usize>)>;

/// Produces each topic of `stream` from its own thread, in chunks of `chunk` records with every
/// `every`-th record of a chunk re-sent byte-identically, pausing `pause_ms` between chunks.
fn spawn_producers(
    stream: &HistoryStream,
    topics: &Topics,
    brokers: &str,
    chunk: usize,
    every: usize,
    pause_ms: u64,
) -> Producers {
    stream
        .records()
        .into_iter()
        .map(|(table, records)| {
            let count = records.len();
            let brokers = brokers.to_owned();
            let topic = topics.by_table[table].clone();
            let thread = std::thread::spawn(move || {
                produce_with_redeliveries(
                    &brokers,
                    &topic,
                    &records,
                    chunk,
                    every,
                    Duration::from_millis(pause_ms),
                )
                .expect("produce")
            });
            (table, count, thread)
        })
        .collect()
}

/// Waits for the producers; the copies they made and every partition's end, read from the topics.
fn join_producers(
    producers: Producers,
    topics: &Topics,
    brokers: &str,
) -> (usize, BTreeMap<(String, i32), i64>) {
    let mut copies = 0;
    let mut ends = BTreeMap::new();
    for (table, count, thread) in producers {
        let redelivered = thread.join().expect("producer");
        copies += redelivered;
        let topic = &topics.by_table[table];
        for (partition, end) in topic_ends(brokers, topic, count + redelivered).expect("ends") {
            ends.insert((topic.clone(), partition), end);
        }
    }
    (copies, ends)
}

fn check_exactly_once(
    reports: &BTreeMap<String, TableReport>,
    expected: &BTreeMap<&'static str, Vec<String>>,
    ends: &BTreeMap<(String, i32), i64>,
    topics: &Topics,
) {
    for table in TABLES {
        let report = &reports[table];
        let wanted = expected[table].len() as u64;
        println!(
            "{table}: {} rows, {} distinct, expected {wanted}; {} files ({} Parquet files on disk), version {}, {} date partitions",
            report.rows,
            report.distinct,
            report.files,
            report.parquet_on_disk,
            report.version,
            report.partitions
        );
        assert_eq!(
            (report.missing, report.unexpected),
            (0, 0),
            "{table}: missing e.g. {:?}, unexpected e.g. {:?}",
            report.missing_sample,
            report.unexpected_sample
        );
        assert_eq!(report.distinct, wanted, "{table}: distinct identities");
        assert_eq!(report.rows, wanted, "{table}: exactly one row per identity");
        let topic = &topics.by_table[table];
        for ((end_topic, partition), end) in ends {
            if end_topic == topic {
                let app_id = format!("{table}-{topic}-{partition}");
                assert_eq!(
                    report.txn.get(&app_id).copied().flatten(),
                    Some(end - 1),
                    "{app_id}: the stored txn version is the partition's last offset"
                );
            }
        }
    }
}

/// The production URL form on Azure Storage (Azurite): delta-archiver writes the five tables at
/// `abfss://history@ACCOUNT.dfs.core.windows.net/contrail/delta`, a kill -9 mid-stream included;
/// the independent reader (delta-rs' Python binding, polars) finds one row per identity there,
/// and Microsoft's client lists every blob below `contrail/delta/<table>/` — no table at the
/// container's root, no path segment lost (what `az://CONTAINER/PATH` roots did).
#[test]
fn archives_exactly_once_to_azure_storage_at_the_production_url_form() {
    let broker = shared_broker();
    let dir = test_dir("delta-azurite");
    let azurite = Azurite::start(&dir.join("azurite")).expect("Azurite starts");
    azurite.create_container("history").expect("container");
    let root = format!("abfss://history@{ACCOUNT}.dfs.core.windows.net/contrail/delta");
    let topics = Topics::create(&broker.address, 2);
    let stream = HistoryStream::from_raw(&replay_events((1, 2), (1, 3), realistic_feed(31)));
    let expected = stream.expected_identities();
    let mut env: Vec<(String, String)> = topics
        .env(&broker.address, &unique("da"), Path::new("unused"))
        .into_iter()
        .filter(|(key, _)| key != "CONTRAIL_DELTA_ROOT")
        .collect();
    env.push(("CONTRAIL_DELTA_ROOT".to_owned(), root.clone()));
    env.push(("CONTRAIL_BATCH__MAX_LATENCY_MS".to_owned(), "1000".to_owned()));
    env.extend(azurite.archiver_env());
    let mut stage =
        CosmosStage::start("delta-archiver", env, &dir).expect("delta-archiver starts on Azurite");
    let producers = spawn_producers(&stream, &topics, &broker.address, 2_000, 41, 200);
    std::thread::sleep(Duration::from_millis(2_500));
    stage.restart_after_kill9().expect("restart after kill -9");
    let (_, ends) = join_producers(producers, &topics, &broker.address);
    stage
        .wait_positions(&ends, Duration::from_secs(300))
        .expect("archived");
    let reports = verify_tables_at(
        &root,
        &azurite.reader_env(),
        &dir.join("verify"),
        &expected,
        &topics.app_ids(2),
    )
    .expect("the independent reader reads the tables on Azurite");
    check_exactly_once(&reports, &expected, &ends, &topics);
    let names = azurite.blob_names("history").expect("list");
    for table in TABLES {
        let log = format!("contrail/delta/{table}/_delta_log/00000000000000000000.json");
        assert!(names.contains(&log), "{log} in {names:?}");
    }
    let astray: Vec<&String> = names
        .iter()
        .filter(|name| {
            !TABLES
                .iter()
                .any(|table| name.starts_with(&format!("contrail/delta/{table}/")))
        })
        .collect();
    assert!(
        astray.is_empty(),
        "blobs outside the tables' directories: {astray:?}"
    );
}

#[test]
fn kill_9_mid_stream_and_between_flush_and_commit_leaves_one_row_per_identity() {
    let broker = shared_broker();
    let dir = test_dir("delta-archiver");
    let root = dir.join("delta");
    let topics = Topics::create(&broker.address, 4);

    // Eleven days of January 2013 → more than 200,000 records over the five topics.
    let stream = HistoryStream::from_raw(&replay_events((1, 1), (1, 11), realistic_feed(23)));
    let expected = stream.expected_identities();
    println!(
        "{} records: {} accepted, {} curated, {} late, {} changes, {} predictions",
        stream.len(),
        stream.accepted.len(),
        stream.curated.len(),
        stream.late.len(),
        stream.changes.len(),
        stream.predictions.len()
    );
    assert!(
        stream.len() >= 200_000,
        "at least 200,000 records, got {}",
        stream.len()
    );

    let mut env = topics.env(&broker.address, &unique("da"), &root);
    env.extend([
        ("CONTRAIL_BATCH__MAX_ROWS".to_owned(), "10000".to_owned()),
        ("CONTRAIL_DELTA__CHECKPOINT_INTERVAL".to_owned(), "3".to_owned()),
        ("CONTRAIL_BATCH__MAX_LATENCY_MS".to_owned(), "1500".to_owned()),
        // Widens the flush → commit window so a kill can be aimed into it.
        (
            "CONTRAIL_TESTING__PAUSE_BEFORE_COMMIT_MS".to_owned(),
            "400".to_owned(),
        ),
    ]);
    let mut stage = CosmosStage::start("delta-archiver", env.clone(), &dir).expect("delta-archiver starts");

    // One producer per topic, each re-sending every 97th record of each chunk byte-identically.
    let producers = spawn_producers(&stream, &topics, &broker.address, 5_000, 97, 400);

    let mut moments = Moments::from_clock();
    let mut aimed_hits = 0;
    for kill in 1..=6 {
        if kill % 2 == 0 {
            // Aimed: wait until Parquet files are written and their commit is pending.
            // (The producers keep the archiver committing until they are done; a window missed here
            // is counted and at least one of the three must land, asserted below.)
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut hit = false;
            while Instant::now() < deadline {
                if stage.metric("contrail_delta_uncommitted_files", "") > 0.0 {
                    hit = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            stage.restart_after_kill9().expect("restart after kill -9");
            aimed_hits += usize::from(hit);
            println!("kill {kill}: between flush and commit: {hit}");
        } else {
            std::thread::sleep(Duration::from_millis(moments.next_ms(500, 4_000)));
            stage.restart_after_kill9().expect("restart after kill -9");
            println!("kill {kill}: at a random moment");
        }
    }
    let (copies, ends) = join_producers(producers, &topics, &broker.address);
    println!(
        "{copies} byte-identical redeliveries produced; {aimed_hits} kills landed between flush and commit"
    );
    assert!(aimed_hits >= 1, "no kill landed between Parquet flush and commit");
    stage
        .wait_positions(&ends, Duration::from_secs(600))
        .expect("archived");
    let duplicates = stage.metric("contrail_delta_duplicates_total", "");
    println!("duplicates dropped by identity (this run since the last restart): {duplicates}");
    let exit = stage.process.terminate(Duration::from_secs(60)).expect("SIGTERM");
    assert!(exit.success(), "graceful stop: {exit:?}");

    // Checkpoints were written by the commits themselves (delta.checkpointInterval = 3), and the
    // reader below reads the tables through them.
    for table in TABLES {
        let log = root.join(table).join("_delta_log");
        let checkpoints = std::fs::read_dir(&log)
            .expect("delta log")
            .filter_map(Result::ok)
            .filter(|entry| {
                entry
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".checkpoint.parquet")
            })
            .count();
        assert!(checkpoints >= 1, "{table}: no checkpoint in {}", log.display());
    }
    let app_ids = topics.app_ids(4);
    let reports = verify_tables(&root, &dir.join("verify"), &expected, &app_ids).expect("independent reader");
    check_exactly_once(&reports, &expected, &ends, &topics);
    let orphans: u64 = reports
        .values()
        .map(|r| r.parquet_on_disk - r.files.min(r.parquet_on_disk))
        .sum();
    println!("orphan Parquet files left by kills: {orphans}");
    assert!(
        orphans >= 1,
        "a kill between flush and commit leaves its files unreferenced"
    );

    // Maintenance: compaction (our own, no DataFusion) and vacuum of the orphans. The data must
    // not change; the files must.
    let output = std::process::Command::new(workspace_binary("delta-archiver").expect("binary"))
        .arg("maintain")
        .arg("--vacuum-retention-s")
        .arg("0")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("CONTRAIL_MAINTENANCE__COMPACT_MIN_FILES", "2")
        .env("RUST_LOG", "warn")
        .output()
        .expect("delta-archiver maintain");
    let printed = String::from_utf8_lossy(&output.stdout);
    println!("maintain: {printed}");
    assert!(
        output.status.success(),
        "maintain failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let after =
        verify_tables(&root, &dir.join("verify-after"), &expected, &app_ids).expect("independent reader");
    check_exactly_once(&after, &expected, &ends, &topics);
    let files_before: u64 = reports.values().map(|r| r.files).sum();
    let files_after: u64 = after.values().map(|r| r.files).sum();
    println!("files: {files_before} before maintenance, {files_after} after");
    assert!(
        files_after < files_before,
        "compaction must reduce the file count"
    );
    for (table, report) in &after {
        assert_eq!(
            report.parquet_on_disk, report.files,
            "{table}: vacuum leaves exactly the referenced files"
        );
    }
}

#[test]
fn undecodable_records_go_to_the_dead_letter_topic_and_do_not_stop_the_partition() {
    let broker = shared_broker();
    let dir = test_dir("delta-dlq");
    let root = dir.join("delta");
    let topics = Topics::create(&broker.address, 1);
    let stream = HistoryStream::from_raw(&replay_events((1, 1), (1, 1), realistic_feed(3)));
    let mut records = stream.records().remove(0).1;
    records.truncate(500);
    // Garbage between good records: not protobuf, a state in the events topic without event_id.
    let garbage: Vec<(String, Vec<u8>)> = vec![
        ("x".to_owned(), b"\xff\xfe not protobuf".to_vec()),
        (
            "y".to_owned(),
            b"{\"event_id\":\"json is not the wire format\"}".to_vec(),
        ),
    ];
    let mut mixed = records[..250].to_vec();
    mixed.extend(garbage.clone());
    mixed.extend(records[250..].iter().cloned());
    let mut stage = CosmosStage::start(
        "delta-archiver",
        topics.env(&broker.address, &unique("dd"), &root),
        &dir,
    )
    .expect("delta-archiver starts");
    produce_with_redeliveries(
        &broker.address,
        &topics.by_table["events"],
        &mixed,
        10_000,
        usize::MAX,
        Duration::ZERO,
    )
    .expect("produce");
    let end = mixed.len() as i64 + 1; // one copy of the first record (step_by(usize::MAX))
    let ends: BTreeMap<(String, i32), i64> = [((topics.by_table["events"].clone(), 0), end)]
        .into_iter()
        .collect();
    stage
        .wait_positions(&ends, Duration::from_secs(120))
        .expect("archived past the garbage");
    let letters = contrail_testkit::read_topic(&broker.address, &topics.dlq, 2, Duration::from_secs(30))
        .expect("dead letters");
    assert_eq!(letters.len(), 2, "one dead letter per undecodable record");
    for letter in &letters {
        use prost::Message as _;
        use rdkafka::Message as _;
        let letter =
            contrail_proto::v1::DeadLetter::decode(letter.payload().unwrap_or_default()).expect("DeadLetter");
        assert_eq!(letter.stage, "delta-archiver");
        assert!(
            letter.reason.contains("not a contrail.v1.OperationalEvent")
                || letter.reason.contains("without event_id"),
            "{}",
            letter.reason
        );
        assert!(
            garbage.iter().any(|(_, payload)| *payload == letter.payload),
            "the payload is kept"
        );
    }
    assert_eq!(
        stage.metric("contrail_delta_duplicates_total", ""),
        1.0,
        "the redelivered first record"
    );
    stage.process.terminate(Duration::from_secs(30)).expect("SIGTERM");
    let expected: BTreeMap<&'static str, Vec<String>> = [(
        "events",
        records
            .iter()
            .map(|(_, payload)| {
                use prost::Message as _;
                let event = contrail_proto::v1::OperationalEvent::decode(payload.as_slice()).expect("event");
                format!("{}#{}", event.flight_key, event.event_id)
            })
            .collect(),
    )]
    .into_iter()
    .collect();
    let reports = verify_tables(&root, &dir.join("verify"), &expected, &topics.app_ids(1)).expect("reader");
    let events = &reports["events"];
    assert_eq!((events.rows, events.missing, events.unexpected), (500, 0, 0));
    assert_eq!(
        events
            .txn
            .get(&format!("events-{}-0", topics.by_table["events"]))
            .copied()
            .flatten(),
        Some(end - 1)
    );
}

/// Committed positions of every `(topic, partition)` over several instances (each reports only
/// what it owns).
fn positions(stages: &[&CosmosStage]) -> BTreeMap<(String, i32), i64> {
    let mut positions = BTreeMap::new();
    for stage in stages {
        if let Ok(status) = stage.status() {
            for partition in status.partitions {
                let entry = positions
                    .entry((partition.topic, partition.partition))
                    .or_insert(partition.committed_offset);
                *entry = (*entry).max(partition.committed_offset);
            }
        }
    }
    positions
}

#[test]
fn a_frozen_zombie_cannot_commit_after_its_partitions_moved() {
    let broker = shared_broker();
    let dir = test_dir("delta-zombie");
    let root = dir.join("delta");
    let topics = Topics::create(&broker.address, 4);
    let stream = HistoryStream::from_raw(&replay_events((1, 3), (1, 4), realistic_feed(31)));
    let expected = stream.expected_identities();
    println!("{} records over the five topics", stream.len());

    let group = unique("dz");
    let settings = |instance: &str| {
        let mut env = topics.env(&broker.address, &group, &root);
        env.retain(|(key, _)| key != "CONTRAIL_INSTANCE" && key != "CONTRAIL_GROUP__STATIC_MEMBERSHIP");
        env.extend([
            ("CONTRAIL_INSTANCE".to_owned(), instance.to_owned()),
            ("CONTRAIL_BATCH__MAX_ROWS".to_owned(), "4000".to_owned()),
            ("CONTRAIL_BATCH__MAX_LATENCY_MS".to_owned(), "800".to_owned()),
            (
                "CONTRAIL_TESTING__PAUSE_BEFORE_COMMIT_MS".to_owned(),
                "1500".to_owned(),
            ),
        ]);
        env
    };
    let a = CosmosStage::start("delta-archiver", settings("archiver-a"), &dir.join("a")).expect("a starts");
    let mut b =
        CosmosStage::start("delta-archiver", settings("archiver-b"), &dir.join("b")).expect("b starts");

    let producers = spawn_producers(&stream, &topics, &broker.address, 2_000, 89, 300);
    // Freeze a between writing its Parquet files and committing them, for longer than the
    // session timeout: the group gives its partitions to b, which archives them.
    let mut a = a;
    let a_http = a.http_url.clone();
    a.process
        .wait_until(
            "a between Parquet flush and commit (contrail_delta_uncommitted_files > 0)",
            Duration::from_secs(120),
            || {
                let uncommitted = metric_at(&a_http, "contrail_delta_uncommitted_files", "");
                Ok(if uncommitted > 0.0 {
                    Probe::Ready(())
                } else {
                    Probe::NotYet(format!("uncommitted files {uncommitted}"))
                })
            },
        )
        .expect("a reaches a commit");
    a.process.freeze();
    println!("a frozen between flush and commit");
    // The group gives a's partitions to b once a misses its session timeout (6 s): wait until b
    // archives every partition of the five topics.
    let b_grpc = b.grpc_url.clone();
    b.process
        .wait_until(
            "b to own and archive all 20 partitions of the five topics while a is frozen",
            Duration::from_secs(120),
            || {
                // (topic, partition, next offset archived): a position past 0 means b committed
                // rows of it — among them the ones a's frozen commit holds.
                let owned: Vec<(String, i32, i64)> = status_at(&b_grpc)
                    .map(|status| {
                        status
                            .partitions
                            .into_iter()
                            .map(|partition| {
                                (partition.topic, partition.partition, partition.committed_offset)
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(
                    if owned.len() == 20 && owned.iter().all(|(_, _, next)| *next > 0) {
                        Probe::Ready(())
                    } else {
                        Probe::NotYet(format!("b owns {} partitions: {owned:?}", owned.len()))
                    },
                )
            },
        )
        .expect("b takes a's partitions");
    a.process.thaw();
    println!("a thawed: its pending commit must be refused");

    let (_, ends) = join_producers(producers, &topics, &broker.address);
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let committed = positions(&[&a, &b]);
        if ends.iter().all(|(key, end)| committed.get(key) >= Some(end)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not archived: {committed:?} vs {ends:?}"
        );
        assert!(b.process.is_running(), "b exited: {}", b.process.log());
        std::thread::sleep(Duration::from_millis(250));
    }
    // Whichever instance commits second for a partition finds the other's txn version and drops
    // its batch: the thawed zombie when the new owner committed first, else the new owner (whose
    // position, read before the zombie's late commit, is then stale). Either way exactly once,
    // which the reader checks below.
    let (fenced_a, fenced_b) = (
        a.metric("contrail_delta_fenced_total", ""),
        b.metric("contrail_delta_fenced_total", ""),
    );
    println!("partition commits dropped by the fence: a {fenced_a}, b {fenced_b}");
    assert!(
        fenced_a + fenced_b >= 1.0,
        "no commit was fenced although a's partitions moved while it held a pending commit:\n--- a ---\n{}\n--- b ---\n{}",
        a.process.log(),
        b.process.log()
    );
    for stage in [&mut a, &mut b] {
        stage.process.terminate(Duration::from_secs(60)).expect("SIGTERM");
    }
    let reports = verify_tables(&root, &dir.join("verify"), &expected, &topics.app_ids(4)).expect("reader");
    check_exactly_once(&reports, &expected, &ends, &topics);
}

/// The events topic is deleted and created again while delta-archiver is stopped: the table's
/// position for its partition (301) is past the new topic's end (101). The partition is held at
/// the gap — status, readiness, the metric and an ERROR log say so, and nothing of the new topic
/// reaches the table — until an operator accepts it with `contrail admin accept-gap`; then every
/// record of the new topic is archived once, beside the old topic's, and the stage is ready again.
#[test]
fn a_re_created_topic_holds_its_partition_until_the_gap_is_accepted() {
    use contrail_testkit::{answers_200, recreate_topics};
    let broker = shared_broker();
    let dir = test_dir("delta-gap");
    let root = dir.join("delta");
    let topics = Topics::create(&broker.address, 1);
    let events_topic = topics.by_table["events"].clone();
    let stream = HistoryStream::from_raw(&replay_events((1, 1), (1, 1), realistic_feed(3)));
    let records = stream.records().remove(0).1;
    assert!(records.len() >= 400, "{} events", records.len());
    let (before, after) = (&records[..300], &records[300..400]);
    let mut stage = CosmosStage::start(
        "delta-archiver",
        topics.env(&broker.address, &unique("dg"), &root),
        &dir,
    )
    .expect("delta-archiver starts");
    // Each produce re-sends its first record once (a redelivery): ends are records + 1.
    produce_with_redeliveries(
        &broker.address,
        &events_topic,
        before,
        10_000,
        usize::MAX,
        Duration::ZERO,
    )
    .expect("produce");
    let old_end: BTreeMap<(String, i32), i64> = [((events_topic.clone(), 0), 301)].into_iter().collect();
    stage
        .wait_positions(&old_end, Duration::from_secs(120))
        .expect("the old topic archived");
    stage.process.terminate(Duration::from_secs(30)).expect("SIGTERM");

    recreate_topics(&broker.address, &[&events_topic], 1).expect("topic re-created");
    produce_with_redeliveries(
        &broker.address,
        &events_topic,
        after,
        10_000,
        usize::MAX,
        Duration::ZERO,
    )
    .expect("produce to the new topic");
    stage.start_again().expect("delta-archiver starts again");

    let gap = stage
        .wait_gap_reported(&events_topic)
        .expect("the gap held and reported: status, readiness, metric, ERROR log");
    assert_eq!(
        (
            gap.topic.as_str(),
            gap.partition,
            gap.cause.as_str(),
            gap.stored_next,
            gap.log_start,
            gap.records_lost
        ),
        (events_topic.as_str(), 0, "past-end", 301, 0, -1),
        "{gap:?}"
    );
    let readyz = format!("{}/readyz", stage.http_url);
    let before_ids = identities(before);
    let reports = verify_tables(
        &root,
        &dir.join("verify-held"),
        &[("events", before_ids.clone())].into_iter().collect(),
        &topics.app_ids(1),
    )
    .expect("reader");
    let events = &reports["events"];
    assert_eq!(
        (events.rows, events.missing, events.unexpected),
        (300, 0, 0),
        "nothing of the new topic archived while held: {:?}",
        events.unexpected_sample
    );

    stage
        .accept_gap_with_cli(&events_topic, 0)
        .expect("contrail admin accept-gap accepts the gap");
    let new_end: BTreeMap<(String, i32), i64> = [((events_topic.clone(), 0), 101)].into_iter().collect();
    stage
        .wait_positions(&new_end, Duration::from_secs(120))
        .expect("the new topic archived after the gap was accepted");
    stage
        .process
        .wait_until("ready again", Duration::from_secs(30), || {
            Ok(answers_200(&readyz))
        })
        .expect("ready again");
    assert_eq!(stage.metric("contrail_consumer_gap_held", ""), 0.0, "no gap held");
    assert!(stage.status().expect("status").gaps.is_empty());
    stage.process.terminate(Duration::from_secs(30)).expect("SIGTERM");

    let mut every_id = before_ids;
    every_id.extend(identities(after));
    let reports = verify_tables(
        &root,
        &dir.join("verify"),
        &[("events", every_id)].into_iter().collect(),
        &topics.app_ids(1),
    )
    .expect("reader");
    let events = &reports["events"];
    assert_eq!(
        (events.rows, events.distinct, events.missing, events.unexpected),
        (400, 400, 0, 0),
        "missing {:?}, unexpected {:?}",
        events.missing_sample,
        events.unexpected_sample
    );
    assert_eq!(
        events
            .txn
            .get(&format!("events-{events_topic}-0"))
            .copied()
            .flatten(),
        Some(100),
        "the partition's position is the new topic's"
    );
}

/// `flight_key#event_id` of each encoded event.
fn identities(records: &[(String, Vec<u8>)]) -> Vec<String> {
    records
        .iter()
        .map(|(_, payload)| {
            use prost::Message as _;
            let event = contrail_proto::v1::OperationalEvent::decode(payload.as_slice()).expect("event");
            format!("{}#{}", event.flight_key, event.event_id)
        })
        .collect()
}
