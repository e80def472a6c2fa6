//! dedup-state benchmark. Runs the real `dedup-state` binary (from the same target directory as
//! this benchmark) against its own tansu broker and prints, in one run:
//!
//! - the baselines: a plain consumer reading the whole raw topic (the broker's consume ceiling),
//!   and a pass-through that also produces as many outputs as the stage (its I/O without logic);
//! - saturation: dedup-state processing the same backlog from empty state (events/s, from the
//!   first processed record to caught-up with every output acknowledged), peak RSS, state size;
//! - a checkpoint of that state (barrier → manifest);
//! - recovery after `kill -9` (restart → every shard reopened and assigned) and after losing the
//!   volume (restart → every shard restored from the checkpoint store, then caught up);
//! - latency at a fixed offered load: raw record append → `FlightState` produced, p50/p99.
//!
//! Run (the dev profile optimises dependencies and the hot crates; see Cargo.toml):
//! `cargo build --workspace --all-targets && $CARGO_TARGET_DIR/debug/bench-dedup`. The stage as
//! shipped (release): `cargo build --release -p contrail-dedup-state --bin dedup-state` and
//! `CONTRAIL_TEST_BIN_DEDUP_STATE=$CARGO_TARGET_DIR/release/dedup-state` (the benchmark's own
//! process is not measured).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common.rs"]
mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use common::{bucket_difference, bucket_quantile, histogram_buckets, percentile, process_cpu_seconds};
use contrail_flightdata::ReplayConfig;
use contrail_proto::v1::FlightState;
use contrail_testkit::dedup::{
    DedupOptions, DedupTopics, DedupUnderTest, produce_events, replay_events, start_dedup_state,
};
use contrail_testkit::{Broker, TopicReader, create_topics, http_get, read_topic, test_producer};
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
    /// A TOML configuration file for dedup-state (e.g. `[kafka.properties]` to try librdkafka
    /// settings); the stage runs on the benchmark's settings otherwise.
    #[arg(long)]
    stage_config: Option<std::path::PathBuf>,
    /// Threads running the stage's batches (`batch.threads`; default: the stage's own, one per
    /// CPU).
    #[arg(long)]
    threads: Option<usize>,
    /// Start the latency phase with a cold producer (no warm-up record, no metadata look-up
    /// before the first slice): what the phase measured before its producer was warmed up.
    #[arg(long)]
    cold_producer: bool,
}

/// What the pass-through baseline measured.
struct PassThrough {
    events_per_second: f64,
    cpu_us_per_event: f64,
    broker_cpu_us_per_event: f64,
    outputs: usize,
}

/// The stage's I/O without its logic: reads the raw topic (4 partitions, from the beginning) and,
/// for each record whose payload it has not seen (what the stage accepts), produces two records —
/// the stage writes a `FlightState` and the accepted event — with the stage's producer settings
/// (idempotent, acks from all replicas, no delivery timeout), until every output is acknowledged.
fn pass_through(broker: &Broker, raw: &str, expected: usize) -> Result<PassThrough> {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    use rdkafka::{Offset, TopicPartitionList};
    let outputs = [format!("{raw}.through.a"), format!("{raw}.through.b")];
    create_topics(&broker.address, &[&outputs[0], &outputs[1]], 4)?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &broker.address)
        .set("group.id", format!("pass-through-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .create()
        .context("consumer")?;
    let mut assignment = TopicPartitionList::new();
    for partition in 0..4 {
        assignment.add_partition_offset(raw, partition, Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &broker.address)
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "0")
        .create()
        .context("producer")?;
    let mut seen = std::collections::HashSet::new();
    let (mut read, mut produced) = (0usize, 0usize);
    let (cpu, broker_cpu) = (
        process_cpu_seconds(std::process::id()),
        process_cpu_seconds(broker.pid()),
    );
    let started = Instant::now();
    while read < expected {
        if started.elapsed() > Duration::from_secs(300) {
            anyhow::bail!("pass-through read {read} of {expected} records in 300 s");
        }
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = message?;
        read += 1;
        let payload = message.payload().unwrap_or_default();
        if !seen.insert(payload.to_vec()) {
            continue;
        }
        for topic in &outputs {
            let mut record = BaseRecord::to(topic).payload(payload);
            if let Some(key) = message.key() {
                record = record.key(key);
            }
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((
                        rdkafka::error::KafkaError::MessageProduction(
                            rdkafka::types::RDKafkaErrorCode::QueueFull,
                        ),
                        back,
                    )) => {
                        record = back;
                        producer.poll(Duration::from_millis(1));
                    }
                    Err((error, _)) => return Err(error.into()),
                }
            }
            produced += 1;
        }
    }
    producer.flush(Duration::from_secs(300)).context("flush")?;
    let elapsed = started.elapsed().as_secs_f64();
    Ok(PassThrough {
        events_per_second: read as f64 / elapsed,
        cpu_us_per_event: (process_cpu_seconds(std::process::id()) - cpu) * 1e6 / read as f64,
        broker_cpu_us_per_event: (process_cpu_seconds(broker.pid()) - broker_cpu) * 1e6 / read as f64,
        outputs: produced,
    })
}

