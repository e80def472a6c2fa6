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
//! - **Checkpoint barriers** arrive as commands between batches: the thread hands a checkpoint
//!   handle per owned shard to the async side, which takes the RocksDB checkpoints (hard links,
//!   a memtable flush) on a blocking thread and uploads them while batches keep committing.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::message::Message;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::oneshot;

use crate::error::DedupStateError;
use crate::shards::{OwnedRecord, PendingCheckpoint, Processed, ShardSet};

/// Requests to the processing thread.
pub enum Command {
    /// Checkpoint every owned shard for `epoch`.
    Checkpoint {
        /// The epoch.
        epoch: u64,
        /// Where to send the shards' checkpoint handles.
        reply: oneshot::Sender<Vec<PendingCheckpoint>>,
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
    /// How long an empty batch waits for its first record.
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
                    let _ = reply.send(shards.checkpoint(epoch));
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
        // Wait (up to max_wait) only for a batch's first record; then take what has already
        // arrived, without waiting, up to max_records: waiting to fill a batch would add up to
        // max_wait to every record's latency at low load, and under load the consumer's prefetch
        // fills batches anyway.
        let deadline = Instant::now() + settings.max_wait;
        while buffered.len() < settings.max_records {
            let wait = if buffered.is_empty() {
                deadline.saturating_duration_since(Instant::now())
            } else {
                Duration::ZERO
            };
            match consumer.poll(wait) {
                Some(Ok(message)) => buffered.push((message.partition(), OwnedRecord::from(&message))),
                Some(Err(error)) => {
                    tracing::warn!(%error, "consumer error");
                    break;
                }
                None => break,
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
}
