//! The owned shards and their outbox: one RocksDB shard per assigned input partition, opened
//! (reopened, restored from a checkpoint, or empty — the pure [`protocol::restore_plan`]) on
//! assignment and closed on revocation; batches processed into state, timers, outputs and the
//! offset in one write batch; outputs produced in commit order and deleted from the outbox when the
//! broker acknowledged them, re-sent when it did not; local checkpoints for the coordinator.
//!
//! The processing thread (`worker`) drives it; the admin API reads its status.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use contrail_common::trace;
use contrail_state::checkpoints::CheckpointStore;
use contrail_state::protocol::{self, LocalShard, RestorePlan};
use contrail_state::{Checkpointer, EngineConfig, InputRecord, OutboxRecord, Shard, StateError};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset};

use crate::config::ProcessorKind;
use crate::error::DedupStateError;
use crate::in_flight::InFlight;
use crate::metrics::DedupMetrics;
use crate::processor::{FlightProcessor, INVALID_KEY, OutputTopics};
use crate::records::{OwnedRecord, TracedBatch};
use crate::rotation::RotationProcessor;
use contrail_flight::flight::Rules;

/// One delivery report of an output.
#[derive(Debug)]
pub struct Delivery {
    partition: i32,
    /// Which open of the shard produced it (reports of an earlier open are only counted).
    generation: u64,
    sequence: u64,
    /// The broker's error, when it was not acknowledged.
    error: Option<String>,
}

/// Producer context: forwards delivery reports to the processing thread.
pub struct OutputContext {
    deliveries: Mutex<Sender<Delivery>>,
}

impl ClientContext for OutputContext {}

/// The producer context sending delivery reports to `deliveries`.
pub fn output_context(deliveries: Sender<Delivery>) -> OutputContext {
    OutputContext {
        deliveries: Mutex::new(deliveries),
    }
}

impl ProducerContext for OutputContext {
    type DeliveryOpaque = Box<(i32, u64, u64)>;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: Self::DeliveryOpaque) {
        let (partition, generation, sequence) = *opaque;
        let delivery = Delivery {
            partition,
            generation,
            sequence,
            error: result.as_ref().err().map(|(error, _)| error.to_string()),
        };
        if let Ok(sender) = self.deliveries.lock() {
            let _ = sender.send(delivery);
        }
    }
}

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
}

/// A checkpoint of one owned shard for an epoch, to take off the processing thread.
pub struct PendingCheckpoint {
    /// Takes the RocksDB checkpoint while batches keep committing.
    pub checkpointer: Checkpointer,
    /// The RocksDB checkpoint directory (in the staging directory; must not exist).
    pub dir: PathBuf,
    /// Which open of the shard it comes from: SST file names are unique within one open, so
    /// uploads of the same generation may share SST files.
    pub generation: u64,
}

/// What a shard owner checkpointed locally for an epoch (uploaded by the async side).
#[derive(Debug, Clone)]
pub struct LocalCheckpoint {
    /// Input partition.
    pub partition: i32,
    /// Next input offset of the checkpointed state (0: nothing processed yet).
    pub next_offset: i64,
    /// The RocksDB checkpoint directory.
    pub dir: PathBuf,
    /// See [`PendingCheckpoint::generation`].
    pub generation: u64,
}

impl PendingCheckpoint {
    /// Writes the checkpoint (blocking: a memtable flush and file syncs) and reads its offset.
    pub fn take(self) -> Result<LocalCheckpoint, StateError> {
        let _ = std::fs::remove_dir_all(&self.dir);
        let next_offset = self.checkpointer.create(&self.dir)?;
        Ok(LocalCheckpoint {
            partition: self.checkpointer.partition(),
            next_offset: next_offset.unwrap_or(0),
            dir: self.dir,
            generation: self.generation,
        })
    }
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

/// A shard opened for a partition just assigned, not owned yet ([`ShardSet::prepare`]).
pub(crate) struct Opened {
    partition: i32,
    shard: Shard,
    origin: String,
    outbox: Vec<(u64, OutboxRecord)>,
}

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

