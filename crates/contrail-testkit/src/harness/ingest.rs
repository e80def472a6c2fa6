//! An ingest process with unique topics and a token, restartable as "the same" deployment.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::harness::fixture::unique;
use crate::harness::http::answers_200;
use crate::harness::process::{StageProcess, free_port, workspace_binary};

/// An ingest process and how to reach it.
pub struct IngestUnderTest {
    /// The process.
    pub process: StageProcess,
    /// `http://127.0.0.1:PORT`.
    pub http_url: String,
    /// `http://127.0.0.1:PORT` of the gRPC server.
    pub grpc_url: String,
    /// Raw topic of this test.
    pub raw_topic: String,
    /// DLQ topic of this test.
    pub dlq_topic: String,
    /// The producers' token it accepts on the ingest API.
    pub token: String,
    /// The operators' token it accepts on the admin API (not on the ingest API).
    pub admin_token: String,
    /// Its working directory (cursors, log).
    pub dir: PathBuf,
    env: Vec<(String, String)>,
}

/// Settings for [`start_ingest`].
pub struct IngestOptions<'a> {
    /// Broker address.
    pub brokers: &'a str,
    /// Extra `CONTRAIL_*` settings.
    pub extra_env: Vec<(String, String)>,
    /// Working directory (created); a fresh temporary one when `None`.
    pub dir: Option<PathBuf>,
    /// Topic prefix (reuse one to restart "the same" deployment).
    pub topic_prefix: Option<String>,
}

/// Starts ingest with unique topics and a token, and waits until `/readyz` answers 200.
pub fn start_ingest(options: IngestOptions<'_>) -> Result<IngestUnderTest> {
    let mut ingest = spawn_ingest(options)?;
    ingest.wait_ready(Duration::from_secs(60))?;
    Ok(ingest)
}

/// Starts ingest with unique topics and a token, without waiting for readiness.
pub fn spawn_ingest(options: IngestOptions<'_>) -> Result<IngestUnderTest> {
    let name = options.topic_prefix.clone().unwrap_or_else(|| unique("t"));
    let dir = match options.dir {
        Some(dir) => dir,
        None => std::env::temp_dir().join(unique("contrail-ingest")),
    };
    std::fs::create_dir_all(&dir)?;
    let http_port = free_port();
    let grpc_port = free_port();
    let token = "test-token-0123456789".to_owned();
    let admin_token = "test-admin-token-9876543210".to_owned();
    let raw_topic = format!("{name}.ops.events.raw");
    let dlq_topic = format!("{name}.ops.events.dlq");
    let mut env = vec![
        ("CONTRAIL_KAFKA__BROKERS".to_owned(), options.brokers.to_owned()),
        (
            "CONTRAIL_LISTEN__HTTP".to_owned(),
            format!("127.0.0.1:{http_port}"),
        ),
        (
            "CONTRAIL_LISTEN__GRPC".to_owned(),
            format!("127.0.0.1:{grpc_port}"),
        ),
        ("CONTRAIL_TOPICS__RAW".to_owned(), raw_topic.clone()),
        ("CONTRAIL_TOPICS__DLQ".to_owned(), dlq_topic.clone()),
        ("CONTRAIL_TOPICS__PARTITIONS".to_owned(), "3".to_owned()),
        ("CONTRAIL_AUTH__TOKENS".to_owned(), format!("[\"{token}\"]")),
        (
            "CONTRAIL_ADMIN_AUTH__TOKENS".to_owned(),
            format!("[\"{admin_token}\"]"),
        ),
        (
            "CONTRAIL_CURSOR_DIR".to_owned(),
            dir.join("cursors").display().to_string(),
        ),
        ("RUST_LOG".to_owned(), "info".to_owned()),
    ];
    env.extend(options.extra_env);
    let binary = workspace_binary("ingest")?;
    let process = StageProcess::spawn(&binary, &env, &dir.join("ingest.log"))?;
    Ok(IngestUnderTest {
        process,
        http_url: format!("http://127.0.0.1:{http_port}"),
        grpc_url: format!("http://127.0.0.1:{grpc_port}"),
        raw_topic,
        dlq_topic,
        token,
        admin_token,
        dir,
        env,
    })
}

impl IngestUnderTest {
    /// Waits until `/readyz` answers 200.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let url = format!("{}/readyz", self.http_url);
        self.process
            .wait_until(&format!("GET {url} → 200"), timeout, || Ok(answers_200(&url)))
    }

    /// `kill -9`, then the same deployment again (same topics, ports, cursor directory).
    pub fn restart_after_kill9(&mut self) -> Result<()> {
        self.process.kill9();
        let binary = workspace_binary("ingest")?;
        self.process = StageProcess::spawn(&binary, &self.env, &self.dir.join("ingest.log"))?;
        self.wait_ready(Duration::from_secs(30))
    }
}

/// The `event_id`s of `OperationalEvent` messages, in topic order (panics on undecodable records:
/// the raw topic must hold only valid events).
pub fn event_ids(messages: &[rdkafka::message::OwnedMessage]) -> Vec<String> {
    use prost::Message as _;
    use rdkafka::Message as _;
    messages
        .iter()
        .map(|message| {
            let payload = message.payload().unwrap_or_default();
            contrail_proto::v1::OperationalEvent::decode(payload)
                .expect("an OperationalEvent")
                .event_id
        })
        .collect()
}
