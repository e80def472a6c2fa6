//! `contrail up` as a real process: the platform with all its processes, on ports shifted by a
//! free offset, with its summary file and its endpoints.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::workspace_binary;

/// Default ports of a `contrail up` platform (board, broker, Cosmos, stages' HTTP and gRPC).
const PORTS: [u16; 13] = [
    8000, 9092, 8900, 8080, 8081, 8082, 8083, 8084, 9090, 9091, 9192, 9193, 9194,
];

/// A port offset at which every port of a platform is free.
pub fn free_offset() -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos() as u64)
        .unwrap_or(0);
    let seed = (std::process::id() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ nanos;
    for attempt in 0..200u64 {
        let offset = 20_000 + ((seed.wrapping_add(attempt * 131)) % 300) as u16 * 100;
        let free = PORTS
            .iter()
            .all(|port| std::net::TcpListener::bind(("127.0.0.1", port + offset)).is_ok());
        if free {
            return offset;
        }
    }
    panic!("no free port offset")
}

/// A running `contrail up`.
pub struct UpUnderTest {
    child: Child,
    /// Its working directory.
    pub workdir: PathBuf,
    /// Its port offset.
    pub offset: u16,
    summary: PathBuf,
    log: PathBuf,
}

impl UpUnderTest {
    /// Starts `contrail up ARGS --workdir DIR/up --port-offset N --summary-json DIR/summary.json`.
    pub fn start(dir: &Path, args: &[&str]) -> Result<UpUnderTest> {
        std::fs::create_dir_all(dir)?;
        let offset = free_offset();
        let workdir = dir.join("up");
        let summary = dir.join("summary.json");
        let log = dir.join("contrail-up.log");
        let file = std::fs::File::create(&log)?;
        let mut command = Command::new(workspace_binary("contrail")?);
        command
            .arg("up")
            .args(args)
            .arg("--workdir")
            .arg(&workdir)
            .args(["--port-offset", &offset.to_string()])
            .arg("--summary-json")
            .arg(&summary)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        let child = command.spawn().context("starting contrail up")?;
        Ok(UpUnderTest {
            child,
            workdir,
            offset,
            summary,
            log,
        })
    }

    /// The broker's address.
    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", 9092 + self.offset)
    }

    /// The Cosmos endpoint.
    pub fn cosmos_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/", 8900 + self.offset)
    }

    /// The board's base URL.
    pub fn board_url(&self) -> String {
        format!("http://127.0.0.1:{}/", 8000 + self.offset)
    }

    /// The Delta root.
    pub fn delta_root(&self) -> PathBuf {
        self.workdir.join("delta")
    }

    /// What `contrail up` printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the summary (written once the stores settled); fails if the process exits first.
    pub fn wait_summary(&mut self, timeout: Duration) -> Result<serde_json::Value> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(text) = std::fs::read_to_string(&self.summary)
                && let Ok(summary) = serde_json::from_str(&text)
            {
                return Ok(summary);
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "contrail up exited ({status}) before its summary:\n{}",
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        bail!("no summary after {timeout:?}:\n{}", self.output())
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }

    /// SIGINT (Ctrl-C), then waits for a graceful exit.
    pub fn interrupt(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        crate::send_signal(self.child.id(), crate::libc::SIGINT);
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!(
            "contrail up did not stop within {timeout:?} of SIGINT:\n{}",
            self.output()
        )
    }
}

impl Drop for UpUnderTest {
    fn drop(&mut self) {
        if self.is_running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
