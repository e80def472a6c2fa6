//! `contrail backfill serving`: rebuild the serving store (Cosmos DB `flights`) from the history
//! (the Delta `flight_states` table) — after the container was lost, for a new container (a new
//! region, a schema change), or to repair documents.
//!
//! The newest archived version of every flight is written through the same version guard as
//! cosmos-writer's ([`contrail_cosmos::writer::DocumentWriter`]): a document is created when
//! missing, replaced when its version is lower, left alone otherwise. So the backfill is safe
//! while the stream runs — cosmos-writer's newer versions are never overwritten by older history,
//! and whatever cosmos-writer writes after the backfill moves documents further forward — and
//! running it twice is harmless.
//!
//! What the serving store held but the history did not yet (delta-archiver trails the curated
//! topic by its batch latency) would be lost with the container: before reading the history the
//! backfill waits until delta-archiver has archived the curated topic up to where it ends now, so
//! every version cosmos-writer could have written before is in what the backfill reads.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chrono::NaiveDate;
use clap::{Args, Subcommand};
use contrail_common::metrics::MetricsRegistry;
use contrail_cosmos::writer::{Change, DocumentWriter, Outcome, WriteError, WriteMetrics};
use contrail_history::Table;
use contrail_history::reader::scan;
use futures::StreamExt as _;
use indicatif::{ProgressBar, ProgressStyle};
use prost::Message as _;

use crate::stores::archived::{ArchiverWait, wait_for_archiver};
use crate::stores::{longs, records, strings};

/// Options of `contrail backfill`.
#[derive(Args, Debug)]
pub struct BackfillArgs {
    #[command(subcommand)]
    command: BackfillCommand,
}

#[derive(Subcommand, Debug)]
enum BackfillCommand {
    /// Rebuild the serving store from the history: the newest `flight_states` version of every
    /// flight (of the dates asked) written into Cosmos DB through the version guard — safe while
    /// the platform runs, and safe to repeat — and, when the history has a `predictions` table
    /// (the rotation extension), each flight's newest prediction into its fields under their own
    /// guard. Creates the database and container when missing.
    ///
    /// Example, after the `flights` container of a `contrail up` platform was deleted:
    /// `contrail backfill serving --from-delta contrail-up/delta`
    Serving(ServingArgs),
    /// Replay the history's accepted events of a time range (the Delta `events` table) into a
    /// topic of their own, in event-time order, for a fresh dedup-state deployment (its own
    /// state, checkpoints, group and outputs) — to apply changed rules or a new processor to the
    /// past. Not the live raw topic: the running deployment holds these events already.
    ///
    /// Example: `contrail backfill reprocess --from-delta contrail-up/delta --from 2013-01-10
    /// --to 2013-01-12 --to-topic ops.events.reprocess`
    Reprocess(crate::commands::reprocess::ReprocessArgs),
}

/// Options of `contrail backfill serving`.
#[derive(Args, Debug)]
pub struct ServingArgs {
    /// Delta root of the history (a local path or an `abfss://` URL), e.g. the
    /// `delta` directory of a `contrail up` working directory.
    #[arg(long, value_name = "ROOT")]
    from_delta: String,
    /// Only this service date (YYYY-MM-DD); repeat for several. Default: every date.
    #[arg(long = "date", value_name = "YYYY-MM-DD", value_parser = parse_date)]
    dates: Vec<NaiveDate>,
    /// Write into this container instead of the configured flights container (created when
    /// missing, partition key `/flightKey`).
    #[arg(long, value_name = "NAME", env = "CONTRAIL_COSMOS__FLIGHTS_CONTAINER")]
    to_container: Option<String>,
    #[command(flatten)]
    cosmos: crate::args::CosmosArgs,
    /// Port offset of a `contrail up --port-offset N` platform.
    #[arg(long, default_value_t = 0, env = "CONTRAIL_PORT_OFFSET")]
    port_offset: u16,
    /// Guarded writes in flight at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
    concurrency: u16,
    /// Request units per second the backfill may spend (each write's charge as Cosmos DB reports
    /// it), so a rebuild leaves the running platform its share of the container's throughput.
    /// 0: no limit (Cosmos DB's 429s are still retried).
    #[arg(long, default_value_t = 0.0, value_name = "RU")]
    max_ru_per_second: f64,
    /// Read the history as it is, without first waiting for delta-archiver to archive the
    /// curated topic up to its current end (for a history whose platform is gone). Versions the
    /// archiver has not written yet are then not in the rebuild.
    #[arg(long)]
    no_wait_for_archiver: bool,
    /// How long to wait for delta-archiver, in seconds.
    #[arg(long, default_value_t = 300)]
    archiver_timeout_secs: u64,
    /// The curated topic delta-archiver archives into `flight_states`.
    #[arg(long, default_value = contrail_common::topology::topics::CURATED, env = "CONTRAIL_TOPICS__CURATED")]
    curated_topic: String,
    /// The predictions topic delta-archiver archives into `predictions` (waited for when the
    /// history has that table).
    #[arg(long, default_value = contrail_common::topology::topics::PREDICTIONS, env = "CONTRAIL_TOPICS__PREDICTIONS")]
    predictions_topic: String,
    #[command(flatten)]
    kafka: crate::args::KafkaArgs,
    /// No progress bars (what was waited for and the summary are still printed).
    #[arg(long)]
    quiet: bool,
}

