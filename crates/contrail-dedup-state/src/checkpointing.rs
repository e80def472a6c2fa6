//! Coordinated checkpoints (docs/CONTRACT.md, "Checkpoints") over gRPC control messages
//! (`contrail.control.v1`).
//!
//! - [`ControlServer`] runs on every instance: a `Barrier(epoch)` asks the processing thread for a
//!   checkpoint handle of every owned shard (handed out between batches), takes the RocksDB
//!   checkpoints on a blocking thread while processing continues, uploads the files to the
//!   checkpoint store, and answers with one ack per shard (partition, next offset read from the
//!   checkpoint itself, location).
//! - [`Coordinator`] runs on one instance: it picks the next epoch, sends the barrier to every peer,
//!   and writes the epoch's manifest only if the acks cover every partition of the input topic
//!   (the pure [`protocol::epoch_complete`]); then it garbage-collects epochs older than the newest
//!   complete ones ([`protocol::garbage`]). An incomplete epoch is never restored from and is
//!   collected once a newer epoch completes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use contrail_proto::control::v1::checkpoint_control_client::CheckpointControlClient;
use contrail_proto::control::v1::checkpoint_control_server::CheckpointControl;
use contrail_proto::control::v1::{BarrierRequest, BarrierResponse, ShardAck};
use contrail_state::checkpoints::{CheckpointStore, ShardUpload};
use contrail_state::protocol::{self, Manifest, ShardCheckpoint};
use tokio::sync::{Mutex, oneshot};
use tonic::{Request, Response, Status};

use crate::error::DedupStateError;
use crate::metrics::DedupMetrics;
use crate::shards::PendingCheckpoint;
use crate::worker::Command;

/// The owner side of the protocol.
pub struct ControlServer {
    instance: String,
    commands: Sender<Command>,
    store: CheckpointStore,
    metrics: DedupMetrics,
    /// The last upload per partition with the shard generation it came from: its SST files are
    /// copied inside the store rather than uploaded again (incremental checkpoints).
    previous: Mutex<HashMap<i32, (u64, ShardUpload)>>,
}

impl ControlServer {
    /// A control server sending barriers to the processing thread through `commands`.
    pub fn new(
        instance: String,
        commands: Sender<Command>,
        store: CheckpointStore,
        metrics: DedupMetrics,
    ) -> ControlServer {
        ControlServer {
            instance,
            commands,
            store,
            metrics,
            previous: Mutex::new(HashMap::new()),
        }
    }

    /// Checkpoints and uploads every owned shard for `epoch`.
    pub async fn checkpoint(&self, epoch: u64) -> Result<Vec<ShardCheckpoint>, DedupStateError> {
        let failed = |message: String| DedupStateError::Checkpoint { epoch, message };
        let (reply, taken) = oneshot::channel();
        self.commands
            .send(Command::Checkpoint { epoch, reply })
            .map_err(|_| failed("the processing thread is not running".to_owned()))?;
        let pending = taken
            .await
            .map_err(|_| failed("the processing thread stopped".to_owned()))?;
        // The processing thread only handed out handles; the checkpoints (a memtable flush and
        // file syncs per shard) are taken here while it keeps processing. Each batch is one atomic
        // write, so every checkpoint holds its shard at a batch boundary, read back from it.
        let created = Instant::now();
        let local = tokio::task::spawn_blocking(move || {
            pending
                .into_iter()
                .map(PendingCheckpoint::take)
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(|error| failed(format!("the checkpoint thread failed: {error}")))?
        .map_err(|error| failed(error.to_string()))?;
        self.metrics
            .checkpoint_local_seconds
            .observe(created.elapsed().as_secs_f64());
        tracing::debug!(
            epoch,
            shards = local.len(),
            elapsed_ms = created.elapsed().as_millis() as u64,
            "shards checkpointed locally"
        );
        let mut acks = Vec::with_capacity(local.len());
        let mut previous = self.previous.lock().await;
        for checkpoint in local {
            let reusable = previous
                .get(&checkpoint.partition)
                .filter(|(generation, _)| *generation == checkpoint.generation)
                .map(|(_, upload)| upload);
            let uploaded = self
                .store
                .upload_shard_reusing(
                    epoch,
                    checkpoint.partition,
                    checkpoint.next_offset,
                    &checkpoint.dir,
                    reusable,
                )
                .await;
            let _ = tokio::fs::remove_dir_all(&checkpoint.dir).await;
            let uploaded = uploaded?;
            tracing::debug!(
                epoch,
                partition = checkpoint.partition,
                files = uploaded.files.len(),
                reused = uploaded.reused,
                "shard uploaded"
            );
            acks.push(uploaded.checkpoint.clone());
            previous.insert(checkpoint.partition, (checkpoint.generation, uploaded));
        }
        Ok(acks)
    }
}

#[tonic::async_trait]
impl CheckpointControl for ControlServer {
    async fn barrier(&self, request: Request<BarrierRequest>) -> Result<Response<BarrierResponse>, Status> {
        let BarrierRequest { epoch, coordinator } = request.into_inner();
        let started = Instant::now();
        let acks = self
            .checkpoint(epoch)
            .await
            .map_err(|error| Status::unavailable(error.to_string()))?;
        tracing::info!(epoch, %coordinator, shards = acks.len(), elapsed_ms = started.elapsed().as_millis() as u64, "barrier: shards checkpointed and uploaded");
        Ok(Response::new(BarrierResponse {
            epoch,
            instance: self.instance.clone(),
            shards: acks
                .into_iter()
                .map(|ack| ShardAck {
                    partition: ack.partition,
                    next_offset: ack.next_offset,
                    location: ack.location,
                })
                .collect(),
        }))
    }
}

/// The outcome of one checkpoint round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoundOutcome {
    /// The manifest was written.
    Complete {
        /// The epoch.
        epoch: u64,
        /// Epochs garbage-collected.
        collected: Vec<u64>,
    },
    /// Some partitions did not ack; no manifest.
    Incomplete {
        /// The epoch.
        epoch: u64,
        /// Partitions without an ack.
        missing: Vec<i32>,
    },
}

/// The coordinator side.
pub struct Coordinator {
    instance: String,
    peers: Vec<String>,
    token: Option<String>,
    store: CheckpointStore,
    barrier_timeout: Duration,
    keep: usize,
    partitions: Arc<dyn Fn() -> Result<BTreeSet<i32>, String> + Send + Sync>,
    metrics: DedupMetrics,
    /// Serialises rounds and remembers the newest epoch used.
    last_epoch: Mutex<u64>,
}

impl Coordinator {
    /// A coordinator sending barriers to `peers` (gRPC endpoints). `partitions` lists the input
    /// topic's partitions (broker metadata).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        instance: String,
        peers: Vec<String>,
        token: Option<String>,
        store: CheckpointStore,
        barrier_timeout: Duration,
        keep: usize,
        partitions: Arc<dyn Fn() -> Result<BTreeSet<i32>, String> + Send + Sync>,
        metrics: DedupMetrics,
    ) -> Coordinator {
        Coordinator {
            instance,
            peers,
            token,
            store,
            barrier_timeout,
            keep,
            partitions,
            metrics,
            last_epoch: Mutex::new(0),
        }
    }