/// A producer with its connection, producer id and `topic`'s metadata in place: one record sent
/// to a topic of its own and flushed, then `topic`'s metadata read.
fn warm_producer(brokers: &str, topic: &str) -> Result<ThreadedProducer<DefaultProducerContext>> {
    let producer = test_producer(brokers)?;
    let warm_up = format!("{topic}-warm-up");
    create_topics(brokers, &[&warm_up], 1)?;
    producer
        .send(BaseRecord::<(), [u8]>::to(&warm_up).payload(&b"warm-up"[..]))
        .map_err(|(error, _)| error)?;
    producer.flush(Duration::from_secs(30))?;
    producer
        .client()
        .fetch_metadata(Some(topic), Duration::from_secs(10))?;
    Ok(producer)
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
    drop(raw);
    let through = pass_through(&broker, &topics.raw, backlog.len())?;
    println!(
        "baseline: pass-through (consume, produce 2 per new event) {:>6.0} events/s; CPU per event: it {:.1} µs, broker {:.1} µs  ({} outputs)",
        through.events_per_second, through.cpu_us_per_event, through.broker_cpu_us_per_event, through.outputs
    );

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
        ]
        .into_iter()
        .chain(
            args.stage_config
                .iter()
                .map(|file| ("CONTRAIL_CONFIG_FILE".to_owned(), file.display().to_string())),
        )
        .chain(
            args.threads
                .map(|threads| ("CONTRAIL_BATCH__THREADS".to_owned(), threads.to_string())),
        )
        .collect(),
    })?;
    // Saturation: from the first processed record to caught up (group join excluded).
    while processed(&stage) == 0.0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    let first = Instant::now();
    let (stage_cpu, broker_cpu) = (
        process_cpu_seconds(stage.process.pid()),
        process_cpu_seconds(broker.pid()),
    );
    let status = stage.wait_caught_up(4, Duration::from_secs(900))?;
    let elapsed = first.elapsed().as_secs_f64();
    let (stage_cpu, broker_cpu) = (
        process_cpu_seconds(stage.process.pid()) - stage_cpu,
        process_cpu_seconds(broker.pid()) - broker_cpu,
    );
    let records = status.counters.get("records_total").copied().unwrap_or(0.0);
    let state_mib = status.partitions.iter().map(|p| p.state_bytes).sum::<u64>() as f64 / 1_048_576.0;
    println!(
        "batch threads of dedup-state: {}",
        args.threads.map_or_else(
            || format!(
                "its default, one per CPU ({})",
                std::thread::available_parallelism().map_or(1, usize::from)
            ),
            |threads| threads.to_string()
        )
    );
    println!(
        "dedup-state, saturated, from empty state:         {:>10.0} events/s = {:.0} % of the pass-through, {:.0} % of the plain consumer  ({records:.0} records in {elapsed:.1} s; accepted {:.0}, duplicates {:.0}, late {:.0})",
        records / elapsed,
        100.0 * records / elapsed / through.events_per_second,
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
        "  CPU per event: dedup-state {:.1} µs, broker {:.1} µs (process user + system time, /proc)",
        stage_cpu * 1e6 / records,
        broker_cpu * 1e6 / records,
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
    let pause = histogram_buckets(
        &http_get(&format!("{}/metrics", stage.http_url))?,
        "contrail_dedup_checkpoint_pause_seconds",
    );
    println!(
        "  processing thread paused for it (handing out 4 shards' checkpoint handles): ≤ {:.1} ms",
        bucket_quantile(&pause, 1.0) * 1e3
    );
    let started = Instant::now();
    let epoch = stage.trigger_checkpoint()?;
    println!(
        "checkpoint epoch {epoch} right after (unchanged SST files copied inside the store, not uploaded): {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );

    let join = group_join_seconds(&broker.address, &topics.raw)?;
    println!(
        "baseline: a plain consumer joining a new group on this broker, until the 4 partitions are assigned: {join:.2} s"
    );
    // The topic is idle: its ends are known before the restarts, so the timings below hold only
    // the stage's own work (reading the ends waits 1.5 s for quiescence).
    let ends = stage.raw_ends()?;
    let recover = |stage: &mut DedupUnderTest, what: &str| -> Result<()> {
        let started = Instant::now();
        stage.restart()?;
        let ready = started.elapsed().as_secs_f64();
        stage.wait_assigned(4, Duration::from_secs(120))?;
        let assigned = started.elapsed().as_secs_f64();
        stage.wait_caught_up_to(4, &ends, Duration::from_secs(300))?;
        let caught_up = started.elapsed().as_secs_f64();
        println!(
            "{what}: {caught_up:.2} s (process start → ready {ready:.2} s → 4 shards owned {assigned:.2} s → caught up; {:.2} s after assignment)",
            caught_up - assigned
        );
        Ok(())
    };
    stage.process.kill9();
    recover(&mut stage, "recovery after kill -9 (shards reopened)")?;
    stage.process.terminate(Duration::from_secs(30))?;
    std::fs::remove_dir_all(stage.dir.join("shards")).context("delete shards")?;
    recover(
        &mut stage,
        "recovery of a lost volume (shards restored from the checkpoint)",
    )?;

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
    let age_metric = "contrail_dedup_record_age_seconds";
    let ages_before = histogram_buckets(&http_get(&format!("{}/metrics", stage.http_url))?, age_metric);
    // One producer for the whole phase (a producer per slice would cost a connection each),
    // warmed up before the phase starts: its first records would otherwise wait for its
    // connection, producer id and the topic's metadata while their create-time stamps run.
    // `--cold-producer`: created as the phase starts, as before the warm-up was added.
    let warm = if args.cold_producer {
        None
    } else {
        Some(warm_producer(&broker.address, &topics.raw)?)
    };
    // The broker's own latency, as a baseline: a plain reader of the raw topic, past the backlog
    // before the phase starts and fetching as the stage does (at most 100 ms of fetch wait),
    // stamps each live record when it receives it (10 ms resolution).
    let mut baseline_reader =
        TopicReader::open_with_fetch_wait(&broker.address, &topics.raw, Duration::from_millis(100))?;
    baseline_reader.read_at_least(backlog.len(), Duration::from_secs(300))?;
    let live_start_ms = chrono::Utc::now().timestamp_millis();
    let producer = match warm {
        Some(warm) => warm,
        None => test_producer(&broker.address)?,
    };
    let reading = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let baseline_thread = {
        let reading = reading.clone();
        std::thread::spawn(move || -> Result<Vec<f64>> {
            let mut latencies = Vec::new();
            let mut stamped = baseline_reader.messages().len();
            while reading.load(std::sync::atomic::Ordering::Relaxed) {
                baseline_reader.poll_for(Duration::from_millis(10))?;
                let now_ms = chrono::Utc::now().timestamp_millis();
                for message in &baseline_reader.messages()[stamped..] {
                    if let Some(appended) = timestamp_ms(message).filter(|ms| *ms >= live_start_ms) {
                        latencies.push((now_ms - appended) as f64);
                    }
                }
                stamped = baseline_reader.messages().len();
            }
            Ok(latencies)
        })
    };
    let started = Instant::now();
    let pause_before = histogram_buckets(
        &http_get(&format!("{}/metrics", stage.http_url))?,
        "contrail_dedup_checkpoint_pause_seconds",
    );
    // Halfway through the live phase a checkpoint round runs, as the coordinator's interval would
    // start one: the records appended while it runs show whether processing stalls for it.
    let slices = live.chunks(per_slice).count();
    let checkpoint_window = std::thread::scope(|scope| -> Result<(i64, i64)> {
        let mut round = None;
        for (index, slice) in live.chunks(per_slice).enumerate() {
            if index == slices / 2 {
                round = Some(scope.spawn(|| -> Result<(i64, i64)> {
                    let from = chrono::Utc::now().timestamp_millis();
                    stage.trigger_checkpoint()?;
                    Ok((from, chrono::Utc::now().timestamp_millis()))
                }));
            }
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
        round
            .context("the live phase has no slices")?
            .join()
            .map_err(|_| anyhow::anyhow!("the checkpoint round panicked"))?
    })?;
    producer.flush(Duration::from_secs(60))?;
    let offered = live.len() as f64 / started.elapsed().as_secs_f64();
    stage.wait_caught_up(4, Duration::from_secs(300))?;
    let ages = bucket_difference(
        &ages_before,
        &histogram_buckets(&http_get(&format!("{}/metrics", stage.http_url))?, age_metric),
    );
    println!(
        "  record age when dedup-state processes it (its histogram, live phase): p50 ≤ {:.0} ms, p99 ≤ {:.0} ms",
        bucket_quantile(&ages, 0.5) * 1000.0,
        bucket_quantile(&ages, 0.99) * 1000.0
    );
    std::thread::sleep(Duration::from_millis(500));
    reading.store(false, std::sync::atomic::Ordering::Relaxed);
    let mut plain = baseline_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the raw reader panicked"))??;
    plain.sort_by(f64::total_cmp);
    println!(
        "baseline latency (raw append → a plain reader receives it, {} records): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        plain.len(),
        percentile(&plain, 0.5),
        percentile(&plain, 0.99),
        plain.last().copied().unwrap_or(f64::NAN)
    );
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
    // Every state the stage wrote: read until nothing new arrives for 2 s.
    let mut curated = TopicReader::open(&broker.address, &topics.curated)?;
    while curated.poll_for(Duration::from_secs(2))? > 0 {}
    // (raw append ms, latency ms) of every state produced for a live record, by append time.
    let mut live_states: Vec<(i64, f64)> = curated
        .messages()
        .iter()
        .filter_map(|message| {
            let state = FlightState::decode(message.payload()?).ok()?;
            let input = state.input?;
            let appended = *appended.get(&(input.partition, input.offset))?;
            (appended >= live_start_ms).then_some(())?;
            Some((appended, (timestamp_ms(message)? - appended) as f64))
        })
        .collect();
    live_states.sort_by(|a, b| a.1.total_cmp(&b.1));
    let latencies: Vec<f64> = live_states.iter().map(|(_, latency)| *latency).collect();
    println!(
        "latency at {offered:.0} events/s offered (raw append → FlightState produced, {} states): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(f64::NAN)
    );
    let (from_ms, to_ms) = checkpoint_window;
    let during: Vec<f64> = live_states
        .iter()
        .filter(|(appended, _)| (from_ms..=to_ms).contains(appended))
        .map(|(_, latency)| *latency)
        .collect();
    let pause = bucket_difference(
        &pause_before,
        &histogram_buckets(
            &http_get(&format!("{}/metrics", stage.http_url))?,
            "contrail_dedup_checkpoint_pause_seconds",
        ),
    );
    println!(
        "  during the live checkpoint round ({} ms, {} states of records appended in it): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; processing thread paused ≤ {:.1} ms",
        to_ms - from_ms,
        during.len(),
        percentile(&during, 0.5),
        percentile(&during, 0.99),
        during.last().copied().unwrap_or(f64::NAN),
        bucket_quantile(&pause, 1.0) * 1e3
    );
    stage.process.terminate(Duration::from_secs(30))?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// How long a plain consumer takes from subscribing to a new group on `topic` until the broker
/// assigned it every partition: the group protocol's share of any restart.
fn group_join_seconds(brokers: &str, topic: &str) -> Result<f64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let partitions = {
        let probe: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers).create()?;
        let metadata = probe.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        metadata
            .topics()
            .iter()
            .find(|found| found.name() == topic)
            .map_or(0, |found| found.partitions().len())
    };
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("bench-join-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        // The stage's group settings (contrail_common::kafka and the testkit's deployment).
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("session.timeout.ms", "6000")
        .set("fetch.wait.max.ms", "100")
        .create()?;
    let started = Instant::now();
    consumer.subscribe(&[topic])?;
    while consumer.assignment()?.count() < partitions {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "no assignment of {topic} within 60 s"
        );
        let _ = consumer.poll(Duration::from_millis(10));
    }
    Ok(started.elapsed().as_secs_f64())
}