    /// Deletes the acknowledged outputs queued for `partition` from `shard` (of `generation`),
    /// whose slot the caller holds.
    fn acknowledge_queued(&self, partition: i32, generation: u64, shard: &Shard) {
        let queued = self.lock().acknowledged.remove(&partition);
        match queued {
            Some((of, sequences)) if of == generation => {
                if let Err(error) = shard.acknowledge(&sequences) {
                    self.fail(error.to_string());
                }
            }
            // Reports of an earlier open: its outputs are re-sent from the outbox by this one.
            Some(_) => {}
            None => {}
        }
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

    /// Opens the shard of `partition` — reopened from the local directory, restored from the newest
    /// complete checkpoint, or empty — and reads its outbox, without owning it yet: the slow part
    /// of an assignment (a restore downloads and opens the whole state), run off the polling
    /// thread so the consumer keeps serving the group meanwhile ([`crate::opening`]). Gives up
    /// (`Ok(None)`) as soon as `give_up` says so: asked before a download and while the shard's
    /// timers load, the long parts.
    pub(crate) fn prepare(
        &self,
        partition: i32,
        give_up: &dyn Fn() -> bool,
    ) -> Result<Option<Opened>, StateError> {
        let started = Instant::now();
        let dir = self.shard_dir(partition);
        let memory = Some(&self.processing.memory);
        let mut local_shard = None;
        let local = if dir.join("CURRENT").exists() {
            let Some(shard) = Shard::open_unless(&dir, partition, memory, give_up)? else {
                return Ok(None);
            };
            let next_offset = shard.progress().next_offset;
            local_shard = Some(shard);
            LocalShard::Present { next_offset }
        } else {
            // A directory without RocksDB's CURRENT file never committed anything.
            let _ = std::fs::remove_dir_all(&dir);
            LocalShard::Missing
        };
        let manifests = self.runtime.block_on(self.store.manifests())?;
        let origin = match protocol::restore_plan(local, &manifests, partition) {
            RestorePlan::ReopenLocal => "reopened".to_owned(),
            RestorePlan::Restore { epoch, checkpoint } => {
                if let Some(stale) = local_shard.take() {
                    drop(stale);
                    tracing::info!(
                        partition,
                        ?local,
                        checkpoint_offset = checkpoint.next_offset,
                        "local shard is behind the newest checkpoint; replacing it"
                    );
                    std::fs::remove_dir_all(&dir).map_err(|error| StateError::Storage {
                        path: dir.display().to_string(),
                        message: error.to_string(),
                    })?;
                }
                if give_up() {
                    return Ok(None);
                }
                tracing::info!(partition, epoch, "restoring the shard from the checkpoint store");
                self.runtime
                    .block_on(self.store.download_shard(&checkpoint, &dir))?;
                self.metrics.restores.inc();
                tracing::info!(
                    partition,
                    epoch,
                    next_offset = checkpoint.next_offset,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "shard restored from the checkpoint store"
                );
                format!("restored epoch {epoch}")
            }
            RestorePlan::StartEmpty => "empty".to_owned(),
        };
        let shard = match local_shard {
            Some(shard) => shard,
            None => match Shard::open_unless(&dir, partition, memory, give_up)? {
                Some(shard) => shard,
                None => return Ok(None),
            },
        };
        let outbox = shard.outbox()?;
        tracing::info!(
            partition,
            %origin,
            outbox = outbox.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "shard prepared"
        );
        Ok(Some(Opened {
            partition,
            shard,
            origin,
            outbox,
        }))
    }

    /// Owns a shard [`ShardSet::prepare`] opened: queues its outbox for re-sending (before any new
    /// output) and returns the offset its partition goes on from. Quick: the polling thread calls it.
    pub(crate) fn install(&self, opened: Opened) -> Offset {
        let Opened {
            partition,
            shard,
            origin,
            outbox,
        } = opened;
        let next_offset = protocol::resume_offset(shard.progress().next_offset);
        tracing::info!(partition, ?next_offset, %origin, outbox = outbox.len(), "shard opened");
        let mut inner = self.lock();
        self.metrics.outputs_resent.inc_by(outbox.len() as u64);
        inner.resend.extend(
            outbox
                .into_iter()
                .map(|(sequence, record)| (partition, sequence, record)),
        );
        self.metrics
            .shard_offset
            .with_label_values(&[&partition.to_string()])
            .set(next_offset.unwrap_or(-1));
        let generation = self.opens.fetch_add(1, Ordering::Relaxed);
        inner.acknowledged.remove(&partition);
        inner.shards.insert(
            partition,
            OwnedShard {
                slot: Arc::new(Mutex::new(Some(shard))),
                origin,
                generation,
            },
        );
        self.metrics.outbox_pending.set(inner.unacknowledged() as i64);
        next_offset.map_or(Offset::Beginning, Offset::Offset)
    }

    /// Waits for the batches of `partitions` in progress, flushes outputs, applies
    /// acknowledgements, and closes the shards.
    pub(crate) fn close(&self, partitions: &[i32]) {
        // Emptying a slot waits for its batch (commit and sends) and keeps any later one out.
        let closing: Vec<(i32, u64, Shard)> = self
            .slots(Some(partitions))
            .into_iter()
            .filter_map(|(partition, generation, slot)| {
                lock_slot(&slot)
                    .take()
                    .map(|shard| (partition, generation, shard))
            })
            .collect();
        if let Err(error) = self.produce_resends() {
            tracing::warn!(%error, "re-sending before closing shards; the outputs stay in the outbox");
        }
        if let Err(error) = self.producer.flush(Duration::from_secs(10)) {
            tracing::warn!(%error, "flush before closing shards; unacknowledged outputs stay in the outbox");
        }
        self.apply_deliveries();
        for (partition, generation, shard) in &closing {
            self.acknowledge_queued(*partition, *generation, shard);
        }
        let mut inner = self.lock();
        for partition in partitions {
            if inner.shards.remove(partition).is_some() {
                tracing::info!(partition, "shard closed");
            }
            inner.acknowledged.remove(partition);
            inner.resend.retain(|(owner, _, _)| owner != partition);
            inner.in_flight.closed(*partition);
        }
        self.metrics.outbox_pending.set(inner.unacknowledged() as i64);
        drop(inner);
        // The RocksDB instances close here (waiting for checkpoints still being taken of them).
        drop(closing);
    }

    /// Closes every shard (shutdown).
    pub fn close_all(&self) {
        let partitions: Vec<i32> = self.lock().shards.keys().copied().collect();
        self.close(&partitions);
    }

    /// Applies delivery reports: acknowledged outputs leave the outbox (at once when their
    /// shard is idle, else by the thread running its batch, before the batch). A failed one fails
    /// the shard set: outputs are produced with no delivery timeout, so a failure is permanent, and
    /// re-sending it behind newer outputs would break the order downstream de-duplication relies
    /// on (docs/CONTRACT.md, "Exact de-duplication"). The restart re-sends the outbox, in order,
    /// before anything new.
    pub fn apply_deliveries(&self) {
        let reports: Vec<Delivery> = match self.deliveries.lock() {
            Ok(receiver) => receiver.try_iter().collect(),
            Err(_) => return,
        };
        let queued: Vec<(i32, u64, Slot)> = {
            let mut inner = self.lock();
            if reports.is_empty() && inner.acknowledged.is_empty() {
                return;
            }
            for report in reports {
                inner.in_flight.reported(report.partition, report.generation);
                let owned = inner
                    .shards
                    .get(&report.partition)
                    .is_some_and(|owned| owned.generation == report.generation);
                match report.error {
                    None if owned => {
                        let queued = inner
                            .acknowledged
                            .entry(report.partition)
                            .or_insert_with(|| (report.generation, Vec::new()));
                        if queued.0 != report.generation {
                            *queued = (report.generation, Vec::new());
                        }
                        queued.1.push(report.sequence);
                    }
                    // A report for a shard closed since: the output stays in that shard's outbox.
                    None => {}
                    Some(error) => self.fail(format!(
                        "output {} of partition {} was not acknowledged by the broker: {error}",
                        report.sequence, report.partition
                    )),
                }
            }
            self.metrics.outbox_pending.set(inner.unacknowledged() as i64);
            // Also those queued earlier while their shard was busy.
            inner
                .acknowledged
                .iter()
                .filter_map(|(partition, (generation, _))| {
                    let owned = inner.shards.get(partition)?;
                    Some((*partition, *generation, owned.slot.clone()))
                })
                .collect()
        };
        for (partition, generation, slot) in queued {
            // A shard in a batch takes its acknowledgements before its next batch.
            if let Ok(guard) = slot.try_lock()
                && let Some(shard) = guard.as_ref()
            {
                self.acknowledge_queued(partition, generation, shard);
            }
        }
    }

    /// Hands one output to the producer (waiting while its queue is full) and counts it in
    /// flight. `Err` for any other refusal: the output stays in the outbox.
    fn send(&self, partition: i32, sequence: u64, record: &OutboxRecord) -> Result<(), KafkaError> {
        // Counted in flight before the producer has it: its delivery report can come back — and
        // be applied by another processing thread — before `producer.send` even returns. Counted
        // after, a report applied first found nothing to count off and the output stayed "in
        // flight" for good, holding back every caught-up check (CI, kill -9 test, batch.threads 3).
        let generation = {
            let mut inner = self.lock();
            match inner.shards.get(&partition) {
                Some(owned) => {
                    let generation = owned.generation;
                    inner.in_flight.sent(partition, generation);
                    generation
                }
                // Closed meanwhile: the next owner re-sends it from the outbox.
                None => return Ok(()),
            }
        };
        let mut attempts = 0u32;
        loop {
            let mut base =
                BaseRecord::with_opaque_to(&record.topic, Box::new((partition, generation, sequence)))
                    .key(&record.key)
                    .payload(&record.payload);
            if let Some(trace) = &record.trace {
                base = base.headers(trace::traceparent_headers(trace));
            }
            match self.producer.send(base) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull), _)) => {
                    attempts += 1;
                    if attempts.is_multiple_of(1000) {
                        tracing::warn!(partition, "producer queue full; waiting for the broker");
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err((error, _)) => {
                    // Never handed over: no report will come for it.
                    self.lock().in_flight.reported(partition, generation);
                    return Err(error);
                }
            }
        }
    }

    /// Produces the queued re-sends, oldest first. On a refusal the output goes back to the
    /// front of the queue and the error is returned.
    pub(crate) fn produce_resends(&self) -> Result<(), KafkaError> {
        loop {
            let next = self.lock().resend.pop_front();
            let Some((partition, sequence, record)) = next else {
                return Ok(());
            };
            if let Err(error) = self.send(partition, sequence, &record) {
                self.lock().resend.push_front((partition, sequence, record));
                return Err(error);
            }
        }
    }

    /// Outputs produced and not yet acknowledged (queued for re-sending, or in flight).
    pub fn unacknowledged(&self) -> usize {
        self.lock().unacknowledged()
    }

    /// Processes one partition's records (in offset order) as one batch and produces the outputs.
    /// Callers produce the queued re-sends first ([`ShardSet::produce_resends`]) and run one batch
    /// of a partition at a time, so each output topic receives a partition's outputs in the order
    /// of their input offsets; batches of different partitions may run on different threads. A
    /// batch that does not start at the shard's stored offset is not processed:
    /// [`Processed::Gap`] (the caller repositions the consumer).
    pub(crate) fn process(
        &self,
        partition: i32,
        records: &[OwnedRecord],
        lateness_us: i64,
        accept_gap: bool,
    ) -> Result<Processed, DedupStateError> {
        let started = Instant::now();
        let now_ms = chrono::Utc::now().timestamp_millis();
        for timestamp_ms in records.iter().filter_map(|record| record.timestamp_ms) {
            self.metrics
                .record_age_seconds
                .observe(now_ms.saturating_sub(timestamp_ms).max(0) as f64 / 1000.0);
        }
        // Not ours (revoked while buffered, or closed meanwhile): the new owner reads them from its
        // stored offset.
        let Some((_, generation, slot)) = self.slots(Some(&[partition])).pop() else {
            return Ok(Processed::Done);
        };
        let mut guard = lock_slot(&slot);
        let Some(shard) = guard.as_mut() else {
            return Ok(Processed::Done);
        };
        self.acknowledge_queued(partition, generation, shard);
        let from = shard.progress().next_offset.unwrap_or(i64::MIN);
        let records: Vec<&OwnedRecord> = records.iter().filter(|record| record.offset >= from).collect();
        let traced = TracedBatch::new(partition, &records);
        let inputs: Vec<InputRecord<'_>> = records
            .iter()
            .zip(&traced.contexts)
            .map(|(record, trace)| InputRecord {
                key: if record.key.is_empty() || record.key.contains(&0) {
                    INVALID_KEY
                } else {
                    record.key.as_slice()
                },
                payload: &record.payload,
                offset: record.offset,
                trace: trace.as_deref().map(str::as_bytes),
                timestamp_us: record.timestamp_ms.map(|millis| millis.saturating_mul(1_000)),
            })
            .collect();
        let Some(first) = inputs.first() else {
            return Ok(Processed::Done);
        };
        if from != i64::MIN && first.offset != from && !accept_gap {
            // The fetch position is past the shard's offset (a seek that did not take, or records
            // gone from the broker): never commit over it.
            return Ok(Processed::Gap {
                expected: from,
                got: first.offset,
            });
        }
        let now_us = chrono::Utc::now().timestamp_micros();
        let engine = EngineConfig {
            allowed_lateness_us: lateness_us,
        };
        let (topics, metrics, max_bytes) = (
            self.processing.topics.clone(),
            Some(self.metrics.clone()),
            self.processing.max_message_bytes,
        );
        let result = traced.batch.in_scope(|| match self.processing.processor {
            ProcessorKind::Flight => {
                let rules = self.processing.rules;
                let mut processor =
                    FlightProcessor::new(rules, topics, partition, metrics, max_bytes).with_clock(now_us);
                shard.process_batch(&inputs, &mut processor, &engine, now_us)
            }
            ProcessorKind::Rotation => {
                let rules = self.processing.turn.clone();
                let mut processor = RotationProcessor::new(rules, topics, partition, metrics, max_bytes);
                shard.process_batch(&inputs, &mut processor, &engine, now_us)
            }
        })?;
        traced.batch.record("outputs", result.outputs.len());
        let next_offset = shard.progress().next_offset.unwrap_or(-1);
        if next_offset % 64 == 0 || result.records >= 64 {
            let bytes = shard.approximate_size_bytes();
            self.metrics
                .state_bytes
                .with_label_values(&[&partition.to_string()])
                .set(bytes as i64);
        }
        self.metrics.records.inc_by(result.records as u64);
        self.metrics.evicted.inc_by(result.evicted as u64);
        self.metrics.commits.inc();
        self.metrics
            .shard_offset
            .with_label_values(&[&partition.to_string()])
            .set(next_offset);
        // The outputs are in the outbox now. The slot stays held until they are handed to the
        // producer, so closing the shard waits for them.
        let produced = result
            .outputs
            .iter()
            .try_for_each(|(sequence, record)| self.send(partition, *sequence, record));
        drop(guard);
        if let Err(error) = produced {
            // Everything not sent is in the outbox: a restart re-sends it in order.
            let message = format!("producing the outputs of partition {partition}: {error}");
            self.fail(message.clone());
            return Err(DedupStateError::Broker(message));
        }
        self.metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(Processed::Done)
    }

    /// Checkpoint handles of every owned shard for `epoch`: all the processing thread does for a
    /// checkpoint (the RocksDB checkpoints are taken by [`PendingCheckpoint::take`] elsewhere,
    /// while batches keep committing).
    pub(crate) fn checkpoint(&self, epoch: u64) -> Vec<PendingCheckpoint> {
        // Observed when dropped: includes waiting for a batch in progress on another thread.
        let _pause = self.metrics.checkpoint_pause_seconds.start_timer();
        self.slots(None)
            .into_iter()
            .filter_map(|(partition, generation, slot)| {
                lock_slot(&slot).as_ref().map(|shard| PendingCheckpoint {
                    checkpointer: shard.checkpointer(),
                    dir: self.staging_dir.join(format!("epoch-{epoch}-shard-{partition}")),
                    generation,
                })
            })
            .collect()
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

/// What became of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Processed {
    /// Committed (or nothing to do).
    Done,
    /// Not processed: the first record is not at the shard's stored offset.
    Gap {
        /// The shard's stored offset.
        expected: i64,
        /// The first record's offset.
        got: i64,
    },
}