fn parse_date(text: &str) -> Result<NaiveDate, String> {
    NaiveDate::parse_from_str(text, "%Y-%m-%d").map_err(|_| format!("{text:?} is not a date YYYY-MM-DD"))
}

/// Runs `contrail backfill`.
pub async fn run(args: BackfillArgs) -> Result<()> {
    match args.command {
        BackfillCommand::Serving(args) => serving(args).await,
        BackfillCommand::Reprocess(args) => crate::commands::reprocess::run(args).await,
    }
}

/// What a restored record is.
#[derive(Debug, Clone, Copy)]
enum Restore {
    /// A `flight_states` record: the flight's document.
    State = 0,
    /// A `predictions` record: its fields of the document.
    Prediction = 1,
}

/// The newest archived version of one flight.
struct Latest {
    version: u64,
    record: Vec<u8>,
}

/// The newest archived record of every flight in `table` (of `dates`, or every date): by flight
/// key, with the rows read and the table's version (`None`: no such table).
async fn newest_records(
    root: &str,
    table: Table,
    dates: &[NaiveDate],
) -> Result<(HashMap<String, Latest>, usize, Option<i64>)> {
    let mut latest: HashMap<String, Latest> = HashMap::new();
    let mut rows = 0usize;
    let mut table_version = None;
    let dates: Vec<Option<NaiveDate>> = if dates.is_empty() {
        vec![None]
    } else {
        dates.iter().copied().map(Some).collect()
    };
    for date in dates {
        let read = scan(
            root,
            &HashMap::new(),
            table,
            date,
            &["flight_key", "version", "record"],
        )
        .await
        .with_context(|| format!("reading {} under {root}", table.name()))?;
        if read.version.is_none() {
            return Ok((latest, rows, None));
        }
        table_version = read.version;
        rows += read.rows();
        for batch in read.batches() {
            let keys = strings(batch, "flight_key")?;
            let versions = longs(batch, "version")?;
            let records = records(batch, table.name())?;
            for (row, (key, version)) in keys.into_iter().zip(versions).enumerate() {
                let (Some(key), Some(version)) = (key, version) else {
                    continue;
                };
                let version = u64::try_from(version).unwrap_or_default();
                let newer = latest.get(&key).is_none_or(|held| held.version < version);
                if newer {
                    latest.insert(
                        key,
                        Latest {
                            version,
                            record: records.value(row).to_vec(),
                        },
                    );
                }
            }
        }
    }
    Ok((latest, rows, table_version))
}

