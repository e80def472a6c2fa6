//! dedup-state as a real process under test: start, restart, kill -9, admin calls.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use contrail_proto::admin::v1::StatusResponse;

use crate::{Probe, StageProcess, answers_200, free_port, unique, workspace_binary};

/// A request with `authorization: <token>`.
fn authorized<T>(message: T, token: &str) -> Result<tonic::Request<T>> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", token.parse()?);
    Ok(request)
}

/// A dedup-state process and how to reach it.
pub struct DedupUnderTest {
    /// The process.
    pub process: StageProcess,
    /// `http://127.0.0.1:PORT` (probes, metrics).
    pub http_url: String,
    /// `http://127.0.0.1:PORT` (admin, control).
    pub grpc_url: String,
    /// Its working directory: `shards/`, the log.
    pub dir: PathBuf,
    /// The admin token.
    pub token: String,
    env: Vec<(String, String)>,
    brokers: String,
    raw_topic: String,
}

/// Topic names of one test deployment.
#[derive(Debug, Clone)]
pub struct DedupTopics {
    /// Input.
    pub raw: String,
    /// Outputs.
    pub curated: String,
    /// Accepted events.
    pub accepted: String,
    /// Late events.
    pub late: String,
    /// Alerts.
    pub alerts: String,
    /// Dead letters.
    pub dlq: String,
}

impl DedupTopics {
    /// Unique topic names.
    pub fn unique() -> DedupTopics {
        let prefix = unique("d");
        DedupTopics {
            raw: format!("{prefix}.ops.events.raw"),
            curated: format!("{prefix}.ops.flights.curated"),
            accepted: format!("{prefix}.ops.events.accepted"),
            late: format!("{prefix}.ops.events.late"),
            alerts: format!("{prefix}.ops.alerts"),
            dlq: format!("{prefix}.ops.events.dlq"),
        }
    }
}

/// Settings of one dedup-state instance.
pub struct DedupOptions<'a> {
    /// Broker.
    pub brokers: &'a str,
    /// Topics.
    pub topics: &'a DedupTopics,
    /// Consumer group (shared by instances of one deployment).
    pub group: &'a str,
    /// Instance name.
    pub instance: &'a str,
    /// Working directory of this instance (its shards).
    pub dir: PathBuf,
    /// The checkpoint store shared by the deployment.
    pub checkpoint_dir: PathBuf,
    /// gRPC port (fixed so peers can name it); `None`: a free one.
    pub grpc_port: Option<u16>,
    /// Extra `CONTRAIL_*` settings.
    pub extra_env: Vec<(String, String)>,
}

impl<'a> DedupOptions<'a> {
    /// Instance `dedup-state-0` of a deployment under `dir`: shards in `dir/instance-0`, the
    /// checkpoint store in `dir/checkpoints`, a free gRPC port, no extra settings.
    pub fn single(brokers: &'a str, topics: &'a DedupTopics, group: &'a str, dir: &std::path::Path) -> Self {
        DedupOptions {
            brokers,
            topics,
            group,
            instance: "dedup-state-0",
            dir: dir.join("instance-0"),
            checkpoint_dir: dir.join("checkpoints"),
            grpc_port: None,
            extra_env: Vec::new(),
        }
    }
}