    async fn barrier(&self, peer: &str, epoch: u64) -> Result<BarrierResponse, String> {
        let endpoint = tonic::transport::Endpoint::from_shared(peer.to_owned())
            .map_err(|error| format!("peer {peer}: {error}"))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(self.barrier_timeout);
        let channel = endpoint
            .connect()
            .await
            .map_err(|error| format!("peer {peer}: {error}"))?;
        let mut client = CheckpointControlClient::new(channel);
        let mut request = Request::new(BarrierRequest {
            epoch,
            coordinator: self.instance.clone(),
        });
        if let Some(token) = &self.token {
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| "token is not a valid header value".to_owned())?;
            request.metadata_mut().insert("authorization", value);
        }
        client
            .barrier(request)
            .await
            .map(Response::into_inner)
            .map_err(|status| format!("peer {peer}: {}", status.message()))
    }

    /// Runs one checkpoint round.
    pub async fn round(&self) -> Result<RoundOutcome, DedupStateError> {
        let mut last_epoch = self.last_epoch.lock().await;
        let started = Instant::now();
        let mut seen = self.store.epochs().await?;
        seen.insert(*last_epoch);
        let epoch = protocol::next_epoch(&seen);
        *last_epoch = epoch;
        let failed = |message: String| DedupStateError::Checkpoint { epoch, message };
        let lookup = self.partitions.clone();
        let partitions = tokio::task::spawn_blocking(move || lookup())
            .await
            .map_err(|error| failed(error.to_string()))?
            .map_err(failed)?;
        let responses =
            futures::future::join_all(self.peers.iter().map(|peer| self.barrier(peer, epoch))).await;
        let mut shards: BTreeMap<i32, ShardCheckpoint> = BTreeMap::new();
        for response in responses {
            match response {
                Ok(response) => {
                    for ack in response.shards {
                        let checkpoint = ShardCheckpoint {
                            partition: ack.partition,
                            next_offset: ack.next_offset,
                            location: ack.location,
                        };
                        // Two acks for one partition (ownership moved during the round): both are
                        // consistent states; keep the further one.
                        let keep = shards
                            .get(&ack.partition)
                            .is_none_or(|kept| kept.next_offset < checkpoint.next_offset);
                        if keep {
                            shards.insert(ack.partition, checkpoint);
                        }
                    }
                }
                Err(error) => tracing::warn!(epoch, %error, "barrier not acknowledged"),
            }
        }
        let manifest = Manifest {
            epoch,
            partitions,
            shards,
            created_at_us: chrono::Utc::now().timestamp_micros(),
        };
        if !manifest.is_complete() {
            let missing: Vec<i32> = manifest
                .partitions
                .iter()
                .filter(|p| !manifest.shards.contains_key(p))
                .copied()
                .collect();
            tracing::warn!(epoch, ?missing, "checkpoint incomplete: no manifest written");
            self.metrics.checkpoints.with_label_values(&["incomplete"]).inc();
            return Ok(RoundOutcome::Incomplete { epoch, missing });
        }
        self.store.write_manifest(&manifest).await?;
        let present = self.store.epochs().await?;
        let complete: BTreeSet<u64> = self
            .store
            .manifests()
            .await?
            .iter()
            .map(|manifest| manifest.epoch)
            .collect();
        let collected: Vec<u64> = protocol::garbage(&present, &complete, self.keep)
            .into_iter()
            .collect();
        for old in &collected {
            self.store.delete_epoch(*old).await?;
        }
        let elapsed = started.elapsed();
        self.metrics.checkpoints.with_label_values(&["complete"]).inc();
        self.metrics.checkpoint_seconds.observe(elapsed.as_secs_f64());
        tracing::info!(
            epoch,
            ?collected,
            elapsed_ms = elapsed.as_millis() as u64,
            "checkpoint complete"
        );
        Ok(RoundOutcome::Complete { epoch, collected })
    }

    /// Runs a round every `interval` until `stop`.
    pub async fn run(self: Arc<Self>, interval: Duration, stop: tokio_util::sync::CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
            if let Err(error) = self.round().await {
                self.metrics.checkpoints.with_label_values(&["failed"]).inc();
                tracing::warn!(%error, "checkpoint round failed; retrying at the next interval");
            }
        }
    }
}
