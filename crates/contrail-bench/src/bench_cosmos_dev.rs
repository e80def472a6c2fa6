//! The local Cosmos DB endpoint (`cosmos-dev`) as it fills: does it keep up with the stages?
//!
//! Drives the real `cosmos-dev` binary with the real client and cosmos-writer's own guarded
//! writer (`contrail_cosmos::DocumentWriter`), and at each step of `--step` documents prints, per
//! million documents stored:
//!
//! - new documents: guarded writes of version 1 (an optimistic create each), documents/s;
//! - guarded updates: version 2 of `--updates` stored documents (replace under the ETag), /s;
//! - the change feed as changefeed-sync reads it (`query_change_feed` from a stored
//!   continuation, pages of 100, until every feed range answers an empty page): the step's
//!   changes read as a backlog (changes/s), a caught-up reader's poll after `--probe` new
//!   versions (ms), and a poll finding none (ms);
//! - cosmos-dev's CPU µs per write and its resident memory.
//!
//! The baseline in the same run is the first step (an almost empty store): a stand-in whose
//! costs do not grow with the store prints the same figures at every step.
//!
//! Run (the endpoint in the profile that ships):
//! `cargo build --release -p contrail-cosmos-dev && cargo build -p contrail-bench --bin bench-cosmos-dev`
//! then `CONTRAIL_TEST_BIN_COSMOS_DEV=$CARGO_TARGET_DIR/release/cosmos-dev $CARGO_TARGET_DIR/debug/bench-cosmos-dev`

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common.rs"]
mod common;

use std::num::NonZeroU32;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use azure_data_cosmos::FeedScope;
use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::feed::ContinuationToken;
use azure_data_cosmos::options::{ChangeFeedOptions, ChangeFeedStartFrom, MaxItemCountHint};
use clap::Parser;
use common::process_cpu_seconds;
use contrail_cosmos::writer::{DocumentWriter, Outcome, WriteMetrics};
use contrail_testkit::cosmos::CosmosDev;
use futures::StreamExt;

/// The local Cosmos DB endpoint as it fills (see the crate docs).
#[derive(Parser)]
struct Args {
    /// Documents stored at the end.
    #[arg(long, default_value_t = 3_000_000)]
    documents: u64,
    /// Documents written per step (one line of figures per step).
    #[arg(long, default_value_t = 250_000)]
    step: u64,
    /// Guarded updates measured per step.
    #[arg(long, default_value_t = 5_000)]
    updates: u64,
    /// New versions written between two polls of a caught-up reader, per step.
    #[arg(long, default_value_t = 1_000)]
    probe: u64,
    /// Writes in flight (cosmos-writer's default `batch.concurrency`).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
}

/// Change feed page size (changefeed-sync's default).
const PAGE: u32 = 100;

/// A serving document of flight number `n` at `version` (the fields cosmos-writer writes; the
/// key is unique per `n`).
fn document(n: u64, version: u64) -> (String, serde_json::Value) {
    let key = format!("CB{n:07}-2013-01-01-JFK");
    let value = serde_json::json!({
        "id": key,
        "flightKey": key,
        "carrier": "CB",
        "flightNumber": n % 10_000,
        "origin": "JFK",
        "destination": "LAX",
        "status": if version == 1 { "SCHEDULED" } else { "DEPARTED" },
        "scheduledOut": "2013-01-01T06:00:00Z",
        "scheduledIn": "2013-01-01T12:00:00Z",
        "actualOut": if version == 1 { serde_json::Value::Null } else { serde_json::json!("2013-01-01T06:10:00Z") },
        "gate": "B7",
        "tailNumber": "N123CB",
        "delayCodes": [],
        "version": version,
        "lastEventId": format!("e{version}"),
    });
    (key, value)
}