/// Starts dedup-state and waits until `/readyz` answers 200.
pub fn start_dedup_state(options: DedupOptions<'_>) -> Result<DedupUnderTest> {
    std::fs::create_dir_all(&options.dir)?;
    let http_port = free_port();
    let grpc_port = options.grpc_port.unwrap_or_else(free_port);
    let token = "dedup-admin-token-0123456789".to_owned();
    let topics = options.topics;
    let mut env: Vec<(String, String)> = [
        ("CONTRAIL_KAFKA__BROKERS", options.brokers.to_owned()),
        ("CONTRAIL_LISTEN__HTTP", format!("127.0.0.1:{http_port}")),
        ("CONTRAIL_LISTEN__GRPC", format!("127.0.0.1:{grpc_port}")),
        ("CONTRAIL_INSTANCE", options.instance.to_owned()),
        ("CONTRAIL_TOPICS__RAW", topics.raw.clone()),
        ("CONTRAIL_TOPICS__CURATED", topics.curated.clone()),
        ("CONTRAIL_TOPICS__ACCEPTED", topics.accepted.clone()),
        ("CONTRAIL_TOPICS__LATE", topics.late.clone()),
        ("CONTRAIL_TOPICS__ALERTS", topics.alerts.clone()),
        ("CONTRAIL_TOPICS__DLQ", topics.dlq.clone()),
        ("CONTRAIL_TOPICS__PARTITIONS", "4".to_owned()),
        ("CONTRAIL_GROUP__ID", options.group.to_owned()),
        ("CONTRAIL_GROUP__SESSION_TIMEOUT_MS", "6000".to_owned()),
        (
            "CONTRAIL_STATE_DIR",
            options.dir.join("shards").display().to_string(),
        ),
        (
            "CONTRAIL_CHECKPOINT_URL",
            options.checkpoint_dir.display().to_string(),
        ),
        ("CONTRAIL_AUTH__TOKENS", format!("[\"{token}\"]")),
        ("RUST_LOG", "info".to_owned()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value))
    .collect();
    env.extend(options.extra_env);
    let binary = workspace_binary("dedup-state")?;
    let process = StageProcess::spawn(&binary, &env, &options.dir.join("dedup-state.log"))?;
    let mut stage = DedupUnderTest {
        process,
        http_url: format!("http://127.0.0.1:{http_port}"),
        grpc_url: format!("http://127.0.0.1:{grpc_port}"),
        dir: options.dir,
        token,
        env,
        brokers: options.brokers.to_owned(),
        raw_topic: options.topics.raw.clone(),
    };
    stage.wait_ready(Duration::from_secs(120))?;
    Ok(stage)
}

