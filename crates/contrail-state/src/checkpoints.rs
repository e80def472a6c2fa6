//! The checkpoint store: shard checkpoints and epoch manifests in an `object_store`: a local
//! directory (or a mounted volume), or Azure Blob / ADLS Gen2 at
//! `abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH` ([`CheckpointStore::open`]).
//!
//! Layout under the root: `epoch-{epoch:020}/shard-{partition}/{file}` for a shard's RocksDB
//! checkpoint files and `epoch-{epoch:020}/MANIFEST.json` once the epoch is complete. An epoch
//! without a manifest is incomplete and never restored from.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::error::StateError;
use crate::protocol::{Manifest, ShardCheckpoint};

/// What one shard upload wrote: its manifest entry and its files (name → size).
#[derive(Debug, Clone)]
pub struct ShardUpload {
    /// The manifest entry.
    pub checkpoint: ShardCheckpoint,
    /// Every file of the checkpoint with its size.
    pub files: BTreeMap<String, u64>,
    /// How many SST files were copied from the previous upload instead of uploaded.
    pub reused: usize,
}

/// Checkpoints in an object store.
#[derive(Clone)]
pub struct CheckpointStore {
    store: Arc<dyn ObjectStore>,
    /// The directory of a local store: `object_store` deletes files but leaves their (empty)
    /// directories, which would still list as epochs.
    local_root: Option<std::path::PathBuf>,
}

fn store_error(error: impl std::fmt::Display) -> StateError {
    StateError::CheckpointStore(error.to_string())
}

fn epoch_prefix(epoch: u64) -> String {
    format!("epoch-{epoch:020}")
}

impl CheckpointStore {
    /// A store over any `object_store` backend.
    pub fn new(store: Arc<dyn ObjectStore>) -> CheckpointStore {
        CheckpointStore {
            store,
            local_root: None,
        }
    }

