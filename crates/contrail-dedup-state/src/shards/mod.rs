//! The owned shards and their outbox: one RocksDB shard per assigned input partition, opened
//! (reopened, restored from a checkpoint, or empty — the pure [`protocol::restore_plan`]) on
//! assignment and closed on revocation; batches processed into state, timers, outputs and the
//! offset in one write batch; outputs produced in commit order and deleted from the outbox when the
//! broker acknowledged them, re-sent when it did not; local checkpoints for the coordinator.
//!
//! The processing thread (`worker`) drives it; the admin API reads its status.
//!
//! One file per job: [`lifecycle`] opens (reopens, restores) and closes shards, [`batch`] commits a
//! batch, [`outbox`] produces outputs and applies their delivery reports, [`checkpoint`] hands
//! out checkpoint handles.

mod batch;
mod checkpoint;
mod lifecycle;
mod outbox;

pub(crate) use batch::Processed;
pub use checkpoint::{LocalCheckpoint, PendingCheckpoint};
pub(crate) use lifecycle::Opened;
pub use outbox::{Delivery, OutputContext, output_context};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, MutexGuard};

use contrail_flight::flight::Rules;
use contrail_state::checkpoints::CheckpointStore;
use contrail_state::{OutboxRecord, Shard, StateError};
use rdkafka::producer::ThreadedProducer;

use crate::error::DedupStateError;
use crate::in_flight::InFlight;
use crate::metrics::DedupMetrics;
use crate::processor::OutputTopics;

/// What the flight processor of every shard works with.
#[derive(Debug, Clone)]
pub struct Processing {
    /// Where outputs go.
    pub topics: OutputTopics,
    /// The time rules of docs/CONTRACT.md ("Processing in dedup-state").
    pub rules: Rules,
    /// Which processor runs on the input.
    pub processor: crate::config::ProcessorKind,
    /// The rotation processor's rules.
    pub turn: contrail_flight::rotation::TurnRules,
    /// The broker's message limit: every output and dead letter stays below it.
    pub max_message_bytes: usize,
    /// RocksDB's block cache and memtable budget, shared by the shards.
    pub memory: contrail_state::StorageMemory,
    /// When held batches are written ([`crate::config::BatchConfig::commit_interval_ms`]).
    pub commit: crate::config::CommitPolicy,
    /// contrail's sampling decision for records whose producer flagged them sampled (a source
    /// writing to the raw topic directly must not make every record get spans).
    pub sampler: contrail_common::trace::Sampler,
}

/// Status of one owned shard.
#[derive(Debug, Clone)]
pub struct ShardStatus {
    /// Input partition.
    pub partition: i32,
    /// Next input offset (`-1`: nothing processed).
    pub next_offset: i64,
    /// Approximate RocksDB bytes.
    pub state_bytes: u64,
    /// How the shard was opened: `reopened`, `restored epoch N`, `empty`.
    pub origin: String,
}

/// Where an owned shard's RocksDB instance lives: empty once the shard is closed.
type Slot = Arc<Mutex<Option<Shard>>>;

/// One owned shard. Its RocksDB instance is behind its own lock, so batches of different shards
/// commit on different threads at once; the slot is emptied when the shard is closed.
struct OwnedShard {
    slot: Slot,
    origin: String,
    generation: u64,
}

/// Lock order: a shard's slot, then `Inner` — never a slot while `Inner` is held.
struct Inner {
    shards: BTreeMap<i32, OwnedShard>,
    /// Acknowledged outputs not yet deleted from their shard's outbox (its slot was busy with a
    /// batch): per partition, the shard's generation and the sequences.
    acknowledged: HashMap<i32, (u64, Vec<u64>)>,
    /// Outputs to (re-)produce before anything new: (partition, sequence, record).
    resend: VecDeque<(i32, u64, OutboxRecord)>,
    /// Outputs handed to the producer whose delivery report has not come back. With `resend`,
    /// exactly the outputs not yet acknowledged.
    in_flight: InFlight,
}

impl Inner {
    fn unacknowledged(&self) -> usize {
        self.resend.len() + self.in_flight.total()
    }
}

