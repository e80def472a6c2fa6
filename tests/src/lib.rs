//! Shared helpers of the cross-service tests in `tests/tests/`: starting stages against the shared
//! broker with unique topic names, so tests run in parallel without seeing each other's records.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
pub use contrail_testkit::*;

pub mod browser;
pub mod cosmos;
pub mod dedup;
pub mod delta;
pub mod up;

/// A unique suffix for topic names and directories of one test.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

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
    /// The token it accepts.
    pub token: String,
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

/// Whether `GET url` answers 200; otherwise what it answered (status line or connection error).
pub fn answers_200(url: &str) -> Probe<()> {
    match http_get(url) {
        Ok(response) if response.starts_with("HTTP/1.1 200") => Probe::Ready(()),
        Ok(response) => Probe::NotYet(response.lines().next().unwrap_or_default().to_owned()),
        Err(error) => Probe::NotYet(format!("GET {url}: {error}")),
    }
}

/// A minimal blocking HTTP POST of a JSON `body` without credentials (status line and body).
pub fn http_post(url: &str, body: &str) -> Result<String> {
    use std::io::{Read, Write};
    let without_scheme = url.trim_start_matches("http://");
    let (host, path) = without_scheme.split_once('/').unwrap_or((without_scheme, ""));
    let mut stream = std::net::TcpStream::connect(host)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "POST /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

/// A minimal blocking HTTP GET (status line and body), for probes.
pub fn http_get(url: &str) -> Result<String> {
    use std::io::{Read, Write};
    let without_scheme = url.trim_start_matches("http://");
    let (host, path) = without_scheme.split_once('/').unwrap_or((without_scheme, ""));
    let mut stream = std::net::TcpStream::connect(host)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

/// A small deterministic generator for kill moments (the seed is printed for reproduction).
pub struct Moments(pub u64);

impl Moments {
    /// Seeded from the clock; prints the seed.
    pub fn from_clock() -> Moments {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos() as u64 | 1)
            .unwrap_or(0x2013);
        println!("kill moments seed: {seed:#x}");
        Moments(seed)
    }

    /// A number of milliseconds in `low..high`.
    pub fn next_ms(&mut self, low: u64, high: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        low + self.0 % (high - low)
    }
}

/// A fresh directory under the system temp dir.
pub fn test_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(unique(name));
    std::fs::create_dir_all(&dir).expect("test dir");
    dir
}

/// An idempotent producer for tests (acks from all replicas, 5 ms linger).
pub fn test_producer(
    brokers: &str,
) -> anyhow::Result<rdkafka::producer::ThreadedProducer<rdkafka::producer::DefaultProducerContext>> {
    use anyhow::Context as _;
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .context("producer")
}

/// Sends one record, waiting while the producer's local queue is full.
pub fn send_waiting(
    producer: &rdkafka::producer::ThreadedProducer<rdkafka::producer::DefaultProducerContext>,
    topic: &str,
    key: &str,
    payload: &[u8],
) -> anyhow::Result<()> {
    let mut record = rdkafka::producer::BaseRecord::to(topic).key(key).payload(payload);
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((
                rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                back,
            )) => {
                record = back;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((error, _)) => anyhow::bail!("produce to {topic}: {error}"),
        }
    }
}
