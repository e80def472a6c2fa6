//! `contrail up`: the whole platform on one machine — the local broker, the local Cosmos DB
//! endpoint and the five stages as separate processes, a replay of real flights through them,
//! optional chaos (`kill -9` of a random stage every few seconds), the live flight board, and a
//! summary with the exactly-once checks at the end.
//!
//! The rooms: [`start`] (starting `crate::local`'s platform, phase by phase), [`revive`] (restarts
//! stages that exit), [`chaos`], [`status`] (live lag, waiting for the consumers), [`latency`],
//! [`settle`] (the checks), [`summary`], [`workdir`]; [`context`] is what they share. This module parses the options and runs them in order.

mod chaos;
mod context;
mod latency;
mod revive;
mod settle;
mod start;
mod status;
mod summary;
mod workdir;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use tokio::sync::RwLock;

use self::context::{Milestones, SharedPlatform, Up};
use crate::commands::board::set_phase;
use crate::commands::board::{Board, BoardMeta};
use crate::commands::replay::{Deliveries, FeedArgs, Target};
use crate::local::{Ports, STAGES, Scale, StageSpec};
use crate::stores::Stores;

/// Options of `contrail up`.
#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    #[command(flatten)]
    feed: FeedArgs,
    /// Replay a recorded feed instead of generated flights (as `contrail replay --input`: NDJSON
    /// or a JSON array of events, optionally gzip, `-` for stdin); the summary and its checks are
    /// then about the file's events, the board offers the file's flight dates.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["data_dir", "from", "to", "duplicate_rate", "max_disorder_minutes", "straggler_rate", "straggler_delay_minutes"]
    )]
    input: Option<PathBuf>,
    /// Start the platform without replaying anything, for your own producers: ingest's URL and
    /// the file holding its bearer token are printed, the board shows what arrives (offering the
    /// dates of --from/--to, January 2013 by default), the stages stay supervised until Ctrl-C.
    /// No summary or checks (nothing is known of what will be sent).
    #[arg(
        long,
        conflicts_with_all = ["input", "chaos", "exit", "acknowledged_out", "latency_sample_every"]
    )]
    no_replay: bool,
    /// Working directory: logs, RocksDB shards, checkpoints, Delta tables, `up.json`. Emptied at
    /// start (the broker and the Cosmos endpoint keep their data in memory, so every run starts
    /// from empty stores).
    #[arg(long, default_value = "contrail-up")]
    workdir: PathBuf,
    /// Added to every port (board 8000, broker 9092, Cosmos 8900, stages 8080–8086 and
    /// 9090/9091/9192–9196), to run next to another platform.
    #[arg(long, default_value_t = 0, env = "CONTRAIL_PORT_OFFSET")]
    port_offset: u16,
    /// Partitions of every topic.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Run several instances of a stage, as pods of a scaled deployment: `STAGE=N`, comma-separated
    /// or repeated (`--scale dedup-state=3,cosmos-writer=2,delta-archiver=2`). Instance i listens
    /// on the stage's ports + 100·i and is called STAGE-i in logs, status, chaos and the summary;
    /// the consumers share their groups' partitions (N ≤ --partitions), dedup-state-0 coordinates
    /// the checkpoints, changefeed-sync instances share the change feed's leases. ingest runs once.
    #[arg(long, value_name = "STAGE=N", value_delimiter = ',', value_parser = crate::local::parse_scale)]
    scale: Vec<(StageSpec, u16)>,
    /// Also run the knock-on delay extension (the second processor): dedup-state with
    /// `processor = "rotation"` (`rotation`, ports 8085/9195) predicting each flight's departure
    /// from its aircraft's inbound flight, and cosmos-writer with `input = "predictions"`
    /// (`cosmos-predictions`, 8086/9196) setting `predictedOut`/`knockOnFrom` on the flight
    /// documents; the flight deployment writes its states by tail, delta-archiver archives the
    /// predictions (Delta table `predictions`), the board shows them.
    #[arg(long)]
    rotation: bool,
    /// Kill a stage with SIGKILL every `--chaos-interval-s` and restart it (every stage in turn,
    /// in a seeded random order), until the replay is done and every stage was killed
    /// `--chaos-min-kills` times.
    #[arg(long)]
    chaos: bool,
    /// Seconds between chaos kills.
    #[arg(long, default_value_t = 4.0)]
    chaos_interval_s: f64,
    /// Under --chaos, go on killing a stage every `--chaos-interval-s` after the summary, for as
    /// long as the platform stays up (the supervisor restarts each).
    #[arg(long, requires = "chaos", conflicts_with = "exit")]
    chaos_keep_going: bool,
    /// Kills per stage before chaos stops after the replay.
    #[arg(long, default_value_t = 2)]
    chaos_min_kills: u32,
    /// Keep the broker's records and consumer groups on disk (WORKDIR/broker/broker.db, SQLite)
    /// instead of in memory, so they survive a broker restart: runs nisshi, which
    /// scripts/setup.sh builds once per machine (or CONTRAIL_NISSHI_BIN).
    #[arg(long)]
    durable_broker: bool,
    /// Under --chaos, also restart the broker this many times (needs --durable-broker).
    #[arg(long, default_value_t = 0)]
    chaos_broker_restarts: u32,
    /// Under --chaos, also this many times kill -9 dedup-state, delete its shard directories (a
    /// lost volume) and start it again: it restores the newest complete checkpoint.
    #[arg(long, default_value_t = 0)]
    chaos_volume_losses: u32,
    /// Under --chaos, also freeze the local Cosmos endpoint once (SIGSTOP) for this many seconds,
    /// then thaw it (SIGCONT): the serving store stops answering without losing anything, as a
    /// region outage or a stalled gateway looks to the writers (0: no freeze). The thaw comes at
    /// the first chaos strike after the time is up.
    #[arg(long, default_value_t = 0)]
    chaos_freeze_cosmos_s: u64,
    /// Stop everything after the summary instead of keeping the board up until Ctrl-C.
    #[arg(long)]
    exit: bool,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    /// Give up waiting for the pipeline to settle after this many seconds.
    #[arg(long, default_value_t = 900)]
    drain_timeout_s: u64,
    /// Bearer token ingest requires (the replay sends it). Default: a random one per run, written
    /// to WORKDIR/ingest-token (mode 0600) for your own requests.
    #[arg(long, env = "CONTRAIL_INGEST_TOKEN", hide_env_values = true)]
    ingest_token: Option<String>,
    /// Write every (flight key, event id) ingest acknowledged to this file (one `KEY<TAB>ID` a
    /// line): what an independent check of the topics and stores must find.
    #[arg(long)]
    acknowledged_out: Option<PathBuf>,
    /// Latency sampling: for every N-th flight, the time from ingest's acknowledgement of its
    /// first events to its document appearing in Cosmos DB (point reads every 50 ms, 16 flights
    /// at a time; 0: no sampling). The latency to Delta is always measured, for every event (its
    /// file's commit time − ingest time).
    #[arg(long, default_value_t = 20)]
    latency_sample_every: u64,
    /// Export every stage's spans over OTLP/gRPC to this endpoint (an OpenTelemetry collector,
    /// Jaeger, …: `http://127.0.0.1:4317`). A record's trace crosses every topic in its
    /// `traceparent` header: one trace from the HTTP request to the Cosmos write and the Delta
    /// commit. Send your own `traceparent` with a request to follow it.
    #[arg(long, value_name = "URL", value_parser = parse_otlp_endpoint)]
    otlp_endpoint: Option<String>,
    /// With --otlp-endpoint: the share of traces sampled, chosen by trace id (0 to 1). It applies
    /// to a request's own `traceparent` too: contrail decides, not the caller's sampled flag.
    #[arg(long, default_value_t = 0.01, value_parser = parse_ratio, requires = "otlp_endpoint")]
    trace_ratio: f64,
}

