//! A Kafka-protocol broker that keeps its records and its consumer groups across restarts:
//! nisshi (tansu's successor) with its SQLite engine, its database in a directory of the test.
//! `scripts/setup.sh` builds it once per machine, outside the clone.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, bail};

use crate::harness::broker::wait_listening;
use crate::harness::process::{StageProcess, free_port};

/// Where `scripts/setup.sh` installs the durable broker when `CONTRAIL_TOOLS_DIR` is not set.
const DEFAULT_NISSHI: &str = "/var/tmp/contrail-tools/nisshi-0.8.1/bin/nisshi";

/// The durable broker's binary: `$CONTRAIL_NISSHI_BIN`, else where `scripts/setup.sh` puts it.
pub fn nisshi_binary() -> Result<PathBuf> {
    let path =
        std::env::var_os("CONTRAIL_NISSHI_BIN").map_or_else(|| PathBuf::from(DEFAULT_NISSHI), PathBuf::from);
    if path.is_file() {
        return Ok(path);
    }
    bail!(
        "the durable broker (nisshi with SQLite) was not found at {}: run scripts/setup.sh (it builds it once per machine) or set CONTRAIL_NISSHI_BIN",
        path.display()
    )
}

/// nisshi on SQLite in a directory of its own: `kill -9` it and start it again on the same port
/// and database.
pub struct DurableBroker {
    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub address: String,
    binary: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    log: PathBuf,
    process: Option<StageProcess>,
    /// How many times the broker was started.
    pub starts: usize,
}

impl DurableBroker {
    /// Starts the broker with its database `dir/broker.db` and its log `dir/broker.log`.
    pub fn start(dir: &Path) -> Result<DurableBroker> {
        std::fs::create_dir_all(dir)?;
        let binary = nisshi_binary()?;
        let port = free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        // nisshi reads a `sqlite://` URL's file relative to its working directory: `dir`.
        let args = [
            "broker",
            "--storage-engine",
            "sqlite://broker.db",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
            // Tests start a group's members one by one; Kafka's 3 s default only delays them.
            "--group-initial-rebalance-delay",
            "0s",
            "--silent",
        ]
        .map(str::to_owned)
        .to_vec();
        let mut broker = DurableBroker {
            address: format!("127.0.0.1:{port}"),
            binary,
            args,
            dir: dir.to_owned(),
            log: dir.join("broker.log"),
            process: None,
            starts: 0,
        };
        broker.restart()?;
        Ok(broker)
    }

    /// `kill -9` of the broker process (nothing if it is not running).
    pub fn kill9(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill9();
        }
    }

    /// Starts the broker (after a `kill -9` if it runs) and waits until it accepts connections.
    pub fn restart(&mut self) -> Result<()> {
        self.kill9();
        let mut process = StageProcess::spawn_in(&self.binary, &self.args, &[], &self.log, Some(&self.dir))?;
        wait_listening(
            &mut process,
            "the durable broker",
            &self.address,
            Duration::from_secs(60),
        )?;
        self.process = Some(process);
        self.starts += 1;
        Ok(())
    }

    /// The broker's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(StageProcess::pid)
    }

    /// The broker's log so far (every start appends to it).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
