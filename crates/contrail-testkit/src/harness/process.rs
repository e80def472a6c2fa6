//! Processes: free ports, stage binaries of this workspace as child processes that die with the
//! test, signals.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::harness::wait::{Probe, log_tail, wait_until};

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .unwrap_or(0)
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
        StageProcess::spawn_with_args(binary, &[], env, log_path)
    }

    /// [`StageProcess::spawn`] with command-line arguments.
    pub fn spawn_with_args(
        binary: &Path,
        args: &[String],
        env: &[(String, String)],
        log_path: &Path,
    ) -> Result<StageProcess> {
        StageProcess::spawn_in(binary, args, env, log_path, None)
    }

    /// [`StageProcess::spawn_with_args`] in working directory `dir` (the test's own when `None`).
    pub fn spawn_in(
        binary: &Path,
        args: &[String],
        env: &[(String, String)],
        log_path: &Path,
        dir: Option<&Path>,
    ) -> Result<StageProcess> {
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
            .args(args)
            .envs(env.iter().map(|(key, value)| (key.as_str(), value.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(dir) = dir {
            command.current_dir(dir);
        }
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

    /// Waits until the admin `status` (a call of this process's admin API) reports a partition
    /// held at a gap; returns the first one reported.
    pub fn wait_gap_held(
        &mut self,
        timeout: Duration,
        status: impl Fn() -> Result<contrail_proto::admin::v1::StatusResponse>,
    ) -> Result<contrail_proto::admin::v1::GapStatus> {
        self.wait_until("a partition held at a gap", timeout, || {
            let status = match status() {
                Ok(status) => status,
                Err(error) => return Ok(Probe::NotYet(format!("{error:#}"))),
            };
            Ok(match status.gaps.first() {
                Some(gap) => Probe::Ready(gap.clone()),
                None => Probe::NotYet(format!("no gap; partitions {:?}", status.partitions)),
            })
        })
    }
}

impl Drop for StageProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}