/// An OTLP endpoint: an `http://` or `https://` URL.
fn parse_otlp_endpoint(value: &str) -> Result<String, String> {
    if value.starts_with("http://") || value.starts_with("https://") {
        Ok(value.trim_end_matches('/').to_owned())
    } else {
        Err(format!(
            "{value:?} is not an OTLP/gRPC endpoint URL (http://HOST:PORT, e.g. http://127.0.0.1:4317)"
        ))
    }
}

/// A sampling ratio between 0 and 1.
fn parse_ratio(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
        _ => Err(format!("{value:?} is not a ratio between 0 and 1")),
    }
}

/// January 2013 unless the user picked dates: a month of flights (≈ 211,000 deliveries).
fn default_dates(feed: &mut FeedArgs) {
    if feed.from.is_none() && feed.to.is_none() {
        feed.from = chrono::NaiveDate::from_ymd_opt(2013, 1, 1);
        feed.to = chrono::NaiveDate::from_ymd_opt(2013, 1, 31);
    }
}

/// Runs `contrail up`.
pub async fn run(mut args: UpArgs) -> Result<()> {
    default_dates(&mut args.feed);
    let ports = Ports {
        offset: args.port_offset,
    };
    let workdir = std::path::absolute(&args.workdir)
        .with_context(|| format!("--workdir {}", args.workdir.display()))?;
    if args.chaos_broker_restarts > 0 && !args.durable_broker {
        bail!(
            "--chaos-broker-restarts {} needs --durable-broker: the in-memory broker loses every record when it restarts",
            args.chaos_broker_restarts
        );
    }
    let scale = Scale::new(&args.scale).with_rotation(args.rotation);
    scale.check(args.partitions)?;
    workdir::prepare_workdir(&workdir)?;
    // The board listens first, so "is it up?" has an answer at once (its data routes answer 503
    // with the phase until the stores are open).
    let meta = Arc::new(RwLock::new(BoardMeta {
        dates: replay_dates(&args),
        phase: "starting: loading the flights".to_owned(),
        status: Value::Null,
    }));
    let board_address = format!("127.0.0.1:{}", ports.board());
    let listener = tokio::net::TcpListener::bind(&board_address)
        .await
        .with_context(|| format!("binding the flight board to {board_address} (try --port-offset)"))?;
    let board = Board::starting(meta.clone());
    let stop_board = Arc::new(tokio::sync::Notify::new());
    let board_task = tokio::spawn({
        let stop = stop_board.clone();
        crate::commands::board::serve(board.clone(), listener, async move { stop.notified().await })
    });
    workdir::write_endpoints(&workdir, ports, &scale)?;
    println!("flight board: http://{board_address}/ (starting)");
    // Load the flights before any process: a bad date range or feed file fails before anything
    // starts. (CPU work off the runtime's threads: the board answers meanwhile.)
    let (stream, flights, estimate): (Deliveries, usize, u64) = match &args.input {
        _ if args.no_replay => {
            println!(
                "contrail up: no replay (--no-replay), working directory {}",
                workdir.display()
            );
            (Box::new(std::iter::empty()), 0, 0)
        }
        Some(path) => {
            let feed = crate::input::load(path).await?;
            meta.write().await.dates = feed_dates(&feed.events);
            println!(
                "contrail up: {} ({} events of {} flights), working directory {}",
                path.display(),
                feed.events.len(),
                feed.flights,
                workdir.display()
            );
            let count = feed.events.len() as u64;
            (Box::new(feed.events.into_iter()), feed.flights, count)
        }
        None => {
            let feed_args = args.feed.clone();
            let (stream, flights, estimate) =
                tokio::task::spawn_blocking(move || crate::commands::replay::feed(&feed_args))
                    .await
                    .context("loading the flights")??;
            println!(
                "contrail up: {flights} flights ({} … {}), working directory {}",
                args.feed.from.map(|d| d.to_string()).unwrap_or_default(),
                args.feed.to.map(|d| d.to_string()).unwrap_or_default(),
                workdir.display()
            );
            (
                Box::new(stream.map(|delivery| delivery.event.to_json())),
                flights,
                estimate,
            )
        }
    };
    let ingest_token = match &args.ingest_token {
        Some(token) => token.clone(),
        None => workdir::random_token()?,
    };
    workdir::write_secret(&workdir.join("ingest-token"), &ingest_token)?;
    let started = Instant::now();
    let platform = match start::start_platform(&args, &scale, ports, &workdir, &ingest_token, &meta).await {
        Ok(platform) => SharedPlatform::new(platform),
        Err(error) => {
            set_phase(&meta, &format!("failed to start: {error:#}")).await;
            stop_board.notify_one();
            let _ = board_task.await;
            return Err(error);
        }
    };
    let up = Up {
        ports,
        workdir: workdir.clone(),
        platform: platform.clone(),
        meta,
        multi: MultiProgress::new(),
        milestones: Arc::new(Milestones {
            chaos_done: (!args.chaos).into(),
            ..Milestones::default()
        }),
    };
    let run = Run {
        args: &args,
        up,
        board,
        started,
        ingest_token,
    };
    let result = tokio::select! {
        result = run.drive(stream, flights, estimate) => result,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("\ninterrupted: stopping every process (each stage finishes its batch)…");
            Ok(())
        }
    };
    stop_board.notify_one();
    let _ = board_task.await;
    platform.shutdown();
    println!("stopped; logs and data in {}", workdir.display());
    result
}

