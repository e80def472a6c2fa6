//! The processing thread: a consumer-group member that owns one RocksDB shard per assigned input
//! partition, runs micro-batches through the flight processor, and produces the outbox.
//!
//! - **Assignment** (inside the rebalance callback, before the partitions are handed to the fetcher):
//!   each new partition's shard is reopened from the local directory, or restored from the newest
//!   complete checkpoint, or started empty (the pure [`protocol::restore_plan`]); the partition is
//!   then assigned *at the offset stored in the shard* — never at a group offset or a guess — and the
//!   shard's outbox is queued for re-sending.
//! - **Batches**: records are grouped per partition; a record below the shard's stored offset is
//!   already reflected in its state and skipped (a stale fetch); one `process_batch` per shard commits
//!   state, timers, outputs and the offset in one write batch; then the outputs are produced.
//! - **Outbox**: the producer's delivery reports come back on a channel; acknowledged outputs are
//!   deleted from the outbox, failed ones re-sent. Output order within a key follows commit order.
//! - **Revocation**: the shard's outputs are flushed, acknowledgements applied, the shard closed.
//!   Batches are processed between polls, so a revocation never interrupts one.
//! - **Checkpoint barriers** arrive as commands and run between batches: a RocksDB checkpoint of
//!   every owned shard (hard links), handed to the async side for upload.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use contrail_state::checkpoints::CheckpointStore;
use contrail_state::protocol::{self, LocalShard, RestorePlan};
use contrail_state::{EngineConfig, InputRecord, OutboxRecord, Shard, StateError};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::oneshot;

use crate::error::DedupStateError;
use crate::metrics::DedupMetrics;
use crate::processor::{FlightProcessor, INVALID_KEY, OutputTopics};
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
    /// The time rules of DESIGN §3.
    pub rules: Rules,
    /// The broker's message limit: every output and dead letter stays below it.
    pub max_message_bytes: usize,
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
    /// Which open of the shard it comes from: SST file names are unique within one open, so
    /// uploads of the same generation may share SST files.
    pub generation: u64,
}

/// Requests to the processing thread.
pub enum Command {
    /// Checkpoint every owned shard for `epoch`.
    Checkpoint {
        /// The epoch.
        epoch: u64,
        /// Where to send the local checkpoints.
        reply: oneshot::Sender<Result<Vec<LocalCheckpoint>, String>>,
    },
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

struct OwnedShard {
    shard: Shard,
    origin: String,
    generation: u64,
}

struct Inner {
    shards: BTreeMap<i32, OwnedShard>,
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

/// Outputs handed to the producer and not yet reported, per (partition, generation of the
/// shard's open). Every report is counted off, whether its shard is still owned or not, and a
/// closed shard's entries go with it: the count cannot leak (pure; property-tested).
#[derive(Debug, Default)]
pub struct InFlight {
    counts: HashMap<(i32, u64), usize>,
}

impl InFlight {
    /// One output of `partition`/`generation` was handed to the producer.
    pub fn sent(&mut self, partition: i32, generation: u64) {
        *self.counts.entry((partition, generation)).or_default() += 1;
    }

    /// A delivery report came back (acknowledged or not).
    pub fn reported(&mut self, partition: i32, generation: u64) {
        if let Some(count) = self.counts.get_mut(&(partition, generation)) {
            *count -= 1;
            if *count == 0 {
                self.counts.remove(&(partition, generation));
            }
        }
    }

    /// The shard of `partition` was closed: its outstanding reports no longer count (the outputs
    /// are in its outbox, which the next owner re-sends).
    pub fn closed(&mut self, partition: i32) {
        self.counts.retain(|(owner, _), _| *owner != partition);
    }

