//! A local platform's processes: the broker, the Cosmos endpoint and every instance of every
//! stage, started in that order, kept running (a stage that exits on its own is restarted, as
//! Kubernetes would) and stopped.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{
    Managed, Ports, Replica, Scale, cosmos_config, nisshi_binary, send_signal, sibling_binary, stage_env,
    tansu_binary, wait_for_port,
};

/// How a local platform runs.
#[derive(Debug, Clone)]
pub struct PlatformOptions {
    /// The broker keeps its log on disk (sqlite in WORKDIR/broker), so it survives a restart.
    pub durable_broker: bool,
    /// Partitions of every topic.
    pub partitions: i32,
    /// The token writers present to ingest.
    pub ingest_token: String,
    /// Settings every stage gets besides its own (OpenTelemetry's).
    pub stage_env: Vec<(String, String)>,
}

/// The running processes.
pub struct Platform {
    pub broker: Managed,
    pub cosmos: Managed,
    /// Every instance of every stage, in pipeline order.
    pub stages: Vec<Managed>,
    /// Which instance each of `stages` is.
    pub replicas: Vec<Replica>,
    /// Set by `shutdown`: the supervisor restarts nothing any more.
    pub stopping: bool,
    /// Broker restarts, dedup-state volume losses and Cosmos endpoint freezes chaos caused.
    pub broker_restarts: u32,
    pub volume_losses: u32,
    pub cosmos_freezes: u32,
}

impl Platform {
    pub fn kills(&self) -> BTreeMap<String, u32> {
        self.stages
            .iter()
            .map(|stage| (stage.name.clone(), stage.kills))
            .collect()
    }

    pub fn crashes(&self) -> u32 {
        self.stages.iter().map(|stage| stage.crashes).sum()
    }