/// The dates the board offers for a feed file: its flights' service dates, in order (at most 400).
fn feed_dates(events: &[Value]) -> Vec<String> {
    let dates: std::collections::BTreeSet<&str> = events
        .iter()
        .filter_map(|event| event["flight"]["date"].as_str())
        .collect();
    dates.into_iter().take(400).map(str::to_owned).collect()
}

/// The dates the board offers: every day of the replay (at most 400).
fn replay_dates(args: &UpArgs) -> Vec<String> {
    let mut dates = Vec::new();
    if let (Some(from), Some(to)) = (args.feed.from, args.feed.to) {
        let mut day = from;
        while day <= to && dates.len() < 400 {
            dates.push(day.to_string());
            match day.succ_opt() {
                Some(next) => day = next,
                None => break,
            }
        }
    }
    dates
}

/// One run: the options, the shared context, the board.
struct Run<'a> {
    args: &'a UpArgs,
    up: Up,
    board: Board,
    started: Instant,
    /// What ingest requires of the replay.
    ingest_token: String,
}

impl Run<'_> {
    /// The platform is up: open the stores, start the background tasks, wait for the consumers,
    /// replay, settle, summarise.
    async fn drive(&self, stream: Deliveries, flights: usize, estimate: u64) -> Result<()> {
        let (args, up, ports) = (self.args, &self.up, self.up.ports);
        let stores = Stores::open(
            &start::cosmos_config(ports, false),
            &up.workdir.join("delta").display().to_string(),
        )
        .await?;
        self.board.attach(stores.clone());
        let board_address = format!("127.0.0.1:{}", ports.board());

        let bar = up.multi.add(ProgressBar::new(estimate));
        bar.set_style(crate::commands::replay::bar_style());
        let status = up.multi.add(ProgressBar::new_spinner());
        status.set_style(
            ProgressStyle::with_template("{spinner} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        up.say(format!(
            "flight board: http://{board_address}/   (admin: contrail admin status{})",
            if ports.offset == 0 {
                String::new()
            } else {
                format!(" --port-offset {}", ports.offset)
            }
        ));

        let supervisor = revive::spawn(up.clone());
        let chaos = args.chaos.then(|| {
            chaos::spawn(
                up.clone(),
                chaos::ChaosSettings {
                    interval: Duration::from_secs_f64(args.chaos_interval_s.max(0.5)),
                    min_kills: args.chaos_min_kills,
                    seed: args.feed.seed,
                    broker_restarts: args.chaos_broker_restarts,
                    volume_losses: args.chaos_volume_losses,
                    cosmos_freeze: (args.chaos_freeze_cosmos_s > 0)
                        .then(|| Duration::from_secs(args.chaos_freeze_cosmos_s)),
                    after_summary: args.chaos_keep_going,
                },
            )
        });
        let status_task = status::spawn(up.clone(), status.clone(), bar.clone());

        up.say("waiting for the consumers to join their groups…");
        up.set_phase("starting: the consumers join their groups").await;
        let replicas = up.platform.with(|platform| platform.replicas.clone());
        let waiting = status::wait_assigned(ports, &replicas, status::ASSIGNMENT_TIMEOUT).await;
        if !waiting.is_empty() {
            up.say(format!(
                "still without partitions after {} s: {}; replaying anyway",
                status::ASSIGNMENT_TIMEOUT.as_secs(),
                waiting.join(", ")
            ));
        }
        let target = Target {
            url: format!("http://127.0.0.1:{}", ports.http(&STAGES[0])),
            token: Some(self.ingest_token.clone()),
            gzip: false,
        };
        if args.no_replay {
            bar.finish_and_clear();
            up.set_phase("idle: waiting for your producers").await;
            up.say(format!(
                "ready for your events: POST {}/v1/events (Authorization: Bearer $(cat {})); the flight board shows what arrives; Ctrl-C stops everything",
                target.url,
                up.workdir.join("ingest-token").display()
            ));
            let _ = tokio::signal::ctrl_c().await;
            drop((supervisor, status_task));
            return Ok(());
        }
        let (sampler, on_ack) = latency::CosmosSampler::start(stores.clone(), args.latency_sample_every);
        up.milestones.replay_running.notify_one();
        up.set_phase("replaying").await;
        let replay_started = Instant::now();
        let replay_started_ms = chrono::Utc::now().timestamp_millis();
        let totals = crate::commands::replay::post(stream, &args.feed, &target, &bar, &on_ack).await;
        Milestones::set(&up.milestones.replay_done);
        // Closes the sample channel: the sampler ends once its pending flights showed up.
        drop(on_ack);
        bar.finish();
        let totals = totals?;
        if let Some(path) = &args.acknowledged_out {
            let mut lines: Vec<String> = totals
                .events
                .iter()
                .map(|(key, id)| format!("{key}\t{id}"))
                .collect();
            lines.sort_unstable();
            std::fs::write(path, lines.join("\n") + "\n")
                .with_context(|| format!("writing {}", path.display()))?;
        }
        up.say(format!(
            "replay done: {} deliveries ({} distinct events) acknowledged by ingest in {:.1} s; waiting for every stage to finish…",
            totals.accepted,
            totals.events.len(),
            totals.elapsed.as_secs_f64()
        ));

        // Wait until chaos is over and the stores satisfy every check (or time runs out).
        up.set_phase("settling").await;
        let deadline = Instant::now() + Duration::from_secs(args.drain_timeout_s);
        let delta_root = up.workdir.join("delta").display().to_string();
        let history = settle::History {
            kafka: contrail_common::kafka::KafkaConfig {
                brokers: format!("127.0.0.1:{}", ports.broker()),
                ..contrail_common::kafka::KafkaConfig::default()
            },
            delta_root: &delta_root,
            archived: settle::archived_topics(args.rotation),
        };
        let report = settle::settle(up, &stores, &history, &totals.events, deadline, &status, &bar).await;
        let settled = replay_started.elapsed();
        let cosmos_latency = sampler.finish().await;
        Milestones::set(&up.milestones.finished);
        // The supervisor goes on (a stage that exits while the board is up is restarted) until
        // the platform shuts down; the terminal's status line ends here, the board's goes on.
        let _ = status_task.await;
        let board_status = status::spawn_for_the_board(up.clone());
        status.finish_and_clear();

        let (kills, crashes) = up
            .platform
            .with(|platform| (platform.kills(), platform.crashes()));
        let mut summary = summary::summary_json(
            flights,
            &totals,
            &report,
            &kills,
            crashes,
            settled,
            self.started.elapsed(),
        );
        let delta_latency = match latency::delta_latencies(&stores).await {
            Ok(mut values) => latency::distribution(&mut values),
            Err(error) => json!({ "error": format!("{error:#}") }),
        };
        up.platform.with(|platform| {
            summary["broker_restarts"] = json!(platform.broker_restarts);
            summary["volume_losses"] = json!(platform.volume_losses);
            summary["cosmos_freezes"] = json!(platform.cosmos_freezes);
            let mut peaks = serde_json::Map::new();
            for managed in platform.stages.iter().chain([&platform.broker, &platform.cosmos]) {
                if let Some(mib) = summary::peak_rss_mib(managed.pid()) {
                    peaks.insert(managed.name.clone(), json!(mib));
                }
            }
            summary["peak_rss_mib"] = Value::Object(peaks);
        });
        summary["latency_ms"] =
            json!({ "ingest_to_cosmos": cosmos_latency, "ingest_to_delta": delta_latency });
        match latency::stores_complete_ms(&stores).await {
            Ok(Some(complete_ms)) => {
                let seconds = (complete_ms - replay_started_ms) as f64 / 1000.0;
                summary["stores_complete_seconds"] = json!(seconds);
                summary["events_per_second_to_complete_stores"] =
                    json!(totals.events.len() as f64 / seconds.max(0.001));
            }
            Ok(None) => {}
            Err(error) => summary["stores_complete_seconds"] = json!({ "error": format!("{error:#}") }),
        }
        summary::print_summary(&summary, &report);
        let passed = report.passed();
        up.set_phase(if passed {
            "done: every exactly-once check passed"
        } else {
            "done: exactly-once checks FAILED"
        })
        .await;
        if let Some(path) = &args.summary_json {
            std::fs::write(path, serde_json::to_vec_pretty(&summary)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        if !args.exit {
            println!(
                "\nthe flight board stays up at http://{board_address}/ and the stages stay supervised{} — Ctrl-C stops everything",
                if args.chaos_keep_going {
                    " (and chaos goes on)"
                } else {
                    ""
                }
            );
            up.milestones.summary_printed.notify_one();
            let _ = tokio::signal::ctrl_c().await;
        }
        // Ends with the platform's shutdown (the caller's), like the board's status line.
        drop((supervisor, board_status, chaos));
        if !passed {
            bail!(
                "the exactly-once checks failed (see above; logs in {})",
                up.workdir.join("logs").display()
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_replay_is_january() {
        let mut feed = FeedArgs {
            data_dir: None,
            from: None,
            to: None,
            seed: 1,
            duplicate_rate: 0.1,
            max_disorder_minutes: 10,
            straggler_rate: 0.0,
            straggler_delay_minutes: 180,
            rate: 0,
            batch_size: 1000,
            concurrency: 4,
            limit: None,
        };
        default_dates(&mut feed);
        assert_eq!(feed.from.map(|d| d.to_string()).as_deref(), Some("2013-01-01"));
        assert_eq!(feed.to.map(|d| d.to_string()).as_deref(), Some("2013-01-31"));
        feed.to = chrono::NaiveDate::from_ymd_opt(2013, 2, 1);
        feed.from = None;
        default_dates(&mut feed);
        assert_eq!(feed.from, None, "a date the user gave is kept");
    }
}