/// The owned shards and everything needed to open, process and close them. Shared by the
/// processing thread, its rebalance callback and the admin API.
pub struct ShardSet {
    inner: Mutex<Inner>,
    state_dir: PathBuf,
    staging_dir: PathBuf,
    store: CheckpointStore,
    runtime: tokio::runtime::Handle,
    producer: ThreadedProducer<OutputContext>,
    deliveries: Mutex<Receiver<Delivery>>,
    processing: Processing,
    metrics: DedupMetrics,
    /// Set when a shard failed to open or commit: the processing thread stops and the process exits
    /// (a restart recovers from the local directory or the checkpoint store).
    failed: Mutex<Option<String>>,
    /// Counts shard opens (generations).
    opens: AtomicU64,
}

impl ShardSet {
    /// A shard set storing shards under `state_dir`.
    pub fn new(
        state_dir: PathBuf,
        store: CheckpointStore,
        runtime: tokio::runtime::Handle,
        producer: ThreadedProducer<OutputContext>,
        deliveries: Receiver<Delivery>,
        processing: Processing,
        metrics: DedupMetrics,
    ) -> Result<ShardSet, DedupStateError> {
        let staging_dir = state_dir.join(".checkpoints");
        // Local checkpoints left by a process killed during an upload are garbage.
        let _ = std::fs::remove_dir_all(&staging_dir);
        std::fs::create_dir_all(&staging_dir).map_err(|error| {
            DedupStateError::State(StateError::Storage {
                path: staging_dir.display().to_string(),
                message: error.to_string(),
            })
        })?;
        Ok(ShardSet {
            inner: Mutex::new(Inner {
                shards: BTreeMap::new(),
                acknowledged: HashMap::new(),
                resend: VecDeque::new(),
                in_flight: InFlight::default(),
            }),
            state_dir,
            staging_dir,
            store,
            runtime,
            producer,
            deliveries: Mutex::new(deliveries),
            processing,
            metrics,
            failed: Mutex::new(None),
            opens: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The slots of the owned shards among `partitions` (all owned ones for `None`), in partition
    /// order, with their generations.
    fn slots(&self, partitions: Option<&[i32]>) -> Vec<(i32, u64, Slot)> {
        let inner = self.lock();
        inner
            .shards
            .iter()
            .filter(|(partition, _)| partitions.is_none_or(|wanted| wanted.contains(partition)))
            .map(|(partition, owned)| (*partition, owned.generation, owned.slot.clone()))
            .collect()
    }

    pub(crate) fn fail(&self, message: String) {
        tracing::error!(%message, "shard failure; stopping");
        if let Ok(mut failed) = self.failed.lock() {
            failed.get_or_insert(message);
        }
    }

    /// Why the shard set failed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().ok().and_then(|failed| failed.clone())
    }

    /// The directory of partition `partition`'s shard.
    pub fn shard_dir(&self, partition: i32) -> PathBuf {
        self.state_dir.join(format!("shard-{partition}"))
    }

    /// Status of every owned shard.
    pub fn status(&self) -> Vec<ShardStatus> {
        let origins: BTreeMap<i32, String> = self
            .lock()
            .shards
            .iter()
            .map(|(partition, owned)| (*partition, owned.origin.clone()))
            .collect();
        self.slots(None)
            .into_iter()
            .filter_map(|(partition, _, slot)| {
                let guard = lock_slot(&slot);
                let shard = guard.as_ref()?;
                let state_bytes = shard.approximate_size_bytes();
                self.metrics
                    .state_bytes
                    .with_label_values(&[&partition.to_string()])
                    .set(state_bytes as i64);
                Some(ShardStatus {
                    partition,
                    next_offset: shard.progress().next_offset.unwrap_or(-1),
                    state_bytes,
                    origin: origins.get(&partition).cloned().unwrap_or_default(),
                })
            })
            .collect()
    }

    /// Runs `read` over every owned shard (each held while `read` runs; keep it short).
    pub fn with_shards<R>(&self, read: impl FnOnce(&mut dyn Iterator<Item = &Shard>) -> R) -> R {
        let slots = self.slots(None);
        let guards: Vec<MutexGuard<'_, Option<Shard>>> =
            slots.iter().map(|(_, _, slot)| lock_slot(slot)).collect();
        let mut shards = guards.iter().filter_map(|guard| guard.as_ref());
        read(&mut shards)
    }

    /// The directory holding the shard directories.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }
}

/// Locks a shard's slot (a panic elsewhere never leaves it unusable: the shard's state is only
/// changed by whole RocksDB write batches).
fn lock_slot(slot: &Mutex<Option<Shard>>) -> MutexGuard<'_, Option<Shard>> {
    slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