    /// SIGTERM to every stage at once (each finishes and commits its batch), then the stores.
    pub fn shutdown(&mut self) {
        self.stopping = true;
        for stage in &self.stages {
            send_signal(stage.pid(), libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for stage in &mut self.stages {
            let left = deadline.saturating_duration_since(Instant::now());
            if !stage.stop(left) {
                eprintln!("{} did not stop within 30 s of SIGTERM: killed", stage.name);
            }
        }
        // Both at once: the broker takes ≈ 2 s to exit, and neither waits for the other.
        send_signal(self.cosmos.pid(), libc::SIGTERM);
        send_signal(self.broker.pid(), libc::SIGTERM);
        self.cosmos.stop(Duration::from_secs(5));
        self.broker.stop(Duration::from_secs(5));
    }
}

impl Platform {
    /// Restarts every stage that exited on its own. Returns what happened, one line each, and
    /// whether supervision ends: on shutdown, or when the broker or the Cosmos endpoint exited
    /// (nothing can go on then).
    pub fn revive(&mut self) -> (Vec<String>, bool) {
        let mut lines = Vec::new();
        if self.stopping {
            return (lines, true);
        }
        for stage in &mut self.stages {
            match stage.revive() {
                Ok(Some(status)) => lines.push(format!("{} exited ({status}); restarted", stage.name)),
                Ok(None) => {}
                Err(error) => lines.push(format!("{} cannot be restarted: {error:#}", stage.name)),
            }
        }
        if let Some(status) = self.broker.exited() {
            lines.push(format!("the local broker exited ({status})"));
            return (lines, true);
        }
        if let Some(status) = self.cosmos.exited() {
            lines.push(format!("the local Cosmos endpoint exited ({status})"));
            return (lines, true);
        }
        (lines, false)
    }
}

/// How long the stages' instances have, together, to answer `/healthz` after they were spawned.
const STAGES_LIVE_TIMEOUT: Duration = Duration::from_secs(180);

/// Starts the local broker (logs in WORKDIR/logs).
pub async fn start_broker(options: &PlatformOptions, ports: Ports, workdir: &Path) -> Result<Managed> {
    let logs = workdir.join("logs");
    let broker_url = format!("tcp://127.0.0.1:{}", ports.broker());
    // Durable: nisshi on SQLite in WORKDIR/broker (it reads the path relative to its working
    // directory); else tansu in memory.
    let broker_dir = workdir.join("broker");
    let (binary, storage) = if options.durable_broker {
        std::fs::create_dir_all(&broker_dir).with_context(|| format!("creating {}", broker_dir.display()))?;
        (nisshi_binary()?, "sqlite://broker.db")
    } else {
        (tansu_binary()?, "memory://tansu/")
    };
    let mut broker_args: Vec<String> = [
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
    if options.durable_broker {
        // A restarted stage is its group's only member: Kafka's 3 s wait for more members would
        // only delay it.
        broker_args.extend(["--group-initial-rebalance-delay".to_owned(), "0s".to_owned()]);
    }
    let mut broker = Managed::spawn_in(
        "broker",
        &binary,
        &broker_args,
        &[],
        &logs.join("broker.log"),
        options.durable_broker.then_some(broker_dir.as_path()),
    )?;
    let address = format!("127.0.0.1:{}", ports.broker());
    wait_for_port(&address, Duration::from_secs(15), || broker.exited().is_none())
        .await
        .with_context(|| {
            format!("starting the local broker on {address} (is the port free? try --port-offset)")
        })?;

    Ok(broker)
}

/// Starts the local Cosmos DB endpoint.
pub async fn start_cosmos(ports: Ports, workdir: &Path) -> Result<Managed> {
    let logs = workdir.join("logs");
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
    wait_for_port(&address, Duration::from_secs(15), || cosmos.exited().is_none())
        .await
        .with_context(|| {
            format!(
                "starting the local Cosmos endpoint on {address}: {}",
                cosmos.log_tail(5)
            )
        })?;

    Ok(cosmos)
}

/// Creates the topics, the Cosmos database and its containers.
pub async fn create_stores(options: &PlatformOptions, ports: Ports) -> Result<()> {
    let kafka = contrail_common::kafka::KafkaConfig {
        brokers: format!("127.0.0.1:{}", ports.broker()),
        ..contrail_common::kafka::KafkaConfig::default()
    };
    let topics = contrail_common::topology::topics::ALL;
    contrail_common::kafka::create_topics(&kafka, "contrail-up", &topics, options.partitions)
        .await
        .context("creating the topics")?;
    cosmos_config(&ports.cosmos_endpoint(), None, true)
        .open("contrail-up")
        .await
        .context("creating the Cosmos database and containers")?;

    Ok(())
}

/// Starts every instance of every stage and waits until all are live; a stage that exits fails
/// the start at once with its log.
pub async fn start_stages(
    options: &PlatformOptions,
    scale: &Scale,
    ports: Ports,
    workdir: &Path,
) -> Result<(Vec<Managed>, Vec<Replica>)> {
    let logs = workdir.join("logs");
    let replicas = scale.replicas();
    let mut stages = Vec::new();
    for replica in &replicas {
        let stage = &replica.stage;
        let mut env = stage_env(replica, ports, workdir, options.partitions, scale.rotation());
        env.push(("RUST_LOG".to_owned(), "info".to_owned()));
        env.extend(options.stage_env.iter().cloned());
        if stage.name == "ingest" {
            // Writers need the token; the admin API stays open on loopback like the other
            // stages' (contrail admin, the status line).
            env.push((
                "CONTRAIL_AUTH__TOKENS".to_owned(),
                serde_json::to_string(&[&options.ingest_token])?,
            ));
            env.push(("CONTRAIL_ADMIN_AUTH__TOKENS".to_owned(), "[]".to_owned()));
        }
        let binary = sibling_binary(stage.binary)?;
        let name = replica.name();
        stages.push(Managed::spawn(
            &name,
            &binary,
            &[],
            &env,
            &logs.join(format!("{name}.log")),
        )?);
    }
    // Every stage is live (`/healthz`) within one deadline, checked together; a stage that exits
    // fails the start at once with its log.
    let client = reqwest::Client::new();
    let deadline = Instant::now() + STAGES_LIVE_TIMEOUT;
    loop {
        let mut not_live = Vec::new();
        for (replica, managed) in replicas.iter().zip(&mut stages) {
            if let Some(status) = managed.exited() {
                bail!(
                    "{} exited at start ({status}):\n{}",
                    managed.name,
                    managed.log_tail(20)
                );
            }
            let url = format!("http://127.0.0.1:{}/healthz", ports.http_of(replica));
            let live = client
                .get(&url)
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|response| response.status().is_success());
            if !live {
                not_live.push((managed.name.clone(), managed.log_tail(10)));
            }
        }
        if not_live.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let names: Vec<&str> = not_live.iter().map(|(name, _)| name.as_str()).collect();
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
    Ok((stages, replicas))
}
