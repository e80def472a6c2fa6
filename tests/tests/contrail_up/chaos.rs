//! The platform under chaos is exactly-once: a month of flights, a scaled platform, a recorded
//! feed file, chaos that goes on after the summary, and the hour-long run with a broker restart.

use super::check::{ChaosRun, replay_with_chaos_and_check};
use super::*;

#[test]
fn contrail_up_replays_a_month_with_chaos_and_every_store_is_exactly_once() {
    let _ = replay_with_chaos_and_check(ChaosRun {
        name: "contrail-up-month",
        args: &[
            "--from",
            "2013-01-01",
            "--to",
            "2013-01-31",
            "--rate",
            "4000",
            "--straggler-rate",
            "0.005",
            "--chaos",
            "--chaos-interval-s",
            "3",
            "--chaos-min-kills",
            "2",
            "--chaos-freeze-cosmos-s",
            "10",
            "--drain-timeout-s",
            "600",
        ],
        min_events: 150_000,
        min_duplicates: 10_000,
        min_kills: 2,
        settle: Duration::from_secs(900),
        while_up: None,
    });
}

/// `contrail up --scale`: two instances of every consumer stage share the work — dedup-state's
/// shards split between two processes whose checkpoints dedup-state-0 coordinates (and one of
/// them loses its volume), cosmos-writer and delta-archiver each a consumer group of two,
/// changefeed-sync's second instance standing by for the lease — chaos kills every instance, and
/// every store is checked against the test's own expectation as in the month run.
#[test]
fn a_scaled_platform_under_chaos_is_exactly_once() {
    let dir = std::cell::RefCell::new(None);
    let remember_dir = |up: &UpUnderTest, summary: &serde_json::Value| {
        *dir.borrow_mut() = Some(up.workdir.clone());
        instances_share_the_work(up, summary);
    };
    let summary = replay_with_chaos_and_check(ChaosRun {
        name: "contrail-up-scaled",
        args: &[
            "--scale",
            "dedup-state=2,cosmos-writer=2,delta-archiver=2",
            "--scale",
            "changefeed-sync=2",
            "--from",
            "2013-03-01",
            "--to",
            "2013-03-07",
            "--rate",
            "3000",
            "--straggler-rate",
            "0.005",
            "--chaos",
            "--chaos-interval-s",
            "2",
            "--chaos-min-kills",
            "1",
            "--chaos-volume-losses",
            "2",
            "--drain-timeout-s",
            "600",
        ],
        min_events: 40_000,
        min_duplicates: 3_000,
        min_kills: 1,
        settle: Duration::from_secs(900),
        while_up: Some(&remember_dir),
    });
    // Both volume losses happened, each told what the instance recovers from: the newest
    // complete checkpoint, or — when chaos kept every checkpoint round from completing — its
    // partitions from the start (the exactly-once checks above hold either way).
    let workdir = dir.borrow().clone().expect("the platform's working directory");
    let output = std::fs::read_to_string(workdir.parent().expect("test dir").join("contrail-up.log"))
        .expect("contrail up's output");
    for instance in ["dedup-state-0", "dedup-state-1"] {
        let loss = output
            .lines()
            .find(|line| line.starts_with(&format!("chaos: kill -9 {instance} and delete its volume")))
            .unwrap_or_else(|| panic!("{instance} lost its volume"));
        let log = std::fs::read_to_string(workdir.join("logs").join(format!("{instance}.log")))
            .expect("the instance's log");
        if loss.contains("restores the newest complete checkpoint") {
            assert!(
                log.contains("restored epoch"),
                "{instance} restored a checkpoint: {loss}"
            );
        }
        println!("{loss}");
    }
    let kills = summary["kills"].as_object().expect("kills per instance");
    for instance in [
        "ingest",
        "dedup-state-0",
        "dedup-state-1",
        "cosmos-writer-0",
        "cosmos-writer-1",
        "changefeed-sync-0",
        "changefeed-sync-1",
        "delta-archiver-0",
        "delta-archiver-1",
    ] {
        assert!(kills.contains_key(instance), "{instance} ran: {kills:?}");
    }
    assert_eq!(kills.len(), 9, "nothing else ran: {kills:?}");
}

