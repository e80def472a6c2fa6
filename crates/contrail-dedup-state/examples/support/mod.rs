//! What the engine benchmarks share: a counting allocator over mimalloc, CPU time and peak memory
//! from `/proc`, the input records and their micro-batches, and the measurement and its report.
#![allow(unsafe_code, dead_code)] // the counting allocator; not every benchmark uses every helper

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Instant;

use contrail_dedup_state::config::TopicsConfig;
use contrail_dedup_state::processor::FlightProcessor;
use contrail_flight::flight::Rules;
use contrail_proto::v1::OperationalEvent;
use contrail_state::InputRecord;
use prost::Message;

/// mimalloc, as the stage ships, with a count of allocations.
pub struct Counting;

pub static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Bytes allocated through the Rust allocator and not yet freed (RocksDB's C++ heap is not in it).
pub static HEAP_BYTES: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards every call unchanged to mimalloc; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        HEAP_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HEAP_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        HEAP_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

/// The replayed month and how it is fed to the engine, as both benchmarks take it.
#[derive(Debug, clap::Args)]
pub struct Feed {
    /// Days of January 2013 to replay (31: ≈ 211,000 events).
    #[arg(long, default_value_t = 31)]
    pub days: u32,
    /// RocksDB shards (the stage's input partitions).
    #[arg(long, default_value_t = 4)]
    pub shards: usize,
    /// Records per shard and micro-batch (the stage's default is 2,000).
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
    /// Share of duplicate deliveries.
    #[arg(long, default_value_t = 0.10)]
    pub duplicates: f64,
}

/// One input record: key, encoded event, offset in its shard.
pub struct Input {
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
    pub offset: i64,
}

/// The engine's view of `inputs`.
pub fn input_records(inputs: &[Input]) -> Vec<InputRecord<'_>> {
    inputs
        .iter()
        .map(|input| InputRecord {
            key: &input.key,
            payload: &input.payload,
            offset: input.offset,
            trace: None,
            timestamp_us: None,
        })
        .collect()
}

/// What a run of micro-batches evicted by TTL and how many alerts it emitted.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunTotals {
    pub evicted: usize,
    pub alerts: usize,
}

/// Runs the micro-batches of `inputs` through `shards` (the broker acknowledging every output at
/// once), shards interleaved as the stage's worker does.
pub fn run(
    shards: &mut [contrail_state::Shard],
    processors: &mut [FlightProcessor],
    inputs: &[Vec<Input>],
    batch: usize,
    engine: &contrail_state::EngineConfig,
) -> RunTotals {
    let mut totals = RunTotals::default();
    let alerts_topic = TopicsConfig::default().alerts;
    for (shard, range) in batches(inputs, batch) {
        let records = input_records(&inputs[shard][range]);
        let result = shards[shard]
            .process_batch(&records, &mut processors[shard], engine, 0)
            .expect("process batch");
        totals.evicted += result.evicted;
        totals.alerts += result
            .outputs
            .iter()
            .filter(|(_, output)| output.topic == alerts_topic)
            .count();
        let sequences: Vec<u64> = result.outputs.iter().map(|(sequence, _)| *sequence).collect();
        shards[shard].acknowledge(&sequences).expect("acknowledge");
    }
    totals
}

/// The flight processor of shard `shard`, as the stage builds it.
pub fn flight_processor(rules: Rules, shard: usize) -> FlightProcessor {
    FlightProcessor::new(rules, TopicsConfig::default(), shard as i32, None, 1_000_000)
}

/// CPU time of the calling thread, ns.
pub fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time of the whole process (user + system), ns.
pub fn process_cpu_ns() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    // Fields after the command (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of the line, i.e. 12 and 13 after the command.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|index| fields.get(*index)?.parse::<u64>().ok())
        .sum();
    ticks * 10_000_000 // USER_HZ = 100 on Linux
}

/// Peak resident memory of the process, MiB.
pub fn peak_rss_mib() -> f64 {
    status_mib("VmHWM:")
}

