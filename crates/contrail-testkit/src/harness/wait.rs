//! Waiting on a condition with a deadline that says, when it passes, what was seen last.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

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