/// `contrail admin status --json` of the scaled platform: each instance answers under its own
/// name, the consumers' instances each own partitions and no partition twice, one
/// changefeed-sync instance holds the change feed's lease.
fn instances_share_the_work(up: &UpUnderTest, _summary: &serde_json::Value) {
    // After the chaos the groups settle; give a rejoining instance its partitions back.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (ok, stdout, stderr) = contrail(up, &["admin", "status", "--json"]);
        let problem = if ok {
            let rows: Vec<serde_json::Value> = stdout.lines().map(json_of).collect();
            shared_work_problem(&rows)
        } else {
            Some(format!("contrail admin status failed: {stderr}"))
        };
        match problem {
            None => return,
            Some(problem) if std::time::Instant::now() > deadline => {
                panic!("the instances do not share the work: {problem}\n{stdout}")
            }
            Some(_) => std::thread::sleep(Duration::from_secs(2)),
        }
    }
}

/// What is wrong with how the instances in `rows` (admin status JSON lines) share the work.
fn shared_work_problem(rows: &[serde_json::Value]) -> Option<String> {
    let of = |stage: &str| -> Vec<&serde_json::Value> {
        rows.iter().filter(|row| row["stage"] == stage).collect()
    };
    for stage in [
        "dedup-state",
        "cosmos-writer",
        "delta-archiver",
        "changefeed-sync",
    ] {
        let instances: BTreeSet<&str> = of(stage)
            .iter()
            .filter(|row| row["up"] == true)
            .filter_map(|row| row["instance"].as_str())
            .collect();
        let expected: BTreeSet<String> = (0..2).map(|index| format!("{stage}-{index}")).collect();
        if instances
            .iter()
            .map(|name| (*name).to_owned())
            .collect::<BTreeSet<_>>()
            != expected
        {
            return Some(format!("{stage}: instances answering {instances:?}"));
        }
    }
    for stage in ["dedup-state", "cosmos-writer", "delta-archiver"] {
        let mut owned = BTreeSet::new();
        for row in of(stage) {
            let partitions = row["partitions"].as_array().cloned().unwrap_or_default();
            if partitions.is_empty() {
                return Some(format!("{} owns no partition", row["instance"]));
            }
            for partition in partitions {
                let key = (partition["topic"].to_string(), partition["partition"].to_string());
                if !owned.insert(key.clone()) {
                    return Some(format!("{stage}: {key:?} owned twice"));
                }
            }
        }
        if stage == "dedup-state" && owned.len() != 4 {
            return Some(format!(
                "dedup-state owns {} of the 4 raw partitions",
                owned.len()
            ));
        }
    }
    let holders: Vec<&serde_json::Value> = of("changefeed-sync")
        .into_iter()
        .filter(|row| {
            row["leases"]
                .as_array()
                .is_some_and(|leases| leases.iter().any(|lease| lease["owner"] == row["instance"]))
        })
        .collect();
    if holders.is_empty() {
        return Some("no changefeed-sync instance holds a lease".to_owned());
    }
    None
}

