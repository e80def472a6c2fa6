//! A restore of a million keys per shard during a rebalance. dedup-state opens shards off its
//! rebalance callback (opener threads), so a member restoring large state goes on serving the
//! group: the member joining meanwhile gets its partitions, nobody's assignment is lost, and the
//! outputs are exactly-once against the independent oracle.

use std::path::Path;
use std::time::{Duration, Instant};

use contrail_state::checkpoints::CheckpointStore;
use contrail_state::protocol::Manifest;
use contrail_state::{
    EngineConfig, InputRecord, KeyContext, Shard, StateError, StatefulProcessor, TimeDomain, Timer,
};
use contrail_testkit::dedup::{
    DedupOptions, DedupTopics, DedupUnderTest, produce_events, realistic_feed, replay_events,
    start_dedup_state,
};
use contrail_testkit::{create_topics, shared_broker, test_dir, unique};

/// Keys in each partition's checkpoint.
const BULK_KEYS: usize = 1_000_000;
/// Partitions of the input: twice the opener threads, so a member restoring all of them takes two
/// rounds of restores (≈ 5 s each here) — time for another member to join meanwhile.
const PARTITIONS: i32 = 8;
/// The bulk keys' timers: event time far beyond any event of the feed (they never fire).
const FAR_FUTURE_US: i64 = 4_102_444_800_000_000; // 2100-01-01

/// Writes one value and one event-time timer per key, as a flight's state and expiry would.
struct Bulk;

impl StatefulProcessor for Bulk {
    fn handle_record(
        &mut self,
        context: &mut KeyContext<'_>,
        record: &InputRecord<'_>,
    ) -> Result<(), StateError> {
        let value = String::from_utf8_lossy(record.payload).into_owned();
        context.set("bulk", &value, None);
        context.register_timer("expire", TimeDomain::EventTime, FAR_FUTURE_US);
        Ok(())
    }

    fn handle_timer(&mut self, _: &mut KeyContext<'_>, _: &Timer) -> Result<(), StateError> {
        Ok(())
    }
}

/// A complete epoch 1 in the checkpoint store at `checkpoints`: every one of `partitions` holds
/// [`BULK_KEYS`] keys (the same shard files uploaded once per partition) and starts at offset 0 —
/// the state of keys the feed never touches, so the oracle's expectation stays that of the feed.
/// Returns the bytes of one shard's checkpoint.
fn bulk_checkpoint(dir: &Path, checkpoints: &Path, partitions: i32) -> u64 {
    let mut shard = Shard::open(&dir.join("bulk-shard"), 0).expect("a shard");
    let engine = EngineConfig {
        allowed_lateness_us: 0,
    };
    let mut processor = Bulk;
    for chunk in 0..BULK_KEYS / 50_000 {
        let owned: Vec<(String, String)> = (chunk * 50_000..(chunk + 1) * 50_000)
            .map(|index| {
                (
                    format!("bulk{index:07}"),
                    format!(
                        "{index:07} B6 {} JFK-LAX N{:05} scheduled",
                        index % 2_000,
                        index % 90_000
                    ),
                )
            })
            .collect();
        // Offset −1: the shard's stored next offset stays 0, where the feed starts.
        let records: Vec<InputRecord<'_>> = owned
            .iter()
            .map(|(key, payload)| InputRecord {
                key: key.as_bytes(),
                payload: payload.as_bytes(),
                offset: -1,
                trace: None,
                timestamp_us: None,
            })
            .collect();
        shard
            .process_batch(&records, &mut processor, &engine, 0)
            .expect("bulk batch");
    }
    assert_eq!(shard.progress().next_offset, Some(0));
    let local = dir.join("bulk-checkpoint");
    shard.checkpoint(&local).expect("RocksDB checkpoint");
    drop(shard);
    let bytes: u64 = std::fs::read_dir(&local)
        .expect("checkpoint files")
        .filter_map(Result::ok)
        .filter_map(|entry| entry.metadata().ok())
        .map(|metadata| metadata.len())
        .sum();
    let store = CheckpointStore::local(checkpoints).expect("checkpoint store");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let mut shards = std::collections::BTreeMap::new();
        for partition in 0..partitions {
            let checkpoint = store.upload_shard(1, partition, 0, &local).await.expect("upload");
            shards.insert(partition, checkpoint);
        }
        store
            .write_manifest(&Manifest {
                epoch: 1,
                partitions: (0..partitions).collect(),
                shards,
                created_at_us: 0,
            })
            .await
            .expect("manifest");
    });
    bytes
}