async fn serving(args: ServingArgs) -> Result<()> {
    if !(args.max_ru_per_second >= 0.0 && args.max_ru_per_second.is_finite()) {
        bail!(
            "--max-ru-per-second {}: must be 0 (no limit) or a positive number",
            args.max_ru_per_second
        );
    }
    let started = Instant::now();
    if !args.no_wait_for_archiver {
        wait_for_archiver(ArchiverWait {
            kafka: args.kafka.config(args.port_offset),
            delta_root: &args.from_delta,
            table: Table::FlightStates,
            topic: &args.curated_topic,
            timeout_secs: args.archiver_timeout_secs,
            quiet: args.quiet,
        })
        .await?;
        // The predictions too, when the history has them (a scan of no date: the table's version).
        let never = NaiveDate::from_ymd_opt(1970, 1, 1);
        let predictions = scan(
            &args.from_delta,
            &HashMap::new(),
            Table::Predictions,
            never,
            &["flight_key"],
        )
        .await
        .with_context(|| format!("reading predictions under {}", args.from_delta))?;
        if predictions.version.is_some() {
            wait_for_archiver(ArchiverWait {
                kafka: args.kafka.config(args.port_offset),
                delta_root: &args.from_delta,
                table: Table::Predictions,
                topic: &args.predictions_topic,
                timeout_secs: args.archiver_timeout_secs,
                quiet: args.quiet,
            })
            .await?;
        }
    }

    // The newest version of every flight, from the history.
    let (latest, rows, table_version) =
        newest_records(&args.from_delta, Table::FlightStates, &args.dates).await?;
    if table_version.is_none() {
        bail!(
            "there is no flight_states table under {:?} (is it the Delta root delta-archiver writes to?)",
            args.from_delta
        );
    }
    // And of every flight's prediction, when the history has any (the rotation extension): they
    // were fields of the lost documents too. Written after the states (or before — into stubs —
    // the two compose in either order).
    let (predicted, prediction_rows, _) =
        newest_records(&args.from_delta, Table::Predictions, &args.dates).await?;

    // The serving store: created where missing.
    let endpoint = args.cosmos.endpoint(args.port_offset);
    let mut cosmos = args.cosmos.config(args.port_offset, true);
    if let Some(container) = &args.to_container {
        cosmos.flights_container = container.clone();
    }
    let containers = cosmos
        .open("contrail-backfill")
        .await
        .with_context(|| format!("opening Cosmos DB at {endpoint}"))?;
    let metrics = WriteMetrics::new(
        &MetricsRegistry::new(),
        [
            "contrail_backfill_request_units_total",
            "contrail_backfill_retries_total",
            "contrail_backfill_write_seconds",
        ],
    );
    let writer = Arc::new(DocumentWriter::new(
        containers.flights.clone(),
        4096,
        metrics.clone(),
    ));

    let mut flights: Vec<(String, Latest, Restore)> = latest
        .into_iter()
        .map(|(key, held)| (key, held, Restore::State))
        .collect();
    flights.sort_by(|a, b| a.0.cmp(&b.0));
    let mut predictions: Vec<(String, Latest, Restore)> = predicted
        .into_iter()
        .map(|(key, held)| (key, held, Restore::Prediction))
        .collect();
    predictions.sort_by(|a, b| a.0.cmp(&b.0));
    flights.extend(predictions);
    let progress = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(flights.len() as u64)
    };
    progress.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} flights ({per_sec}, eta {eta}) {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let stopping = Arc::new(AtomicBool::new(false));
    {
        let stopping = stopping.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                stopping.store(true, Ordering::Relaxed);
            }
        });
    }
    let budget = RuBudget::new(args.max_ru_per_second);
    let writing = Instant::now();
    // Per kind (states, predictions): written, already there, failed.
    let mut written = [0u64; 2];
    let mut stale = [0u64; 2];
    let mut failures = [0u64; 2];
    let mut failed: Vec<String> = Vec::new();
    let mut outcomes = futures::stream::iter(flights)
        .map(|(key, held, kind)| {
            let writer = writer.clone();
            let stopping = stopping.clone();
            let metrics = metrics.clone();
            let budget = &budget;
            let write = async move {
                budget.wait(metrics.request_units.get()).await;
                let stop = move || stopping.load(Ordering::Relaxed);
                let outcome = match kind {
                    Restore::State => {
                        let state = contrail_proto::v1::FlightState::decode(held.record.as_slice()).map_err(
                            |error| format!("{key}: the archived record is not a FlightState: {error}"),
                        )?;
                        let document = contrail_flight::document::flight_document(&state);
                        writer.write(&key, held.version, &document, &stop).await
                    }
                    Restore::Prediction => {
                        let prediction = contrail_proto::v1::FlightPrediction::decode(held.record.as_slice())
                            .map_err(|error| {
                                format!("{key}: the archived record is not a FlightPrediction: {error}")
                            })?;
                        let fields = contrail_flight::document::prediction_fields(&prediction);
                        let change = Change::Fields {
                            version: held.version,
                            guard: contrail_flight::document::PREDICTION_GUARD,
                            fields: &fields,
                        };
                        writer.apply(&key, change, &stop).await
                    }
                };
                outcome.map_err(|error| match error {
                    WriteError::Fatal(error) => format!("{key} version {}: {error}", held.version),
                    WriteError::Stopping => format!("{key}: interrupted"),
                })
            };
            async move { (kind, write.await) }
        })
        .buffer_unordered(usize::from(args.concurrency));
    while let Some(outcome) = outcomes.next().await {
        match outcome {
            (kind, Ok(Outcome::Written)) => written[kind as usize] += 1,
            (kind, Ok(Outcome::Stale)) => stale[kind as usize] += 1,
            (kind, Err(error)) => {
                failures[kind as usize] += 1;
                if failed.len() < 5 {
                    progress.println(format!("failed: {error}"));
                }
                failed.push(error);
            }
        }
        progress.inc(1);
        progress.set_message(format!("{:.0} RU", metrics.request_units.get()));
    }
    progress.finish_and_clear();
    let seconds = writing.elapsed().as_secs_f64();
    let [written, written_predictions] = written;
    let [stale, stale_predictions] = stale;
    let [failed_states, failed_predictions] = failures;
    let total = written + stale + failed_states;
    // States and predictions are written in one stream: the rate counts both.
    let documents = total + written_predictions + stale_predictions + failed_predictions;
    println!(
        "backfill serving: {total} flights from {rows} flight_states rows (Delta version {}) into container {:?}: {written} written, {stale} already at that version or newer, {failed_states} failed; {:.1} RU, {:.1} s writing ({:.0} documents/s with the predictions), {:.1} s in all",
        table_version.unwrap_or_default(),
        cosmos.flights_container,
        metrics.request_units.get(),
        seconds,
        documents as f64 / seconds.max(0.001),
        started.elapsed().as_secs_f64(),
    );
    if prediction_rows > 0 {
        println!(
            "backfill serving: the newest predictions of {} flights from {prediction_rows} predictions rows: {written_predictions} written, {stale_predictions} already at that version or newer, {failed_predictions} failed",
            written_predictions + stale_predictions + failed_predictions
        );
    }
    if !failed.is_empty() {
        bail!(
            "{failed_states} flight states and {failed_predictions} predictions were not written (first: {}); the rest are in place — run the backfill again once fixed",
            failed[0]
        );
    }
    Ok(())
}

