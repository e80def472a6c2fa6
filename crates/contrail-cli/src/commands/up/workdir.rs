//! The working directory of `contrail up`: made (or emptied, only if it is its own), and the
//! files it leaves for the user (endpoints, the ingest token).

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::local::{Ports, Scale};

/// Marks a directory `contrail up` made, so it only ever empties its own.
const WORKDIR_MARKER: &str = ".contrail-up";

pub(super) fn prepare_workdir(workdir: &Path) -> Result<()> {
    let foreign = std::fs::read_dir(workdir)
        .map(|mut entries| entries.next().is_some())
        .unwrap_or(false)
        && !workdir.join(WORKDIR_MARKER).exists();
    if foreign {
        bail!(
            "--workdir {} is not empty and was not made by contrail up (no {WORKDIR_MARKER} in it): pick a new or empty directory",
            workdir.display()
        );
    }
    for sub in ["logs", "shards", "checkpoints", "delta", "cursors", "broker"] {
        let path = workdir.join(sub);
        if path.exists() {
            std::fs::remove_dir_all(&path).with_context(|| format!("emptying {}", path.display()))?;
        }
    }
    std::fs::create_dir_all(workdir.join("logs"))
        .with_context(|| format!("creating {}", workdir.display()))?;
    std::fs::write(
        workdir.join(WORKDIR_MARKER),
        "made by contrail up, which empties logs/ shards/ checkpoints/ delta/ cursors/ broker/ here at start\n",
    )
    .with_context(|| format!("writing {}", workdir.join(WORKDIR_MARKER).display()))?;
    Ok(())
}

/// A random bearer token (128 bits from the kernel's generator, hex).
pub(super) fn random_token() -> Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .context("reading /dev/urandom for the ingest token")?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// Writes a secret readable by its owner only.
pub(super) fn write_secret(path: &Path, secret: &str) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    writeln!(file, "{secret}").with_context(|| format!("writing {}", path.display()))
}

pub(super) fn write_endpoints(workdir: &Path, ports: Ports, scale: &Scale) -> Result<()> {
    let replicas = scale.replicas();
    let stages: serde_json::Map<String, Value> = scale
        .stages()
        .iter()
        .map(|stage| {
            let instances: Vec<Value> = replicas
                .iter()
                .filter(|replica| replica.stage == *stage)
                .map(|replica| {
                    json!({
                        "name": replica.name(),
                        "http": format!("http://127.0.0.1:{}", ports.http_of(replica)),
                        "grpc": format!("http://127.0.0.1:{}", ports.grpc_of(replica)),
                    })
                })
                .collect();
            (
                stage.name.to_owned(),
                json!({
                    "http": format!("http://127.0.0.1:{}", ports.http(stage)),
                    "grpc": format!("http://127.0.0.1:{}", ports.grpc(stage)),
                    "instances": instances,
                }),
            )
        })
        .collect();
    let endpoints = json!({
        "port_offset": ports.offset,
        "board": format!("http://127.0.0.1:{}/", ports.board()),
        "broker": format!("127.0.0.1:{}", ports.broker()),
        "cosmos": ports.cosmos_endpoint(),
        "delta_root": workdir.join("delta"),
        "ingest_token_file": workdir.join("ingest-token"),
        "stages": stages,
    });
    let path = workdir.join("up.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&endpoints)?)
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_new_empty_or_own_working_directory_is_emptied() {
        let base = std::env::temp_dir().join(format!("contrail-up-workdir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        // A new directory: made and marked.
        prepare_workdir(&base).expect("new");
        assert!(base.join(WORKDIR_MARKER).is_file());
        std::fs::create_dir_all(base.join("delta/events")).expect("data of a run");
        prepare_workdir(&base).expect("its own");
        assert!(!base.join("delta").exists(), "the previous run's tables are gone");
        // Somebody else's directory with a `logs` folder is refused and left alone.
        let foreign = base.join("home");
        std::fs::create_dir_all(foreign.join("logs")).expect("foreign");
        let error = prepare_workdir(&foreign).expect_err("not ours").to_string();
        assert!(error.contains("not empty"), "{error}");
        assert!(foreign.join("logs").exists());
        let _ = std::fs::remove_dir_all(&base);
    }
}