    /// The store at `url`: a local directory (a path or `file://PATH`), or Azure Blob / ADLS Gen2
    /// at `abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH` (`abfs://` too), configured by the
    /// environment (`AZURE_*`: workload identity on AKS) and `options` — object_store's Azure keys
    /// such as `azure_storage_account_key` or `azure_storage_use_emulator`; an unknown key is
    /// refused with its name. Other schemes (`az://`, whose path handling differs between tools,
    /// `s3://`, …) are refused.
    pub fn open(url: &str, options: &BTreeMap<String, String>) -> Result<CheckpointStore, StateError> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return CheckpointStore::local(Path::new(url));
        };
        let scheme = scheme.to_ascii_lowercase();
        if scheme == "file" {
            return CheckpointStore::local(Path::new(rest));
        }
        if scheme != "abfss" && scheme != "abfs" {
            return Err(StateError::CheckpointStore(format!(
                "checkpoint store {url:?}: {scheme}:// is not supported; give a path or \
                 abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH"
            )));
        }
        let invalid =
            |reason: String| StateError::CheckpointStore(format!("checkpoint store {url:?}: {reason}"));
        let parsed = url::Url::parse(url).map_err(|error| invalid(error.to_string()))?;
        if parsed.username().is_empty() {
            return Err(invalid(
                "name the container and the account: abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH"
                    .to_owned(),
            ));
        }
        let mut builder = object_store::azure::MicrosoftAzureBuilder::from_env().with_url(url);
        for (key, value) in options {
            let config: object_store::azure::AzureConfigKey =
                key.to_ascii_lowercase().parse().map_err(|_| {
                    invalid(format!(
                        "unknown storage option {key:?} (object_store's Azure keys)"
                    ))
                })?;
            builder = builder.with_config(config, value.clone());
        }
        let store = builder.build().map_err(|error| invalid(error.to_string()))?;
        let prefix = StorePath::parse(parsed.path()).map_err(|error| invalid(error.to_string()))?;
        let store: Arc<dyn ObjectStore> = if prefix.as_ref().is_empty() {
            Arc::new(store)
        } else {
            Arc::new(object_store::prefix::PrefixStore::new(store, prefix))
        };
        Ok(CheckpointStore::new(store))
    }

    /// A store in a local directory (created if missing).
    pub fn local(root: &Path) -> Result<CheckpointStore, StateError> {
        std::fs::create_dir_all(root).map_err(store_error)?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(root).map_err(store_error)?;
        Ok(CheckpointStore {
            store: Arc::new(store),
            local_root: Some(root.to_owned()),
        })
    }

    /// Uploads a shard's local RocksDB checkpoint directory for `epoch`; returns its entry.
    pub async fn upload_shard(
        &self,
        epoch: u64,
        partition: i32,
        next_offset: i64,
        local_dir: &Path,
    ) -> Result<ShardCheckpoint, StateError> {
        Ok(self
            .upload_shard_reusing(epoch, partition, next_offset, local_dir, None)
            .await?
            .checkpoint)
    }

    /// As [`CheckpointStore::upload_shard`], reusing the SST files of `previous` — an earlier
    /// upload of the *same* RocksDB instance (same open), where an SST file name never denotes two
    /// contents: an SST with the same name and size is copied inside the store (a hard link in a
    /// local store, a server-side copy in a cloud store) instead of uploaded again. Each epoch stays
    /// self-contained, so garbage collection of older epochs never breaks a newer one. A failed
    /// copy (the previous epoch was collected meanwhile) falls back to an upload.
    pub async fn upload_shard_reusing(
        &self,
        epoch: u64,
        partition: i32,
        next_offset: i64,
        local_dir: &Path,
        previous: Option<&ShardUpload>,
    ) -> Result<ShardUpload, StateError> {
        let location = format!("{}/shard-{partition}", epoch_prefix(epoch));
        let mut files = BTreeMap::new();
        let mut reused = 0;
        let mut entries = tokio::fs::read_dir(local_dir).await.map_err(store_error)?;
        while let Some(entry) = entries.next_entry().await.map_err(store_error)? {
            let metadata = entry.metadata().await.map_err(store_error)?;
            if !metadata.is_file() {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let target = StorePath::from(format!("{location}/{name}"));
            let reusable = previous.filter(|previous| {
                name.ends_with(".sst") && previous.files.get(&name) == Some(&metadata.len())
            });
            let copied = match reusable {
                Some(previous) => {
                    let source = StorePath::from(format!("{}/{name}", previous.checkpoint.location));
                    self.store.copy(&source, &target).await.is_ok()
                }
                None => false,
            };
            if copied {
                reused += 1;
            } else {
                let bytes = tokio::fs::read(entry.path()).await.map_err(store_error)?;
                self.store
                    .put(&target, PutPayload::from(bytes))
                    .await
                    .map_err(store_error)?;
            }
            files.insert(name, metadata.len());
        }
        Ok(ShardUpload {
            checkpoint: ShardCheckpoint {
                partition,
                next_offset,
                location,
            },
            files,
            reused,
        })
    }

    /// Downloads a shard checkpoint into `target_dir` (which must not exist), atomically: files go
    /// to a temporary sibling directory that is renamed into place when complete.
    pub async fn download_shard(
        &self,
        checkpoint: &ShardCheckpoint,
        target_dir: &Path,
    ) -> Result<(), StateError> {
        let staging = target_dir.with_extension("restoring");
        let _ = tokio::fs::remove_dir_all(&staging).await;
        tokio::fs::create_dir_all(&staging).await.map_err(store_error)?;
        let prefix = StorePath::from(checkpoint.location.as_str());
        let objects = self.list_under(&prefix).await?;
        for object in objects {
            let Some(name) = object.location.filename() else {
                continue;
            };
            let bytes = self
                .store
                .get(&object.location)
                .await
                .map_err(store_error)?
                .bytes()
                .await
                .map_err(store_error)?;
            tokio::fs::write(staging.join(name), &bytes)
                .await
                .map_err(store_error)?;
        }
        tokio::fs::rename(&staging, target_dir).await.map_err(store_error)
    }

    /// Writes an epoch's manifest (the coordinator does this once the epoch is complete).
    pub async fn write_manifest(&self, manifest: &Manifest) -> Result<(), StateError> {
        if !manifest.is_complete() {
            return Err(StateError::CheckpointStore(format!(
                "epoch {} is not complete",
                manifest.epoch
            )));
        }
        let bytes = serde_json::to_vec_pretty(manifest).map_err(store_error)?;
        let path = StorePath::from(format!("{}/MANIFEST.json", epoch_prefix(manifest.epoch)));
        self.store
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(store_error)?;
        Ok(())
    }

    /// Every epoch present in the store (complete or not).
    pub async fn epochs(&self) -> Result<BTreeSet<u64>, StateError> {
        let listing = self.store.list_with_delimiter(None).await.map_err(store_error)?;
        Ok(listing
            .common_prefixes
            .iter()
            .filter_map(|prefix| prefix.as_ref().strip_prefix("epoch-")?.parse().ok())
            .collect())
    }

    /// Every readable manifest.
    pub async fn manifests(&self) -> Result<Vec<Manifest>, StateError> {
        let mut manifests = Vec::new();
        for epoch in self.epochs().await? {
            let path = StorePath::from(format!("{}/MANIFEST.json", epoch_prefix(epoch)));
            match self.store.get(&path).await {
                Ok(result) => {
                    let bytes = result.bytes().await.map_err(store_error)?;
                    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(store_error)?;
                    manifests.push(manifest);
                }
                Err(object_store::Error::NotFound { .. }) => {}
                Err(error) => return Err(store_error(error)),
            }
        }
        Ok(manifests)
    }

    /// Every object under `prefix`.
    async fn list_under(&self, prefix: &StorePath) -> Result<Vec<object_store::ObjectMeta>, StateError> {
        self.store
            .list(Some(prefix))
            .try_collect()
            .await
            .map_err(store_error)
    }

    /// Deletes every object of `epoch`.
    pub async fn delete_epoch(&self, epoch: u64) -> Result<(), StateError> {
        let prefix = StorePath::from(epoch_prefix(epoch));
        let objects = self.list_under(&prefix).await?;
        for object in objects {
            self.store.delete(&object.location).await.map_err(store_error)?;
        }
        if let Some(root) = &self.local_root {
            match tokio::fs::remove_dir_all(root.join(epoch_prefix(epoch))).await {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(store_error(error)),
            }
        }
        Ok(())
    }
}
