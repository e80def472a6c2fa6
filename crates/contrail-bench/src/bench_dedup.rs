//! dedup-state benchmark. Runs the real `dedup-state` binary (from the same target directory as
//! this benchmark) against its own tansu broker and prints, in one run:
//!
//! - the baseline: a plain consumer reading the whole raw topic (the broker's consume ceiling);
//! - saturation: dedup-state processing the same backlog from empty state (events/s, from the
//!   first processed record to caught-up with every output acknowledged), peak RSS, state size;
//! - a checkpoint of that state (barrier → manifest);
//! - recovery after `kill -9` (restart → every shard reopened and assigned) and after losing the
//!   volume (restart → every shard restored from the checkpoint store, then caught up);
//! - latency at a fixed offered load: raw record append → `FlightState` produced, p50/p99.
//!
//! Run (the dev profile optimises dependencies and the hot crates; see Cargo.toml):
//! `cargo build --workspace --all-targets && $CARGO_TARGET_DIR/debug/bench-dedup`

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common.rs"]
mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use common::percentile;
use contrail_flightdata::ReplayConfig;
use contrail_proto::v1::FlightState;
use contrail_testkit::dedup::{
    DedupOptions, DedupTopics, DedupUnderTest, produce_events, replay_events, start_dedup_state,
};
use contrail_testkit::{Broker, create_topics, read_topic};
use prost::Message as _;
use rdkafka::Message as _;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