    /// Outputs outstanding.
    pub fn total(&self) -> usize {
        self.counts.values().sum()
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

    fn fail(&self, message: String) {
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

    /// Opens the shard of `partition` (reopen, restore or empty) and queues its outbox; returns
    /// the offset to assign at.
    fn open(&self, partition: i32) -> Result<Offset, StateError> {
        let dir = self.shard_dir(partition);
        let mut local_shard = None;
        let local = if dir.join("CURRENT").exists() {
            let shard = Shard::open(&dir, partition)?;
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
                let started = Instant::now();
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
            None => Shard::open(&dir, partition)?,
        };
        let outbox = shard.outbox()?;
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
        inner.shards.insert(
            partition,
            OwnedShard {
                shard,
                origin,
                generation,
            },
        );
        self.metrics.outbox_pending.set(inner.unacknowledged() as i64);
        Ok(next_offset.map_or(Offset::Beginning, Offset::Offset))
    }

    /// Flushes outputs, applies acknowledgements, and closes the shards of `partitions`.
    fn close(&self, partitions: &[i32]) {
        if let Err(error) = self.produce_resends() {
            tracing::warn!(%error, "re-sending before closing shards; the outputs stay in the outbox");
        }
        if let Err(error) = self.producer.flush(Duration::from_secs(10)) {
            tracing::warn!(%error, "flush before closing shards; unacknowledged outputs stay in the outbox");
        }
        self.apply_deliveries();
        let mut inner = self.lock();
        for partition in partitions {
            if inner.shards.remove(partition).is_some() {
                tracing::info!(partition, "shard closed");
            }
            inner.resend.retain(|(owner, _, _)| owner != partition);
            inner.in_flight.closed(*partition);
        }
        self.metrics.outbox_pending.set(inner.unacknowledged() as i64);
    }

    /// Closes every shard (shutdown).
    pub fn close_all(&self) {
        let partitions: Vec<i32> = self.lock().shards.keys().copied().collect();
        self.close(&partitions);
    }

    /// Applies delivery reports: acknowledged outputs leave the outbox. A failed one fails the
    /// shard set: outputs are produced with no delivery timeout, so a failure is permanent, and
    /// re-sending it behind newer outputs would break the order downstream de-duplication relies
    /// on (DESIGN §4). The restart re-sends the outbox, in order, before anything new.
    pub fn apply_deliveries(&self) {
        let reports: Vec<Delivery> = match self.deliveries.lock() {
            Ok(receiver) => receiver.try_iter().collect(),
            Err(_) => return,
        };
        if reports.is_empty() {
            return;
        }
        let mut acknowledged: HashMap<i32, Vec<u64>> = HashMap::new();
        let mut inner = self.lock();
        for report in reports {
            inner.in_flight.reported(report.partition, report.generation);
            let owned = inner
                .shards
                .get(&report.partition)
                .is_some_and(|owned| owned.generation == report.generation);
            match report.error {
                None if owned => acknowledged
                    .entry(report.partition)
                    .or_default()
                    .push(report.sequence),
                // A report for a shard closed since: the output stays in that shard's outbox.
                None => {}
                Some(error) => self.fail(format!(
                    "output {} of partition {} was not acknowledged by the broker: {error}",
                    report.sequence, report.partition
                )),
            }
        }
        for (partition, sequences) in acknowledged {
            if let Some(owned) = inner.shards.get(&partition)
                && let Err(error) = owned.shard.acknowledge(&sequences)
            {
                self.fail(error.to_string());
            }
        }
        self.metrics.outbox_pending.set(inner.unacknowledged() as i64);
    }

    /// Hands one output to the producer (waiting while its queue is full) and counts it in
    /// flight. `Err` for any other refusal: the output stays in the outbox.
    fn send(&self, partition: i32, sequence: u64, record: &OutboxRecord) -> Result<(), KafkaError> {
        let generation = match self.lock().shards.get(&partition) {
            Some(owned) => owned.generation,
            // Closed meanwhile: the next owner re-sends it from the outbox.
            None => return Ok(()),
        };
        let mut attempts = 0u32;
        loop {
            let base = BaseRecord::with_opaque_to(&record.topic, Box::new((partition, generation, sequence)))
                .key(&record.key)
                .payload(&record.payload);
            match self.producer.send(base) {
                Ok(()) => {
                    self.lock().in_flight.sent(partition, generation);
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull), _)) => {
                    attempts += 1;
                    if attempts.is_multiple_of(1000) {
                        tracing::warn!(partition, "producer queue full; waiting for the broker");
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err((error, _)) => return Err(error),
            }
        }
    }

    /// Produces the queued re-sends, oldest first. On a refusal the output goes back to the
    /// front of the queue and the error is returned.
    fn produce_resends(&self) -> Result<(), KafkaError> {
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

    /// Processes one partition's records (in offset order) as one batch and produces the outputs
    /// — after any queued re-sends, so each output topic receives a partition's outputs in the
    /// order of their input offsets. A batch that does not start at the shard's stored offset is
    /// not processed: [`Processed::Gap`] (the caller repositions the consumer).
    fn process(
        &self,
        partition: i32,
        records: &[OwnedRecord],
        lateness_us: i64,
        accept_gap: bool,
    ) -> Result<Processed, DedupStateError> {
        let started = Instant::now();
        let mut inner = self.lock();
        let Some(owned) = inner.shards.get_mut(&partition) else {
            // Not ours (revoked while buffered): the new owner reads them from its stored offset.
            return Ok(Processed::Done);
        };
        let from = owned.shard.progress().next_offset.unwrap_or(i64::MIN);
        let inputs: Vec<InputRecord<'_>> = records
            .iter()
            .filter(|record| record.offset >= from)
            .map(|record| InputRecord {
                key: if record.key.is_empty() || record.key.contains(&0) {
                    INVALID_KEY
                } else {
                    record.key.as_slice()
                },
                payload: &record.payload,
                offset: record.offset,
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
        let mut processor = FlightProcessor::new(
            self.processing.rules,
            self.processing.topics.clone(),
            partition,
            Some(self.metrics.clone()),
            self.processing.max_message_bytes,
        );
        let now_us = chrono::Utc::now().timestamp_micros();
        let result = owned.shard.process_batch(
            &inputs,
            &mut processor,
            &EngineConfig {
                allowed_lateness_us: lateness_us,
            },
            now_us,
        )?;
        let next_offset = owned.shard.progress().next_offset.unwrap_or(-1);
        if next_offset % 64 == 0 || result.records >= 64 {
            let bytes = owned.shard.approximate_size_bytes();
            self.metrics
                .state_bytes
                .with_label_values(&[&partition.to_string()])
                .set(bytes as i64);
        }
        drop(inner);
        self.metrics.records.inc_by(result.records as u64);
        self.metrics.evicted.inc_by(result.evicted as u64);
        self.metrics.commits.inc();
        self.metrics
            .shard_offset
            .with_label_values(&[&partition.to_string()])
            .set(next_offset);
        // The outputs are in the outbox now. Re-sends queued by an assignment go first.
        let produced = self.produce_resends().and_then(|()| {
            result
                .outputs
                .iter()
                .try_for_each(|(sequence, record)| self.send(partition, *sequence, record))
        });
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

    /// RocksDB checkpoints of every owned shard for `epoch`, in the staging directory.
    fn checkpoint(&self, epoch: u64) -> Result<Vec<LocalCheckpoint>, StateError> {
        let inner = self.lock();
        let mut taken = Vec::new();
        for (partition, owned) in &inner.shards {
            let dir = self.staging_dir.join(format!("epoch-{epoch}-shard-{partition}"));
            let _ = std::fs::remove_dir_all(&dir);
            owned.shard.checkpoint(&dir)?;
            taken.push(LocalCheckpoint {
                partition: *partition,
                next_offset: owned.shard.progress().next_offset.unwrap_or(0),
                dir,
                generation: owned.generation,
            });
        }
        Ok(taken)
    }

    /// Status of every owned shard.
    pub fn status(&self) -> Vec<ShardStatus> {
        let inner = self.lock();
        inner
            .shards
            .iter()
            .map(|(partition, owned)| {
                let state_bytes = owned.shard.approximate_size_bytes();
                self.metrics
                    .state_bytes
                    .with_label_values(&[&partition.to_string()])
                    .set(state_bytes as i64);
                ShardStatus {
                    partition: *partition,
                    next_offset: owned.shard.progress().next_offset.unwrap_or(-1),
                    state_bytes,
                    origin: owned.origin.clone(),
                }
            })
            .collect()
    }

    /// Runs `read` over every owned shard (under the lock; keep it short).
    pub fn with_shards<R>(&self, read: impl FnOnce(&mut dyn Iterator<Item = &Shard>) -> R) -> R {
        let inner = self.lock();
        let mut shards = inner.shards.values().map(|owned| &owned.shard);
        read(&mut shards)
    }

    /// The directory holding the shard directories.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }
}

/// What became of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Processed {
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

/// What to do when a partition's batch does not start at its shard's stored offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GapAction {
    /// Seek the consumer back to the stored offset and read again.
    Reseek,
    /// The broker holds no record between the two offsets (its log starts at or below the
    /// stored offset, and repeated reads skip the same offsets: transaction markers or
    /// compaction): process from the record read.
    Accept,
    /// Records between the two offsets are gone from the broker: never skip them silently.
    Fail(String),
}

/// How many times a partition is re-read from its stored offset before the gap is judged.
pub const GAP_RETRIES: u32 = 3;

/// Decides on a gap at `partition`: `expected` is the shard's stored offset, `got` the first
/// record read, `attempts` how many times this gap was seen in a row, `low_watermark` the
/// partition's first offset on the broker (if it could be read). Pure.
pub fn on_gap(
    partition: i32,
    expected: i64,
    got: i64,
    attempts: u32,
    low_watermark: Option<i64>,
) -> GapAction {
    if attempts < GAP_RETRIES {
        return GapAction::Reseek;
    }
    match low_watermark {
        Some(low) if low > expected => GapAction::Fail(format!(
            "partition {partition}: records {expected}..{} are gone from the broker (its log starts at {low}: \
             retention?); dedup-state stops rather than skip them. Restore the data, or accept the loss by \
             restoring the shard from a checkpoint taken after them",
            low.min(got)
        )),
        Some(_) => GapAction::Accept,
        None => GapAction::Fail(format!(
            "partition {partition}: reads start at offset {got}, not at the stored {expected}, and the \
             broker's log start cannot be read"
        )),
    }
}

/// A polled record, copied out of librdkafka's buffer.
struct OwnedRecord {
    offset: i64,
    key: Vec<u8>,
    payload: Vec<u8>,
}

impl<M: Message> From<&M> for OwnedRecord {
    fn from(message: &M) -> Self {
        OwnedRecord {
            offset: message.offset(),
            key: message.key().unwrap_or_default().to_vec(),
            payload: message.payload().unwrap_or_default().to_vec(),
        }
    }
}

/// A gap seen at a partition: the shard's offset, how often in a row, whether it was accepted.
#[derive(Debug, Clone, Copy)]
struct GapSeen {
    expected: i64,
    attempts: u32,
    accepted: bool,
}

/// Consumer context: opens and closes shards on assignment and revocation, and assigns partitions
/// at the offsets stored in their shards.
pub struct GroupContext {
    shards: Arc<ShardSet>,
    input_topic: String,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        error: RDKafkaRespErr,
        partitions: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(consumer.rebalance_protocol(), RebalanceProtocol::Cooperative);
        match error {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let mut assignment = TopicPartitionList::new();
                for element in partitions.elements() {
                    if element.topic() != self.input_topic {
                        continue;
                    }
                    match self.shards.open(element.partition()) {
                        Ok(offset) => {
                            if let Err(error) =
                                assignment.add_partition_offset(element.topic(), element.partition(), offset)
                            {
                                self.shards
                                    .fail(format!("partition {}: {error}", element.partition()));
                            }
                        }
                        Err(error) => self
                            .shards
                            .fail(format!("open shard {}: {error}", element.partition())),
                    }
                }
                let result = if cooperative {
                    consumer.incremental_assign(&assignment)
                } else {
                    consumer.assign(&assignment)
                };
                if let Err(error) = result {
                    self.shards.fail(format!("assign: {error}"));
                }
                tracing::info!(partitions = ?assignment.elements().iter().map(|e| (e.partition(), e.offset())).collect::<Vec<_>>(), "partitions assigned at their stored offsets");
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let revoked: Vec<i32> = partitions
                    .elements()
                    .iter()
                    .map(|element| element.partition())
                    .collect();
                tracing::info!(?revoked, lost = consumer.assignment_lost(), "partitions revoked");
                self.shards.close(&revoked);
                let result = if cooperative {
                    consumer.incremental_unassign(partitions)
                } else {
                    consumer.unassign()
                };
                if let Err(error) = result {
                    tracing::warn!(%error, "unassign");
                }
            }
            other => {
                tracing::error!(error = ?other, "rebalance error");
                let _ = consumer.unassign();
                self.shards.close_all();
            }
        }
    }
}

/// How the processing thread runs.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Input topic.
    pub input_topic: String,
    /// Records per micro-batch.
    pub max_records: usize,
    /// Time to fill a batch.
    pub max_wait: Duration,
    /// Unacknowledged outputs above which consumption waits.
    pub max_unacknowledged: usize,
    /// Allowed lateness (the shard watermark), µs.
    pub lateness_us: i64,
}

/// Builds the group context for a consumer.
pub fn group_context(shards: Arc<ShardSet>, input_topic: &str) -> GroupContext {
    GroupContext {
        shards,
        input_topic: input_topic.to_owned(),
    }
}

/// The processing loop. Returns when `stop` is set (after closing every shard) or on a failure.
pub fn run(
    consumer: &BaseConsumer<GroupContext>,
    shards: &ShardSet,
    settings: &WorkerSettings,
    commands: &Receiver<Command>,
    stop: &AtomicBool,
    paused: &AtomicBool,
) -> Result<(), DedupStateError> {
    consumer.subscribe(&[&settings.input_topic]).map_err(|error| {
        DedupStateError::Broker(format!("subscribe to {}: {error}", settings.input_topic))
    })?;
    let mut is_paused = false;
    let mut buffered: Vec<(i32, OwnedRecord)> = Vec::with_capacity(settings.max_records);
    let mut gaps: HashMap<i32, GapSeen> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        if let Some(failure) = shards.failure() {
            return Err(DedupStateError::Worker(failure));
        }
        while let Ok(command) = commands.try_recv() {
            match command {
                Command::Checkpoint { epoch, reply } => {
                    let _ = reply.send(shards.checkpoint(epoch).map_err(|error| error.to_string()));
                }
            }
        }
        shards.apply_deliveries();
        shards
            .produce_resends()
            .map_err(|error| DedupStateError::Broker(format!("produce: {error}")))?;
        let want_pause =
            paused.load(Ordering::Relaxed) || shards.unacknowledged() >= settings.max_unacknowledged;
        if want_pause != is_paused {
            if let Ok(assignment) = consumer.assignment() {
                let _ = if want_pause {
                    consumer.pause(&assignment)
                } else {
                    consumer.resume(&assignment)
                };
            }
            is_paused = want_pause;
        }
        if is_paused {
            // Keep serving the group (rebalances, heartbeats) while not taking records; a partition
            // assigned while paused is paused as well. A record that arrives anyway is kept for
            // the next batch (never dropped: the fetch position is already past it).
            if let Some(Ok(message)) = consumer.poll(Duration::from_millis(20)) {
                if let Ok(assignment) = consumer.assignment() {
                    let _ = consumer.pause(&assignment);
                }
                buffered.push((message.partition(), OwnedRecord::from(&message)));
            }
            continue;
        }
        let deadline = Instant::now() + settings.max_wait;
        while buffered.len() < settings.max_records {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match consumer.poll(remaining) {
                Some(Ok(message)) => buffered.push((message.partition(), OwnedRecord::from(&message))),
                Some(Err(error)) => {
                    tracing::warn!(%error, "consumer error");
                    break;
                }
                None => break,
            }
            if remaining.is_zero() {
                break;
            }
        }
        if buffered.is_empty() {
            continue;
        }
        let mut by_partition: BTreeMap<i32, Vec<OwnedRecord>> = BTreeMap::new();
        for (partition, record) in buffered.drain(..) {
            by_partition.entry(partition).or_default().push(record);
        }
        for (partition, records) in by_partition {
            let accept_gap = gaps.get(&partition).is_some_and(|gap| gap.accepted);
            match shards.process(partition, &records, settings.lateness_us, accept_gap)? {
                Processed::Done => {
                    gaps.remove(&partition);
                }
                Processed::Gap { expected, got } => {
                    let gap = gaps.entry(partition).or_insert(GapSeen {
                        expected,
                        attempts: 0,
                        accepted: false,
                    });
                    if gap.expected != expected {
                        *gap = GapSeen {
                            expected,
                            attempts: 0,
                            accepted: false,
                        };
                    }
                    gap.attempts += 1;
                    let low = (gap.attempts >= GAP_RETRIES)
                        .then(|| {
                            consumer
                                .fetch_watermarks(&settings.input_topic, partition, Duration::from_secs(10))
                                .ok()
                                .map(|(low, _)| low)
                        })
                        .flatten();
                    match on_gap(partition, expected, got, gap.attempts, low) {
                        GapAction::Reseek => {
                            tracing::warn!(
                                partition,
                                expected,
                                got,
                                attempt = gap.attempts,
                                "batch does not start at the shard's offset; reading again from it"
                            );
                            consumer
                                .seek(
                                    &settings.input_topic,
                                    partition,
                                    Offset::Offset(expected),
                                    Duration::from_secs(10),
                                )
                                .map_err(|error| {
                                    DedupStateError::Broker(format!(
                                        "partition {partition}: seeking back to the shard's offset {expected}: {error}"
                                    ))
                                })?;
                        }
                        GapAction::Accept => {
                            tracing::warn!(
                                partition,
                                expected,
                                got,
                                "the broker holds no record between the shard's offset and the next record (markers or compaction); continuing from it"
                            );
                            gap.accepted = true;
                            shards.process(partition, &records, settings.lateness_us, true)?;
                            gaps.remove(&partition);
                        }
                        GapAction::Fail(message) => return Err(DedupStateError::Worker(message)),
                    }
                }
            }
        }
    }
    tracing::info!("stopping: closing shards and leaving the group");
    shards.close_all();
    consumer.unsubscribe();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_gap_is_read_again_then_accepted_only_if_the_broker_holds_nothing_in_it() {
        assert_eq!(on_gap(2, 100, 105, 1, None), GapAction::Reseek);
        assert_eq!(on_gap(2, 100, 105, GAP_RETRIES - 1, Some(200)), GapAction::Reseek);
        // The broker's log starts after the shard's offset: records were deleted (retention).
        match on_gap(2, 100, 105, GAP_RETRIES, Some(103)) {
            GapAction::Fail(message) => {
                assert!(
                    message.contains("partition 2: records 100..103 are gone"),
                    "{message}"
                )
            }
            other => panic!("{other:?}"),
        }
        // The log holds the offsets, yet three reads skip them: no records there.
        assert_eq!(on_gap(2, 100, 105, GAP_RETRIES, Some(0)), GapAction::Accept);
        assert!(matches!(
            on_gap(2, 100, 105, GAP_RETRIES, None),
            GapAction::Fail(_)
        ));
    }

    #[derive(Debug, Clone)]
    enum Step {
        Send(i32),
        Report,
        Close(i32),
        Reopen(i32),
    }

    proptest! {
        /// Whatever interleaving of sends, reports (in any order, for shards still owned or
        /// closed), closes and re-opens: the count is exactly the outputs of owned shards whose
        /// report has not come back, and it returns to 0 once every report arrived or its shard
        /// was closed — it can never stall consumption.
        #[test]
        fn the_in_flight_count_is_exact(
            steps in prop::collection::vec(
                prop_oneof![
                    (0i32..3).prop_map(Step::Send),
                    Just(Step::Report),
                    (0i32..3).prop_map(Step::Close),
                    (0i32..3).prop_map(Step::Reopen),
                ],
                0..80,
            ),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 80),
        ) {
            let mut in_flight = InFlight::default();
            let mut generation = [0u64; 3];
            let mut open = [true; 3];
            // Reports the producer still owes: (partition, generation).
            let mut owed: Vec<(i32, u64)> = Vec::new();
            let mut picks = picks.into_iter();
            for step in steps {
                match step {
                    Step::Send(partition) if open[partition as usize] => {
                        in_flight.sent(partition, generation[partition as usize]);
                        owed.push((partition, generation[partition as usize]));
                    }
                    Step::Send(_) => {}
                    Step::Report => {
                        if let (false, Some(pick)) = (owed.is_empty(), picks.next()) {
                            let (partition, generation) = owed.remove(pick.index(owed.len()));
                            in_flight.reported(partition, generation);
                        }
                    }
                    Step::Close(partition) => {
                        in_flight.closed(partition);
                        open[partition as usize] = false;
                    }
                    Step::Reopen(partition) => {
                        if !open[partition as usize] {
                            generation[partition as usize] += 1;
                            open[partition as usize] = true;
                        }
                    }
                }
                let expected = owed
                    .iter()
                    .filter(|(partition, owed_generation)| {
                        open[*partition as usize] && *owed_generation == generation[*partition as usize]
                    })
                    .count();
                prop_assert_eq!(in_flight.total(), expected);
            }
            for (partition, owed_generation) in owed.drain(..) {
                in_flight.reported(partition, owed_generation);
            }
            prop_assert_eq!(in_flight.total(), 0);
        }
    }
}