/// Resident memory of the process now, MiB.
pub fn rss_mib() -> f64 {
    status_mib("VmRSS:")
}

fn status_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with(field))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

pub fn fnv1a(hash: &mut u64, bytes: &[u8]) {
    for byte in bytes {
        *hash ^= u64::from(*byte);
        *hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
}

/// The shard (of `shards`) a key goes to.
pub fn shard_of(key: &[u8], shards: usize) -> usize {
    let mut hash = 0xcbf2_9ce4_8422_2325;
    fnv1a(&mut hash, key);
    (hash % shards as u64) as usize
}

pub struct Measured {
    pub seconds: f64,
    pub thread_cpu_ns: u64,
    pub process_cpu_ns: u64,
    pub allocations: u64,
}

impl Measured {
    pub fn per_second(&self, events: usize) -> f64 {
        events as f64 / self.seconds
    }
}

pub fn measure(run: impl FnOnce()) -> Measured {
    let (thread, process, allocations) = (
        thread_cpu_ns(),
        process_cpu_ns(),
        ALLOCATIONS.load(Ordering::Relaxed),
    );
    let started = Instant::now();
    run();
    Measured {
        seconds: started.elapsed().as_secs_f64(),
        thread_cpu_ns: thread_cpu_ns() - thread,
        process_cpu_ns: process_cpu_ns() - process,
        allocations: ALLOCATIONS.load(Ordering::Relaxed) - allocations,
    }
}

pub fn report(name: &str, events: usize, measured: &Measured) {
    let events_f = events as f64;
    println!(
        "{name:<44} {:>9.0} events/s  {:>6.2} µs CPU/event (thread)  {:>6.2} µs CPU/event (process)  {:>6.1} allocations/event",
        events_f / measured.seconds,
        measured.thread_cpu_ns as f64 / 1_000.0 / events_f,
        measured.process_cpu_ns as f64 / 1_000.0 / events_f,
        measured.allocations as f64 / events_f,
    );
}

/// Rounds of micro-batches, shards interleaved as the stage's worker does.
pub fn batches(inputs: &[Vec<Input>], batch: usize) -> Vec<(usize, std::ops::Range<usize>)> {
    let rounds = inputs
        .iter()
        .map(|shard| shard.len().div_ceil(batch))
        .max()
        .unwrap_or(0);
    let mut order = Vec::new();
    for round in 0..rounds {
        for (shard, records) in inputs.iter().enumerate() {
            let start = round * batch;
            if start < records.len() {
                order.push((shard, start..(start + batch).min(records.len())));
            }
        }
    }
    order
}

/// The replay of January 1–`days` 2013 (real flights, `duplicates` of the deliveries duplicated)
/// as the raw topic holds it, spread over `shards` by flight key.
pub fn january(days: u32, duplicates: f64, shards: usize) -> Vec<Vec<Input>> {
    let data_dir = contrail_flightdata::default_data_dir()
        .expect("data/nycflights13 above the working directory (run from the clone) or CONTRAIL_FLIGHT_DATA");
    let from = chrono::NaiveDate::from_ymd_opt(2013, 1, 1);
    let to = chrono::NaiveDate::from_ymd_opt(2013, 1, days);
    let data = contrail_flightdata::FlightData::load(&data_dir, from, to).expect("load flights");
    let config = contrail_flightdata::ReplayConfig {
        duplicate_rate: duplicates,
        ..contrail_flightdata::ReplayConfig::default()
    };
    let limits = contrail_events::Limits::default();
    let mut by_shard: Vec<Vec<Input>> = (0..shards).map(|_| Vec::new()).collect();
    for delivery in contrail_flightdata::ReplayStream::new(data, config) {
        let event: OperationalEvent =
            contrail_events::validate_record(&delivery.event.to_json(), &limits, 0).expect("a valid event");
        let shard = &mut by_shard[shard_of(event.flight_key.as_bytes(), shards)];
        let offset = shard.len() as i64;
        shard.push(Input {
            key: event.flight_key.clone().into_bytes(),
            payload: event.encode_to_vec(),
            offset,
        });
    }
    by_shard
}