/// dedup-state benchmark (see the crate docs).
#[derive(Parser)]
struct Args {
    /// Days of January 2013 in the backlog (about 6,900 events per day).
    #[arg(long, default_value_t = 31)]
    days: u32,
    /// Offered load of the latency phase, events/s.
    #[arg(long, default_value_t = 5_000)]
    rate: u64,
    /// Duration of the latency phase, seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

fn timestamp_ms(message: &rdkafka::message::OwnedMessage) -> Option<i64> {
    message.timestamp().to_millis()
}

fn processed(stage: &DedupUnderTest) -> f64 {
    stage
        .status()
        .ok()
        .and_then(|status| status.counters.get("records_total").copied())
        .unwrap_or(0.0)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let broker = Broker::start()?;
    println!("broker: tansu (memory storage) at {}", broker.address);
    let feed = ReplayConfig {
        duplicate_rate: 0.10,
        ..ReplayConfig::default()
    };
    let backlog = replay_events((1, 1), (1, args.days), feed.clone());
    let topics = DedupTopics::unique();
    create_topics(&broker.address, &[&topics.raw], 4)?;
    let started = Instant::now();
    produce_events(&broker.address, &topics.raw, &backlog)?;
    println!(
        "backlog: {} real events (January 1-{}, 10 % duplicates) produced in {:.1} s",
        backlog.len(),
        args.days,
        started.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    let raw = read_topic(
        &broker.address,
        &topics.raw,
        backlog.len(),
        Duration::from_secs(300),
    )?;
    let baseline = raw.len() as f64 / (started.elapsed().as_secs_f64() - 0.5);
    println!("baseline: plain consumer reads the raw topic        {baseline:>10.0} events/s");

    let dir = std::env::temp_dir().join(format!("bench-dedup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let group = format!("bench-{}", std::process::id());
    let mut stage = start_dedup_state(DedupOptions {
        brokers: &broker.address,
        topics: &topics,
        group: &group,
        instance: "bench-0",
        dir: dir.join("instance"),
        checkpoint_dir: dir.join("checkpoints"),
        grpc_port: None,
        extra_env: vec![
            ("CONTRAIL_CHECKPOINT__INTERVAL_MS".into(), "0".into()),
            // The production setting: a restarted instance rejoins under the same member id and
            // gets its partitions back without waiting for the session timeout.
            ("CONTRAIL_GROUP__STATIC_MEMBERSHIP".into(), "true".into()),
            ("RUST_LOG".into(), "warn".into()),
        ],
    })?;
    // Saturation: from the first processed record to caught up (group join excluded).
    while processed(&stage) == 0.0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    let first = Instant::now();
    let status = stage.wait_caught_up(4, Duration::from_secs(900))?;
    let elapsed = first.elapsed().as_secs_f64();
    let records = status.counters.get("records_total").copied().unwrap_or(0.0);
    let state_mib = status.partitions.iter().map(|p| p.state_bytes).sum::<u64>() as f64 / 1_048_576.0;
    println!(
        "dedup-state, saturated, from empty state:         {:>10.0} events/s = {:.0} % of the baseline  ({records:.0} records in {elapsed:.1} s; accepted {:.0}, duplicates {:.0}, late {:.0})",
        records / elapsed,
        100.0 * records / elapsed / baseline,
        status
            .counters
            .get("events_accepted_total")
            .copied()
            .unwrap_or(0.0),
        status.counters.get("duplicates_total").copied().unwrap_or(0.0),
        status.counters.get("late_events_total").copied().unwrap_or(0.0),
    );
    println!(
        "  peak RSS of dedup-state: {:.0} MiB; state on disk (RocksDB, 4 shards): {state_mib:.1} MiB",
        stage.process.peak_rss_mib().unwrap_or(f64::NAN)
    );

    let started = Instant::now();
    let epoch = stage.trigger_checkpoint()?;
    println!(
        "checkpoint epoch {epoch} (4 shards, barrier → upload → manifest): {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    let started = Instant::now();
    let epoch = stage.trigger_checkpoint()?;
    println!(
        "checkpoint epoch {epoch} right after (unchanged SST files copied inside the store, not uploaded): {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );

    stage.process.kill9();
    let started = Instant::now();
    stage.restart()?;
    stage.wait_caught_up(4, Duration::from_secs(120))?;
    println!(
        "recovery after kill -9 (restart → 4 shards reopened, assigned, caught up): {:.2} s",
        started.elapsed().as_secs_f64()
    );
    stage.process.terminate(Duration::from_secs(30))?;
    std::fs::remove_dir_all(stage.dir.join("shards")).context("delete shards")?;
    let started = Instant::now();
    stage.restart()?;
    stage.wait_caught_up(4, Duration::from_secs(300))?;
    println!(
        "recovery of a lost volume (restart → 4 shards restored from the checkpoint, caught up): {:.2} s",
        started.elapsed().as_secs_f64()
    );

    // Fixed offered load: February events at `rate` per second, in 100 ms slices.
    let live = replay_events(
        (2, 1),
        (2, 28),
        ReplayConfig {
            duplicate_rate: 0.0,
            ..feed
        },
    );
    let count = (args.rate * args.seconds) as usize;
    let live = &live[..count.min(live.len())];
    let per_slice = (args.rate / 10).max(1) as usize;
    let live_start_ms = chrono::Utc::now().timestamp_millis();
    let started = Instant::now();
    // One producer for the whole phase (a producer per slice would cost a connection each).
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &broker.address)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()?;
    for (index, slice) in live.chunks(per_slice).enumerate() {
        for event in slice {
            let payload = event.encode_to_vec();
            let record = BaseRecord::to(&topics.raw)
                .key(&event.flight_key)
                .payload(&payload);
            producer.send(record).map_err(|(error, _)| error)?;
        }
        let due = Duration::from_millis(100 * (index as u64 + 1));
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    producer.flush(Duration::from_secs(60))?;
    let offered = live.len() as f64 / started.elapsed().as_secs_f64();
    stage.wait_caught_up(4, Duration::from_secs(300))?;
    let raw = read_topic(
        &broker.address,
        &topics.raw,
        backlog.len() + live.len(),
        Duration::from_secs(300),
    )?;
    let appended: HashMap<(i32, i64), i64> = raw
        .iter()
        .filter_map(|message| Some(((message.partition(), message.offset()), timestamp_ms(message)?)))
        .collect();
    let curated = read_topic(
        &broker.address,
        &topics.curated,
        usize::MAX,
        Duration::from_secs(20),
    )?;
    let mut latencies: Vec<f64> = curated
        .iter()
        .filter_map(|message| {
            let state = FlightState::decode(message.payload()?).ok()?;
            let input = state.input?;
            let appended = *appended.get(&(input.partition, input.offset))?;
            (appended >= live_start_ms).then_some(())?;
            Some((timestamp_ms(message)? - appended) as f64)
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    println!(
        "latency at {offered:.0} events/s offered (raw append → FlightState produced, {} states): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(f64::NAN)
    );
    stage.process.terminate(Duration::from_secs(30))?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