/// Writes documents `numbers` at `version` through the guarded writer, `concurrency` in flight;
/// writes/s.
async fn write_all(
    writer: &DocumentWriter,
    numbers: std::ops::Range<u64>,
    version: u64,
    concurrency: usize,
) -> Result<f64> {
    let count = numbers.end - numbers.start;
    let started = Instant::now();
    let never = || false;
    let results: Vec<Result<Outcome>> = futures::stream::iter(numbers.map(|n| {
        let never = &never;
        async move {
            let (key, value) = document(n, version);
            writer
                .write(&key, version, &value, never)
                .await
                .map_err(|error| anyhow::anyhow!("{key}: {error}"))
        }
    }))
    .buffer_unordered(concurrency)
    .collect()
    .await;
    for result in results {
        if result? != Outcome::Written {
            bail!("a guarded write of a new version was refused as stale");
        }
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

/// Reads the whole container's change feed from `continuation` until caught up (an empty page);
/// changes read, the new continuation, seconds taken.
async fn drain(
    flights: &ContainerClient,
    continuation: Option<String>,
) -> Result<(u64, Option<String>, f64)> {
    let started = Instant::now();
    let mut options = ChangeFeedOptions::default()
        .with_max_item_count(MaxItemCountHint::Limit(NonZeroU32::new(PAGE).context("page")?));
    if let Some(token) = continuation.clone() {
        options = options.with_continuation_token(ContinuationToken::from_string(token));
    }
    let mut pages = flights
        .query_change_feed::<serde_json::Value>(
            FeedScope::full_container(),
            ChangeFeedStartFrom::Beginning,
            Some(options),
        )
        .await?;
    let (mut read, mut empty) = (0u64, 0);
    let mut token = continuation;
    // One empty page per feed range that has nothing new: as many in a row as there are ranges
    // (four here) means caught up.
    while empty < 4 {
        let Some(page) = pages.next().await else { break };
        let items = page?.into_items();
        if items.is_empty() {
            empty += 1;
        } else {
            empty = 0;
            read += items.len() as u64;
        }
        token = Some(pages.to_continuation_token()?.as_str().to_owned());
    }
    Ok((read, token, started.elapsed().as_secs_f64()))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dir = std::env::temp_dir().join(format!("bench-cosmos-dev-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dev = CosmosDev::start(&dir)?;
    let pid = dev.process.pid();
    println!(
        "cosmos-dev at {} (pid {pid}); {} documents in steps of {}, {} writes in flight",
        dev.endpoint, args.documents, args.step, args.concurrency
    );
    println!(
        "{:>10} {:>10} {:>10} {:>12} {:>12} {:>10} {:>12} {:>9}",
        "stored",
        "creates/s",
        "updates/s",
        "backlog/s",
        "poll+probe ms",
        "poll ms",
        "dev µs/write",
        "dev MiB"
    );
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let containers = dev.containers().await?;
        let registry = contrail_common::metrics::MetricsRegistry::new();
        let metrics = WriteMetrics::new(&registry, ["bench_ru", "bench_retries", "bench_write_seconds"]);
        let writer = DocumentWriter::new(containers.flights.clone(), 1_000_000, metrics);
        // A reader caught up from the start, as changefeed-sync is.
        let (_, mut continuation, _) = drain(&containers.flights, None).await?;
        let mut stored = 0u64;
        while stored < args.documents {
            let end = (stored + args.step).min(args.documents);
            let cpu = process_cpu_seconds(pid);
            let creates = write_all(&writer, stored..end, 1, args.concurrency).await?;
            let updated = stored..(stored + args.updates).min(end);
            let update_count = updated.end - updated.start;
            let updates = write_all(&writer, updated, 2, args.concurrency).await?;
            let writes = (end - stored) + update_count;
            let dev_us = (process_cpu_seconds(pid) - cpu) * 1e6 / writes as f64;
            // The step's changes as a backlog (each document once: the feed keeps its newest
            // version), then `--probe` new versions read by one poll, then a poll finding none.
            let (backlog, token, backlog_s) = drain(&containers.flights, continuation.take()).await?;
            if backlog != end - stored {
                bail!("the change feed gave {backlog} changes of {} documents written", end - stored);
            }
            let probe = stored..(stored + args.probe).min(end);
            let probe_count = probe.end - probe.start;
            write_all(&writer, probe, 3, args.concurrency).await?;
            let (read, token, poll_s) = drain(&containers.flights, token).await?;
            if read != probe_count {
                bail!("the change feed gave {read} changes of {probe_count} new versions");
            }
            let (none, token, empty_s) = drain(&containers.flights, token).await?;
            if none != 0 {
                bail!("a caught-up reader was given {none} changes again");
            }
            continuation = token;
            stored = end;
            println!(
                "{stored:>10} {creates:>10.0} {updates:>10.0} {:>12.0} {:>12.1} {:>10.1} {dev_us:>12.0} {:>9.0}",
                backlog as f64 / backlog_s,
                poll_s * 1e3,
                empty_s * 1e3,
                common::status_mib(&pid.to_string(), "VmRSS").unwrap_or(f64::NAN)
            );
        }
        anyhow::Ok(())
    })?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