/// Spends at most `rate` request units per second on average (with a one-second burst), by the
/// charges Cosmos DB reports.
struct RuBudget {
    rate: f64,
    started: Instant,
}

impl RuBudget {
    fn new(rate: f64) -> RuBudget {
        RuBudget {
            rate,
            started: Instant::now(),
        }
    }

    /// How long to wait before the next write, having spent `spent` RU so far.
    fn delay(&self, spent: f64, elapsed: Duration) -> Duration {
        if self.rate <= 0.0 {
            return Duration::ZERO;
        }
        let allowed = self.rate * (elapsed.as_secs_f64() + 1.0);
        Duration::from_secs_f64(((spent - allowed) / self.rate).max(0.0))
    }

    async fn wait(&self, spent: f64) {
        let delay = self.delay(spent, self.started.elapsed());
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ru_budget_allows_a_second_of_burst_then_the_rate() {
        let budget = RuBudget::new(100.0);
        assert_eq!(budget.delay(50.0, Duration::ZERO), Duration::ZERO);
        assert_eq!(budget.delay(100.0, Duration::ZERO), Duration::ZERO);
        assert_eq!(budget.delay(150.0, Duration::ZERO), Duration::from_millis(500));
        assert_eq!(
            budget.delay(300.0, Duration::from_secs(1)),
            Duration::from_secs(1)
        );
        assert_eq!(RuBudget::new(0.0).delay(1e9, Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn dates_are_checked() {
        assert!(parse_date("2013-05-20").is_ok());
        let error = parse_date("20.5.2013").expect_err("not a date");
        assert!(error.contains("20.5.2013"), "{error}");
    }
}
