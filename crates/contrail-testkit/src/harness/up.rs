//! `contrail up` as a real process: the platform with all its processes, on ports shifted by a
//! free offset, with its summary file and its endpoints.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::workspace_binary;

/// Default ports of a `contrail up` platform (board, broker, Cosmos, stages' HTTP and gRPC): the
/// lowest is 8000, the highest 9194.
const PORTS: [u16; 13] = [
    8000, 9092, 8900, 8080, 8081, 8082, 8083, 8084, 9090, 9091, 9192, 9193, 9194,
];

/// Offsets step by more than the platform's port span (8000–9194), so two platforms never share a
/// port, and stay below the kernel's ephemeral range (32768 and up on Linux), where the outgoing
/// connections of every test and stage take their local ports.
const OFFSET_STEP: u16 = 1_200;
const OFFSET_SLOTS: std::ops::RangeInclusive<u16> = 2..=19; // offsets 2,400 … 22,800: ports ≤ 31,994

/// A port offset at which every port of a platform is free, reserved for this process by an
/// exclusive lock on a file named after it (held by the returned file) so that two tests never
/// pick the same one.
pub fn free_offset() -> (u16, std::fs::File) {
    let start = std::process::id() as u16;
    let slots: Vec<u16> = OFFSET_SLOTS.collect();
    for attempt in 0..slots.len() {
        let offset = slots[(start as usize + attempt) % slots.len()] * OFFSET_STEP;
        let lock_path = std::env::temp_dir().join(format!("contrail-up-offset-{offset}.lock"));
        let Ok(lock) = std::fs::File::create(&lock_path) else {
            continue;
        };
        if lock.try_lock().is_err() {
            continue;
        }
        let free = PORTS
            .iter()
            .all(|port| std::net::TcpListener::bind(("127.0.0.1", port + offset)).is_ok());
        if free {
            return (offset, lock);
        }
    }
    panic!("no free port offset: every slot is locked by another test or has a port in use")
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
    /// Holds the port offset for this platform.
    _offset_lock: std::fs::File,
}

impl UpUnderTest {
    /// Starts `contrail up ARGS --workdir DIR/up --port-offset N --summary-json DIR/summary.json`.
    pub fn start(dir: &Path, args: &[&str]) -> Result<UpUnderTest> {
        std::fs::create_dir_all(dir)?;
        let (offset, offset_lock) = free_offset();
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
        crate::die_with_parent(&mut command);
        let child = command.spawn().context("starting contrail up")?;
        Ok(UpUnderTest {
            child,
            workdir,
            offset,
            summary,
            log,
            _offset_lock: offset_lock,
        })
    }

    /// The board's `/api/meta` (`phase`, `status`, `dates`), or what went wrong reaching it.
    pub fn meta(&self) -> Result<serde_json::Value> {
        meta_at(&self.board_url())
    }

    /// Waits until the board answers and the platform's phase satisfies `reached`, while
    /// `contrail up` runs; the error names the condition, the last phase or error seen, and the
    /// tail of what `contrail up` printed.
    pub fn wait_phase(
        &mut self,
        condition: &str,
        timeout: Duration,
        reached: impl Fn(&str) -> bool,
    ) -> Result<()> {
        let board_url = self.board_url();
        let child = &mut self.child;
        let result = crate::wait_until(condition, timeout, || {
            if let Some(status) = child.try_wait()? {
                bail!("contrail up exited ({status})");
            }
            Ok(match meta_at(&board_url) {
                Ok(meta) => {
                    let phase = meta["phase"].as_str().unwrap_or_default().to_owned();
                    if reached(&phase) {
                        crate::Probe::Ready(())
                    } else {
                        crate::Probe::NotYet(format!("phase {phase:?}"))
                    }
                }
                Err(error) => crate::Probe::NotYet(format!("GET /api/meta: {error:#}")),
            })
        });
        result.map_err(|error| anyhow::anyhow!("{error:#}\n{}", self.output_tail(60)))
    }

    /// The last `lines` lines of what `contrail up` printed, and the last lines of every process
    /// log of the platform.
    pub fn output_tail(&self, lines: usize) -> String {
        let mut text = crate::log_tail(&self.log, lines);
        if let Ok(entries) = std::fs::read_dir(self.workdir.join("logs")) {
            let mut logs: Vec<PathBuf> = entries.filter_map(|entry| entry.ok().map(|e| e.path())).collect();
            logs.sort();
            for log in logs {
                text.push('\n');
                text.push_str(&crate::log_tail(&log, 8));
            }
        }
        text
    }

    /// The broker's address.
    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", 9092 + self.offset)
    }

    /// The Cosmos endpoint.
    pub fn cosmos_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/", 8900 + self.offset)
    }

    /// Ingest's HTTP base URL.
    pub fn ingest_url(&self) -> String {
        format!("http://127.0.0.1:{}", 8080 + self.offset)
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
                    self.output_tail(80)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        bail!("no summary after {timeout:?}:\n{}", self.output_tail(80))
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

/// `GET {board_url}api/meta` as JSON; an error names the status line or the connection error.
fn meta_at(board_url: &str) -> Result<serde_json::Value> {
    let response = crate::http_get(&format!("{board_url}api/meta"))?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if !head.starts_with("HTTP/1.1 200") {
        bail!("{}", head.lines().next().unwrap_or_default());
    }
    Ok(serde_json::from_str(body.trim())?)
}
