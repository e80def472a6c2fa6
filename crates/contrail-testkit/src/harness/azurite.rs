//! Azurite, Microsoft's Azure Storage emulator (blob service, from npm; scripts/setup.sh installs
//! it), for the tests of the Delta tables on Azure Storage. Containers are created and listed with
//! Microsoft's own Python client (azure-storage-blob), not with the code under test.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::harness::process::{StageProcess, free_port};
use crate::harness::wait::wait_for_port;

/// The emulator's account.
pub const ACCOUNT: &str = "devstoreaccount1";
/// The emulator's account key: fixed and publicly documented by Microsoft (it grants nothing
/// outside a local emulator).
pub const ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// A running Azurite blob service.
pub struct Azurite {
    /// The process.
    pub process: StageProcess,
    /// `http://127.0.0.1:PORT` (what object_store calls `AZURITE_BLOB_STORAGE_URL`).
    pub blob_url: String,
}

fn azurite_binary() -> PathBuf {
    std::env::var_os("CONTRAIL_AZURITE_BLOB").map_or_else(
        || PathBuf::from("/var/tmp/contrail-tools/azurite/node_modules/.bin/azurite-blob"),
        PathBuf::from,
    )
}

impl Azurite {
    /// Starts the blob service on a free loopback port with its data in `dir`.
    pub fn start(dir: &Path) -> Result<Azurite> {
        std::fs::create_dir_all(dir)?;
        let binary = azurite_binary();
        if !binary.exists() {
            bail!(
                "{} is missing: scripts/setup.sh installs Azurite",
                binary.display()
            );
        }
        let port = free_port();
        let process = StageProcess::spawn_with_args(
            &binary,
            &[
                "--blobHost".to_owned(),
                "127.0.0.1".to_owned(),
                "--blobPort".to_owned(),
                port.to_string(),
                "--location".to_owned(),
                dir.join("data").display().to_string(),
                "--skipApiVersionCheck".to_owned(),
                "--loose".to_owned(),
            ],
            &[],
            &dir.join("azurite.log"),
        )?;
        wait_for_port(&format!("127.0.0.1:{port}"), Duration::from_secs(60)).context("Azurite listens")?;
        Ok(Azurite {
            process,
            blob_url: format!("http://127.0.0.1:{port}"),
        })
    }

    /// The account's blob endpoint.
    pub fn account_url(&self) -> String {
        format!("{}/{ACCOUNT}", self.blob_url)
    }

    fn python(&self, script: &str, args: &[&str]) -> Result<String> {
        let output = std::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(self.account_url())
            .arg(ACCOUNT)
            .arg(ACCOUNT_KEY)
            .args(args)
            .output()
            .context("python3 (azure-storage-blob; scripts/setup.sh installs it)")?;
        if !output.status.success() {
            bail!("azure-storage-blob: {}", String::from_utf8_lossy(&output.stderr));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Creates container `name`.
    pub fn create_container(&self, name: &str) -> Result<()> {
        self.python(
            "import sys\nfrom azure.storage.blob import BlobServiceClient\n\
             url, account, key, name = sys.argv[1:5]\n\
             BlobServiceClient(url, credential={'account_name': account, 'account_key': key}).create_container(name)",
            &[name],
        )?;
        Ok(())
    }

    /// The names of every blob in container `name`.
    pub fn blob_names(&self, name: &str) -> Result<Vec<String>> {
        let listed = self.python(
            "import sys\nfrom azure.storage.blob import BlobServiceClient\n\
             url, account, key, name = sys.argv[1:5]\n\
             client = BlobServiceClient(url, credential={'account_name': account, 'account_key': key})\n\
             print('\\n'.join(blob.name for blob in client.get_container_client(name).list_blobs()))",
            &[name],
        )?;
        Ok(listed
            .lines()
            .filter(|line| !line.is_empty())
            .map(str::to_owned)
            .collect())
    }

    /// delta-archiver's settings for this emulator (delta-rs' Azure store options).
    pub fn archiver_env(&self) -> Vec<(String, String)> {
        [
            (
                "CONTRAIL_DELTA__STORAGE_OPTIONS__AZURE_STORAGE_USE_EMULATOR",
                "true".to_owned(),
            ),
            (
                "CONTRAIL_DELTA__STORAGE_OPTIONS__AZURE_STORAGE_ACCOUNT_NAME",
                ACCOUNT.to_owned(),
            ),
            (
                "CONTRAIL_DELTA__STORAGE_OPTIONS__AZURE_STORAGE_ACCOUNT_KEY",
                ACCOUNT_KEY.to_owned(),
            ),
            ("AZURITE_BLOB_STORAGE_URL", self.blob_url.clone()),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect()
    }

    /// The independent reader's environment (crates/contrail-testkit/python/verify_delta.py).
    pub fn reader_env(&self) -> Vec<(String, String)> {
        let options = serde_json::json!({
            "use_emulator": "true",
            "account_name": ACCOUNT,
            "account_key": ACCOUNT_KEY,
        });
        vec![
            ("CONTRAIL_VERIFY_STORAGE_OPTIONS".to_owned(), options.to_string()),
            ("CONTRAIL_VERIFY_BLOB_ACCOUNT_URL".to_owned(), self.account_url()),
            ("AZURITE_BLOB_STORAGE_URL".to_owned(), self.blob_url.clone()),
        ]
    }
}