#[test]
fn contrail_up_runs_a_recorded_feed_file_with_chaos_and_every_store_is_exactly_once() {
    // A recorded feed: three days of deliveries (duplicates, disorder, stragglers) written by
    // `contrail replay --output`, stored as one JSON array, gzip-compressed.
    let feed_dir = test_dir("contrail-up-feed");
    let ndjson = feed_dir.join("feed.ndjson");
    let written =
        std::process::Command::new(contrail_testkit::workspace_binary("contrail").expect("contrail"))
            .args([
                "replay",
                "--from",
                "2013-06-10",
                "--to",
                "2013-06-12",
                "--seed",
                "23",
                "--quiet",
            ])
            .arg("--output")
            .arg(&ndjson)
            .output()
            .expect("record the feed");
    assert!(
        written.status.success(),
        "{}",
        String::from_utf8_lossy(&written.stderr)
    );
    let events: Vec<serde_json::Value> = std::fs::read_to_string(&ndjson)
        .expect("feed")
        .lines()
        .map(|line| serde_json::from_str(line).expect("json line"))
        .collect();
    let distinct: BTreeSet<(String, String)> = events
        .iter()
        .map(|event| {
            let flight = &event["flight"];
            (
                flight.to_string(),
                event["event_id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert!(
        distinct.len() > 15_000,
        "three days of events: {}",
        distinct.len()
    );
    let flights: BTreeSet<String> = events.iter().map(|event| event["flight"].to_string()).collect();
    let feed = feed_dir.join("feed.json.gz");
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    serde_json::to_writer(&mut encoder, &events).expect("write the array");
    std::fs::write(&feed, encoder.finish().expect("finish")).expect("write the feed");
    let feed = feed.to_str().expect("utf-8 path").to_owned();
    let summary = replay_with_chaos_and_check(ChaosRun {
        name: "contrail-up-input",
        args: &[
            "--input",
            &feed,
            "--rate",
            "3000",
            "--chaos",
            "--chaos-interval-s",
            "3",
            "--chaos-min-kills",
            "1",
            "--drain-timeout-s",
            "600",
        ],
        min_events: distinct.len() as u64,
        // Most of the file's redeliveries (one of a late event counts as late, not duplicate).
        min_duplicates: (events.len() - distinct.len()) * 9 / 10,
        min_kills: 1,
        settle: Duration::from_secs(600),
        while_up: None,
    });
    // The file's events, not generated ones.
    assert_eq!(summary["distinct_events"].as_u64(), Some(distinct.len() as u64));
    assert_eq!(
        summary["flights"].as_u64(),
        Some(flights.len() as u64),
        "{summary:#}"
    );
    let _ = std::fs::remove_dir_all(&feed_dir);
}

/// `--chaos-keep-going`: once the summary is printed, chaos goes on killing stages while the
/// platform stays up, and the supervisor restarts every one of them; Ctrl-C still stops cleanly.
#[test]
fn chaos_goes_on_after_the_summary_when_asked_and_every_killed_stage_comes_back() {
    let dir = test_dir("contrail-up-chaos-keep-going");
    let mut up = UpUnderTest::start(
        &dir,
        &[
            "--from",
            "2013-03-05",
            "--to",
            "2013-03-05",
            "--limit",
            "3000",
            "--chaos",
            "--chaos-keep-going",
            "--chaos-interval-s",
            "1.5",
            "--chaos-min-kills",
            "1",
        ],
    )
    .expect("contrail up starts");
    let summary = up
        .wait_summary(Duration::from_secs(600))
        .expect("contrail up settles");
    assert_eq!(summary["passed"], true, "{:#}", summary["checks"]);
    let after_summary = |output: &str| -> Vec<String> {
        output
            .split_once("chaos: going on while the platform runs")
            .map(|(_, after)| {
                after
                    .lines()
                    .filter(|line| line.contains("chaos: kill -9"))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let started = std::time::Instant::now();
    let kills = loop {
        let kills = after_summary(&up.output());
        if kills.len() >= 3 {
            break kills;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "three kills after the summary; output:\n{}",
            up.output_tail(30)
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    println!("after the summary:\n{}", kills.join("\n"));
    assert!(
        kills.iter().all(|line| line.contains("restarted as pid")),
        "every killed stage was restarted: {kills:?}"
    );
    // The board still answers with the platform's phase.
    let meta = up.meta().expect("the board answers");
    assert!(
        meta["phase"].as_str().unwrap_or_default().starts_with("done"),
        "{meta}"
    );
    let status = up.interrupt(Duration::from_secs(90)).expect("stops");
    assert!(
        status.success(),
        "contrail up exited with {status}:\n{}",
        up.output_tail(30)
    );
}

/// The large chaos run of exactly-once: five months (> 1,000,000 deliveries), at least
/// 50 `kill -9` over all stages, two `kill -9` of the broker (its data on disk: nisshi on
/// SQLite), a lost dedup-state volume and the Cosmos endpoint frozen for 60 s, checked exactly as
/// the month above. `scripts/chaos-large.sh` runs it and records its output in
/// docs/chaos-large-run.txt.
#[test]
#[ignore = "minutes of 2 cores (about 9): run by scripts/chaos-large.sh"]
fn a_large_chaos_run_with_a_broker_restart_and_a_lost_volume_is_exactly_once() {
    // `CONTRAIL_CHAOS_LARGE_BROKER=memory` (scripts/chaos-large.sh --memory-broker): the broker
    // keeps its data in memory and is not restarted, as the runs before the durable broker did.
    let memory_broker = std::env::var("CONTRAIL_CHAOS_LARGE_BROKER").is_ok_and(|broker| broker == "memory");
    let broker_args: &[&str] = if memory_broker {
        &[]
    } else {
        &["--durable-broker", "--chaos-broker-restarts", "2"]
    };
    let args: Vec<&str> = [
        "--from",
        "2013-01-01",
        "--to",
        "2013-05-31",
        "--rate",
        "3000",
        "--straggler-rate",
        "0.005",
        "--chaos",
        "--chaos-interval-s",
        "5",
        "--chaos-min-kills",
        "10",
        "--chaos-volume-losses",
        "1",
        "--chaos-freeze-cosmos-s",
        "60",
        "--drain-timeout-s",
        "1800",
    ]
    .into_iter()
    .chain(broker_args.iter().copied())
    .collect();
    let _ = replay_with_chaos_and_check(ChaosRun {
        name: "contrail-up-large",
        args: &args,
        min_events: 900_000,
        min_duplicates: 10_000,
        min_kills: 10,
        settle: Duration::from_secs(4 * 3600),
        while_up: None,
    });
}
