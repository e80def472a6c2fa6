//! The platform's processes: starting them, keeping them running (a stage that exits on its own
//! is restarted, as Kubernetes would), stopping them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::sync::RwLock;

use super::UpArgs;
use crate::commands::board::{BoardMeta, set_phase};
use crate::local::{Managed, Ports, Replica, Scale, sibling_binary, stage_env, tansu_binary};

/// The running processes.
pub(super) struct Platform {
    pub(super) broker: Managed,
    pub(super) cosmos: Managed,
    /// Every instance of every stage, in pipeline order.
    pub(super) stages: Vec<Managed>,
    /// Which instance each of `stages` is.
    pub(super) replicas: Vec<Replica>,
    /// Set by `shutdown`: the supervisor restarts nothing any more.
    pub(super) stopping: bool,
    /// Broker restarts and dedup-state volume losses chaos caused.
    pub(super) broker_restarts: u32,
    pub(super) volume_losses: u32,
}

impl Platform {
    pub(super) fn kills(&self) -> BTreeMap<String, u32> {
        self.stages
            .iter()
            .map(|stage| (stage.name.clone(), stage.kills))
            .collect()
    }

    pub(super) fn crashes(&self) -> u32 {
        self.stages.iter().map(|stage| stage.crashes).sum()
    }

    /// SIGTERM to every stage at once (each finishes and commits its batch), then the stores.
    pub(super) fn shutdown(&mut self) {
        self.stopping = true;
        for stage in &self.stages {
            crate::local::send_signal(stage.pid(), libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for stage in &mut self.stages {
            let left = deadline.saturating_duration_since(Instant::now());
            if !stage.stop(left) {
                eprintln!("{} did not stop within 30 s of SIGTERM: killed", stage.name);
            }
        }
        // Both at once: the broker takes ≈ 2 s to exit, and neither waits for the other.
        crate::local::send_signal(self.cosmos.pid(), libc::SIGTERM);
        crate::local::send_signal(self.broker.pid(), libc::SIGTERM);
        self.cosmos.stop(Duration::from_secs(5));
        self.broker.stop(Duration::from_secs(5));
    }
}

/// How long the stages' instances have, together, to answer `/healthz` after they were spawned.
const STAGES_LIVE_TIMEOUT: Duration = Duration::from_secs(180);

pub(super) async fn start_platform(
    args: &UpArgs,
    scale: &Scale,
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
    crate::local::wait_for_port(&address, Duration::from_secs(15), || broker.exited().is_none())
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
    crate::local::wait_for_port(&address, Duration::from_secs(15), || cosmos.exited().is_none())
        .await
        .with_context(|| {
            format!(
                "starting the local Cosmos endpoint on {address}: {}",
                cosmos.log_tail(5)
            )
        })?;

    set_phase(meta, "starting: topics, containers and the stages").await;
    let kafka = contrail_common::kafka::KafkaConfig {
        brokers: format!("127.0.0.1:{}", ports.broker()),
        ..contrail_common::kafka::KafkaConfig::default()
    };
    let topics = contrail_common::topology::topics::ALL;
    contrail_common::kafka::create_topics(&kafka, "contrail-up", &topics, args.partitions)
        .await
        .context("creating the topics")?;
    cosmos_config(ports, true)
        .open("contrail-up")
        .await
        .context("creating the Cosmos database and containers")?;

    let replicas = scale.replicas();
    let mut stages = Vec::new();
    for replica in &replicas {
        let stage = &replica.stage;
        let mut env = stage_env(replica, ports, workdir, args.partitions, scale.rotation());
        env.push(("RUST_LOG".to_owned(), "info".to_owned()));
        env.extend(otlp_env(args));
        if stage.name == "ingest" {
            // Writers need the token; the admin API stays open on loopback like the other
            // stages' (contrail admin, the status line).
            env.push((
                "CONTRAIL_AUTH__TOKENS".to_owned(),
                serde_json::to_string(&[ingest_token])?,
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
    Ok(Platform {
        broker,
        cosmos,
        stages,
        replicas,
        stopping: false,
        broker_restarts: 0,
        volume_losses: 0,
    })
}

/// The `[cosmos]` settings of a tool reading the local endpoint.
pub(super) fn cosmos_config(ports: Ports, create: bool) -> contrail_cosmos::CosmosConfig {
    crate::local::cosmos_config(&ports.cosmos_endpoint(), None, create)
}

/// The OpenTelemetry settings of every stage under `--otlp-endpoint` (none without it).
fn otlp_env(args: &UpArgs) -> Vec<(String, String)> {
    let Some(endpoint) = &args.otlp_endpoint else {
        return Vec::new();
    };
    [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio".to_owned()),
        ("OTEL_TRACES_SAMPLER_ARG", args.trace_ratio.to_string()),
        // Spans leave every second, not every five (the SDK's default).
        ("OTEL_BSP_SCHEDULE_DELAY", "1000".to_owned()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value))
    .collect()
}