#[test]
fn a_million_key_restore_during_a_rebalance_stalls_no_member_and_loses_nothing() {
    let broker = shared_broker();
    let topics = DedupTopics::unique();
    create_topics(&broker.address, &[&topics.raw], PARTITIONS).expect("raw topic");
    let dir = test_dir("dedup-large-restore");
    let checkpoints = dir.join("checkpoints");
    let crafted = Instant::now();
    let bytes = bulk_checkpoint(&dir, &checkpoints, PARTITIONS);
    println!(
        "checkpoint of {BULK_KEYS} keys per partition: {} MB per shard, written in {:.1} s",
        bytes / 1_000_000,
        crafted.elapsed().as_secs_f64()
    );
    let events = replay_events((6, 1), (6, 2), realistic_feed(19));
    produce_events(&broker.address, &topics.raw, &events).expect("the feed");

    let group = unique("g");
    let port_a = contrail_testkit::free_port();
    let port_b = contrail_testkit::free_port();
    let peers = format!("[\"http://127.0.0.1:{port_a}\",\"http://127.0.0.1:{port_b}\"]");
    // Heartbeats every 300 ms: a member learns of a rebalance at once (librdkafka's default is 3 s).
    let config = dir.join("dedup-state.toml");
    std::fs::write(
        &config,
        "[kafka.properties]\n\"heartbeat.interval.ms\" = \"300\"\n",
    )
    .expect("config file");
    let config_file = ("CONTRAIL_CONFIG_FILE".to_owned(), config.display().to_string());
    // a joins first and restores every shard (a new volume); b joins while a restores.
    let started = Instant::now();
    let mut a = start_dedup_state(DedupOptions {
        dir: dir.join("a"),
        checkpoint_dir: checkpoints.clone(),
        grpc_port: Some(port_a),
        extra_env: vec![
            ("CONTRAIL_CHECKPOINT__INTERVAL_MS".into(), "0".into()),
            ("CONTRAIL_CHECKPOINT__PEERS".into(), peers),
            config_file.clone(),
        ],
        ..DedupOptions::single(&broker.address, &topics, &group, &dir)
    })
    .expect("instance a");
    a.process
        .wait_until("a is assigned every partition", Duration::from_secs(60), || {
            Ok(if a_log_has(&dir, OPENING) {
                contrail_testkit::Probe::Ready(())
            } else {
                contrail_testkit::Probe::NotYet("no assignment yet".to_owned())
            })
        })
        .expect("a assigned");
    let mut b = start_dedup_state(DedupOptions {
        instance: "dedup-state-1",
        dir: dir.join("b"),
        checkpoint_dir: checkpoints.clone(),
        grpc_port: Some(port_b),
        extra_env: vec![
            ("CONTRAIL_CHECKPOINT__COORDINATOR".into(), "false".into()),
            config_file,
        ],
        ..DedupOptions::single(&broker.address, &topics, &group, &dir)
    })
    .expect("instance b");
    let b_joined = started.elapsed();

    // The group settles with both members owning shards.
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut b_first_owned = None;
    let (owned_a, owned_b) = loop {
        let owned_a = a.status().map(|status| status.partitions.len()).unwrap_or(0);
        let owned_b = b.status().map(|status| status.partitions.len()).unwrap_or(0);
        if owned_b > 0 && b_first_owned.is_none() {
            b_first_owned = Some(started.elapsed());
        }
        if (owned_a > 0 && owned_b > 0 && owned_a + owned_b == PARTITIONS as usize)
            || Instant::now() > deadline
        {
            break (owned_a, owned_b);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        owned_a > 0 && owned_b > 0 && owned_a + owned_b == PARTITIONS as usize,
        "both members own shards: a {owned_a}, b {owned_b}\n--- a\n{}\n--- b\n{}",
        a.process.log_tail(40),
        b.process.log_tail(40)
    );
    let status_a = a
        .wait_caught_up(owned_a, Duration::from_secs(300))
        .expect("a caught up");
    let status_b = b
        .wait_caught_up(owned_b, Duration::from_secs(300))
        .expect("b caught up");
    println!(
        "b started {:.1} s after a, owned its first shard at {:.1} s, settled at a {owned_a} + b {owned_b}",
        b_joined.as_secs_f64(),
        b_first_owned.unwrap_or_default().as_secs_f64()
    );
    let (log_a, log_b) = (a.process.log(), b.process.log());
    for line in log_a.lines().chain(log_b.lines()) {
        if [OPENING, PREPARED, REVOKED, DISCARDED]
            .iter()
            .any(|needle| line.contains(needle))
        {
            println!("{}", plain(line));
        }
    }

    // The rebalance b's join started went through while a was still restoring its first
    // assignment: a gave partitions up before its last restore ended, and closed the shards it
    // was still opening for them. (Restoring inside the rebalance callback, a would only have
    // taken part in the rebalance after every restore.)
    let a_restored = *times(&log_a, PREPARED).iter().max().expect("a restored shards");
    let a_revoked = times(&log_a, REVOKED)[0];
    let b_assigned = times(&log_b, OPENING)[0];
    println!(
        "a's restores ended at {a_restored}; a gave partitions up at {a_revoked}; b was assigned at {b_assigned}"
    );
    assert!(
        a_revoked < a_restored && log_a.contains(DISCARDED),
        "the rebalance waited for a's restores:\n--- a\n{}\n--- b\n{}",
        a.process.log_tail(60),
        b.process.log_tail(60)
    );

    // Every shard either member owns now holds the restored million keys.
    for (name, status) in [("a", &status_a), ("b", &status_b)] {
        for partition in &status.partitions {
            assert!(
                partition.state_bytes >= bytes / 2,
                "{name}'s shard {} holds {} bytes, the restored checkpoint has {bytes}",
                partition.partition,
                partition.state_bytes
            );
        }
    }
    let restores = |status: &contrail_proto::admin::v1::StatusResponse| {
        status.counters.get("restores_total").copied().unwrap_or(0.0)
    };
    assert!(
        restores(&status_a) + restores(&status_b) >= f64::from(PARTITIONS),
        "every partition restored from the checkpoint at least once: a {:?}, b {:?}",
        status_a.counters,
        status_b.counters
    );

    // Nobody was kicked out: no assignment was lost, no rebalance failed, neither process left.
    for (name, stage) in [("a", &mut a), ("b", &mut b)] {
        let log = stage.process.log();
        assert!(
            !log.contains("lost=true") && !log.contains("rebalance error"),
            "{name} lost its assignment:\n{}",
            stage.process.log_tail(60)
        );
        assert!(stage.process.is_running(), "{name} is still running");
    }
    crate::dedup_state::verify(&broker.address, &topics, events.len());
    stop(&mut a);
    stop(&mut b);
}

const OPENING: &str = "partitions assigned; opening their shards";
const PREPARED: &str = "shard prepared";
const REVOKED: &str = "partitions revoked";
const DISCARDED: &str = "revoked meanwhile";

/// A log line without its colours.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(char) = chars.next() {
        if char == '\u{1b}' {
            for next in chars.by_ref() {
                if next == 'm' {
                    break;
                }
            }
        } else {
            out.push(char);
        }
    }
    out
}

/// When the lines of `log` containing `needle` were written (their leading timestamps).
fn times(log: &str, needle: &str) -> Vec<chrono::DateTime<chrono::FixedOffset>> {
    log.lines()
        .filter(|line| line.contains(needle))
        .filter_map(|line| {
            let line = plain(line);
            let stamp = line.split_whitespace().next()?.to_owned();
            chrono::DateTime::parse_from_rfc3339(&stamp).ok()
        })
        .collect()
}

fn a_log_has(dir: &Path, needle: &str) -> bool {
    std::fs::read_to_string(dir.join("a").join("dedup-state.log")).is_ok_and(|log| log.contains(needle))
}

fn stop(stage: &mut DedupUnderTest) {
    let exit = stage.process.terminate(Duration::from_secs(60)).expect("SIGTERM");
    assert!(exit.success(), "graceful stop exits 0: {exit:?}");
}