impl DedupUnderTest {
    /// Waits until `/readyz` answers 200.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let url = format!("{}/readyz", self.http_url);
        self.process
            .wait_until(&format!("GET {url} → 200"), timeout, || Ok(answers_200(&url)))
    }

    /// Starts the same deployment again (same ports, directories, topics).
    pub fn restart(&mut self) -> Result<()> {
        let binary = workspace_binary("dedup-state")?;
        self.process = StageProcess::spawn(&binary, &self.env, &self.dir.join("dedup-state.log"))?;
        self.wait_ready(Duration::from_secs(120))
    }

    /// Starts the same deployment again without waiting for readiness (a stage holding a partition
    /// at a gap is not ready).
    pub fn spawn_again(&mut self) -> Result<()> {
        let binary = workspace_binary("dedup-state")?;
        self.process = StageProcess::spawn(&binary, &self.env, &self.dir.join("dedup-state.log"))?;
        Ok(())
    }

    /// The admin API's `AcceptGap` for `topic`/`partition`: the answer, or the refusal.
    pub fn accept_gap(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<std::result::Result<contrail_proto::admin::v1::AcceptGapResponse, tonic::Status>> {
        let topic = topic.to_owned();
        self.admin(|mut client, token| async move {
            let request = authorized(
                contrail_proto::admin::v1::AcceptGapRequest {
                    topic,
                    partition,
                    all: false,
                },
                &token,
            )?;
            Ok(client.accept_gap(request).await.map(tonic::Response::into_inner))
        })
    }

    /// `kill -9`, then [`DedupUnderTest::restart`].
    pub fn restart_after_kill9(&mut self) -> Result<()> {
        self.process.kill9();
        self.restart()
    }

    /// Calls the admin API with the instance's token.
    pub fn admin<T, F, Fut>(&self, call: F) -> Result<T>
    where
        F: FnOnce(
            contrail_proto::admin::v1::admin_service_client::AdminServiceClient<tonic::transport::Channel>,
            String,
        ) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        admin_call(&self.grpc_url, &self.token, call)
    }

    /// The admin API's status.
    pub fn status(&self) -> Result<StatusResponse> {
        status_of(&self.grpc_url, &self.token)
    }

    /// Asks the coordinator for a checkpoint now; returns the completed epoch.
    pub fn trigger_checkpoint(&self) -> Result<u64> {
        self.admin(|mut client, token| async move {
            let request = authorized(contrail_proto::admin::v1::TriggerCheckpointRequest {}, &token)?;
            Ok(client.trigger_checkpoint(request).await?.into_inner().epoch)
        })
    }

    /// One flight's state through the admin API.
    pub fn read_key_state(&self, key: &str) -> Result<contrail_proto::admin::v1::ReadKeyStateResponse> {
        let key = key.to_owned();
        self.admin(|mut client, token| async move {
            let request = authorized(contrail_proto::admin::v1::ReadKeyStateRequest { key }, &token)?;
            Ok(client.read_key_state(request).await?.into_inner())
        })
    }

    /// Waits until the instance owns `partitions` shards, has processed every one of them up to
    /// the raw topic's end and has no unacknowledged output.
    pub fn wait_caught_up(&mut self, partitions: usize, timeout: Duration) -> Result<StatusResponse> {
        let ends = self.raw_ends()?;
        self.wait_caught_up_to(partitions, &ends, timeout)
    }

    /// The ends of the raw topic, read from the topic once nothing new arrived for 1.5 s: the local
    /// broker's high watermarks were seen below offsets it had served, so "lag 0" alone can be
    /// reported too early.
    pub fn raw_ends(&self) -> Result<BTreeMap<i32, i64>> {
        crate::quiescent_ends(&self.brokers, &self.raw_topic, Duration::from_millis(1_500))
    }

    /// Waits until the instance owns `partitions` shards (assigned and opened or restored).
    pub fn wait_assigned(&mut self, partitions: usize, timeout: Duration) -> Result<StatusResponse> {
        let (grpc_url, token) = (self.grpc_url.clone(), self.token.clone());
        self.process.wait_until(
            &format!("{partitions} shards owned"),
            timeout,
            || match status_of(&grpc_url, &token) {
                Ok(status) if status.partitions.len() == partitions => Ok(Probe::Ready(status)),
                Ok(status) => Ok(Probe::NotYet(format!("{} shards owned", status.partitions.len()))),
                Err(error) => Ok(Probe::NotYet(format!("admin Status: {error:#}"))),
            },
        )
    }

    /// [`DedupUnderTest::wait_caught_up`] to ends known already (see [`DedupUnderTest::raw_ends`]).
    pub fn wait_caught_up_to(
        &mut self,
        partitions: usize,
        ends: &BTreeMap<i32, i64>,
        timeout: Duration,
    ) -> Result<StatusResponse> {
        let (grpc_url, token) = (self.grpc_url.clone(), self.token.clone());
        self.process.wait_until(
            &format!("{partitions} shards processed up to the raw topic's ends {ends:?}, nothing in flight"),
            timeout,
            || {
                let status = match status_of(&grpc_url, &token) {
                    Ok(status) => status,
                    Err(error) => return Ok(Probe::NotYet(format!("admin Status: {error:#}"))),
                };
                let done = status.partitions.len() == partitions
                    && status.partitions.iter().all(|partition| {
                        partition.committed_offset >= ends.get(&partition.partition).copied().unwrap_or(0)
                    })
                    && status.in_flight == 0;
                if done {
                    return Ok(Probe::Ready(status));
                }
                let positions: Vec<(i32, i64)> = status
                    .partitions
                    .iter()
                    .map(|partition| (partition.partition, partition.committed_offset))
                    .collect();
                Ok(Probe::NotYet(format!(
                    "shards at {positions:?}, {} outputs in flight",
                    status.in_flight
                )))
            },
        )
    }
}

/// Calls the admin API at `grpc_url` with `token`.
fn admin_call<T, F, Fut>(grpc_url: &str, token: &str, call: F) -> Result<T>
where
    F: FnOnce(
        contrail_proto::admin::v1::admin_service_client::AdminServiceClient<tonic::transport::Channel>,
        String,
    ) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client =
            contrail_proto::admin::v1::admin_service_client::AdminServiceClient::connect(grpc_url.to_owned())
                .await?;
        call(client, format!("Bearer {token}")).await
    })
}

/// The admin `Status` of the dedup-state instance at `grpc_url`.
pub fn status_of(grpc_url: &str, token: &str) -> Result<StatusResponse> {
    admin_call(grpc_url, token, |mut client, token| async move {
        Ok(client
            .status(authorized(contrail_proto::admin::v1::StatusRequest {}, &token)?)
            .await?
            .into_inner())
    })
}
