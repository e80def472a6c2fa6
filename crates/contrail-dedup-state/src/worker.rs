//! The polling thread and the processing threads: a consumer-group member that owns one RocksDB
//! shard per assigned input partition, runs micro-batches through the flight processor, and
//! produces the outbox.
//!
//! - **Assignment**: the rebalance callback only assigns the new partitions paused and records
//!   them ([`crate::opening`]); opener threads open each one's shard — reopened from the local
//!   directory, restored from the newest complete checkpoint, or started empty (the pure
//!   [`contrail_state::protocol::restore_plan`]) — while this thread goes on polling (the group,
//!   checkpoint barriers and the partitions already owned never wait for a restore). Once a shard
//!   is open, its outbox is queued for re-sending (produced before any new batch), the partition
//!   is sought to *the offset stored in the shard* — never a group offset or a guess — and that
//!   offset is judged against the topic ([`GapWatch`]) before the partition resumes: a gap holds
//!   that partition only.
//! - **Batches**: polled records are held per partition; each partition's next batch runs on one of
//!   `batch.threads` processing threads (or on the polling thread for 1), one batch per shard at a
//!   time; a record below the shard's stored offset is already reflected in its state and skipped
//!   (a stale fetch); a batch is held in memory (`process_held`) and its outputs produced; a
//!   commit point writes a shard's held batches (state, timers, offset) once their outputs are
//!   all acknowledged and `batch.commit_interval_ms` has passed (with `0`, `process_batch` commits
//!   every batch with its outputs in the outbox).
//! - **Deliveries**: the producer's delivery reports come back on a channel; acknowledged outputs
//!   are counted (held) or deleted from the outbox; a failed one fails the process (the restart
//!   reprocesses from the last commit point and re-sends the outbox in order). Output order
//!   within a key follows input order.
//! - **Revocation**: waits for the shard's running batch (its slot), then flushes the outputs,
//!   applies acknowledgements and closes the shard.
//! - **Checkpoint barriers** arrive as commands between polls: the polling thread hands a
//!   checkpoint handle per owned shard to the async side, which takes the RocksDB checkpoints
//!   (hard links, a memtable flush) on a blocking thread and uploads them while batches keep
//!   committing.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use contrail_common::consume::gaps::{self, Gaps};
use contrail_common::consume::{Jump, judge_jump};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::message::Message;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::oneshot;

use crate::error::DedupStateError;
use crate::opening::{Assignments, Openers};
use crate::records::{OwnedRecord, Pending};
use crate::shards::{PendingCheckpoint, Processed, ShardSet};
use contrail_common::consume::GapWatch;

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
    /// Records between the two offsets are gone from the broker (retention): never skip them
    /// silently — the partition is held at this gap until an operator accepts it.
    Hold(gaps::Gap),
    /// The broker's log start cannot be read: nothing to decide on.
    Fail(String),
}

pub use contrail_common::consume::GAP_RETRIES;

/// Decides on a gap at `partition`: `expected` is the shard's stored offset, `got` the first
/// record read, `attempts` how many times this gap was seen in a row, `watermarks` the
/// partition's first and next offset on the broker (if they could be read). Pure.
pub fn on_gap(
    partition: i32,
    expected: i64,
    got: i64,
    attempts: u32,
    watermarks: Option<(i64, i64)>,
) -> GapAction {
    match judge_jump(expected, got, attempts, watermarks.map(|(low, _)| low)) {
        Jump::Reseek => GapAction::Reseek,
        Jump::NothingLost => GapAction::Accept,
        Jump::Lost { from, log_start, .. } => GapAction::Hold(gaps::Gap {
            cause: gaps::GapCause::Retention,
            stored_next: from,
            log_start,
            log_end: watermarks.map_or(log_start, |(_, high)| high),
        }),
        Jump::Unknown => GapAction::Fail(format!(
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

/// Consumer context: records assignments (their shards are opened off this callback, by
/// [`Openers`]) and closes the shards of revoked partitions.
pub struct GroupContext {
    shards: Arc<ShardSet>,
    input_topic: String,
    gaps: Gaps,
    assignments: Arc<Assignments>,
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
                    if element.topic() == self.input_topic {
                        assignment.add_partition(element.topic(), element.partition());
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
                // Nothing of a partition is read before its shard is open and its stored offset
                // judged against the topic (no silent gap): the polling thread seeks and resumes it.
                if assignment.count() > 0
                    && let Err(error) = consumer.pause(&assignment)
                {
                    tracing::warn!(%error, "pausing the assigned partitions until their shards are open");
                }
                let assigned: Vec<i32> = assignment
                    .elements()
                    .iter()
                    .map(|element| element.partition())
                    .collect();
                self.assignments.assigned(&assigned);
                tracing::info!(partitions = ?assigned, "partitions assigned; opening their shards");
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let revoked: Vec<i32> = partitions
                    .elements()
                    .iter()
                    .map(|element| element.partition())
                    .collect();
                tracing::info!(?revoked, lost = consumer.assignment_lost(), "partitions revoked");
                self.shards.close(&revoked);
                for partition in &revoked {
                    self.gaps.release(&self.input_topic, *partition);
                }
                self.assignments.revoked(&revoked);
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
                // Nothing is owned any more: no partition is held or waits to be judged here.
                for held in self.gaps.held() {
                    if held.topic == self.input_topic {
                        self.gaps.release(&held.topic, held.partition);
                    }
                }
                self.assignments.clear();
            }
        }
    }
}

/// How the processing threads run.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Input topic.
    pub input_topic: String,
    /// Records per micro-batch of one shard.
    pub max_records: usize,
    /// How long an empty batch waits for its first record.
    pub max_wait: Duration,
    /// Unacknowledged outputs above which consumption waits.
    pub max_unacknowledged: usize,
    /// Allowed lateness (the shard watermark), µs.
    pub lateness_us: i64,
    /// Threads running batches (1: the polling thread runs them itself).
    pub threads: usize,
}

/// Builds the group context for a consumer; `gaps` is the stage's book of partitions held at a
/// gap (a revoked partition leaves it).
pub fn group_context(shards: Arc<ShardSet>, input_topic: &str, gaps: Gaps) -> GroupContext {
    GroupContext {
        shards,
        input_topic: input_topic.to_owned(),
        gaps,
        assignments: Arc::default(),
    }
}

/// One partition's batch for a processing thread.
struct Job {
    partition: i32,
    records: Vec<OwnedRecord>,
    accept_gap: bool,
}

/// What became of a [`Job`]; the records come back for a gap that is then accepted.
struct JobDone {
    job: Job,
    outcome: Result<Processed, DedupStateError>,
}

/// The processing loop: polls the consumer (serving the group, the rebalance callback and the
/// checkpoint commands) and runs each partition's batches in offset order — on this thread, or on
/// `settings.threads` processing threads, one batch per partition at a time. Returns when `stop`
/// is set (after the running batches finished and every shard was closed) or on a failure.
pub fn run(
    consumer: &BaseConsumer<GroupContext>,
    shards: &ShardSet,
    settings: &WorkerSettings,
    commands: &Receiver<Command>,
    stop: &AtomicBool,
    paused: &AtomicBool,
    watch: &GapWatch,
) -> Result<(), DedupStateError> {
    consumer.subscribe(&[&settings.input_topic]).map_err(|error| {
        DedupStateError::Broker(format!("subscribe to {}: {error}", settings.input_topic))
    })?;
    let result = std::thread::scope(|scope| {
        let (done_sender, done) = mpsc::channel::<JobDone>();
        let mut jobs = None;
        if settings.threads > 1 {
            let (job_sender, job_receiver) = mpsc::channel::<Job>();
            let job_receiver = Arc::new(Mutex::new(job_receiver));
            for index in 0..settings.threads {
                let job_receiver = job_receiver.clone();
                let done_sender = done_sender.clone();
                std::thread::Builder::new()
                    .name(format!("dedup-batch-{index}"))
                    .spawn_scoped(scope, move || {
                        loop {
                            // The receiver is only held while waiting for a job.
                            let job = match job_receiver.lock() {
                                Ok(receiver) => receiver.recv(),
                                Err(_) => return,
                            };
                            let Ok(job) = job else { return };
                            let outcome = shards.process(
                                job.partition,
                                &job.records,
                                settings.lateness_us,
                                job.accept_gap,
                            );
                            if done_sender.send(JobDone { job, outcome }).is_err() {
                                return;
                            }
                        }
                    })
                    .map_err(|error| {
                        DedupStateError::Worker(format!("cannot start a processing thread: {error}"))
                    })?;
            }
            jobs = Some(job_sender);
        }
        let mut openers = Openers::start(scope, shards, consumer.context().assignments.clone())?;
        let driver = Driver {
            consumer,
            shards,
            settings,
            commands,
            stop,
            paused,
            watch,
        };
        let result = driver.poll_loop(jobs.as_ref(), &done, &mut openers);
        // Closing the job queues ends the processing and opener threads once their work is done;
        // the opens still queued are skipped (nothing is current any more), so a stop during a
        // rebalance waits for the restores in progress only.
        consumer.context().assignments.clear();
        drop(jobs);
        drop(openers);
        result
    });
    if result.is_ok() {
        tracing::info!("stopping: closing shards and leaving the group");
        shards.close_all();
        consumer.unsubscribe();
    }
    result
}

/// What [`run`]'s loop works with.
struct Driver<'a> {
    consumer: &'a BaseConsumer<GroupContext>,
    shards: &'a ShardSet,
    settings: &'a WorkerSettings,
    commands: &'a Receiver<Command>,
    stop: &'a AtomicBool,
    paused: &'a AtomicBool,
    watch: &'a GapWatch,
}

impl Driver<'_> {
    /// [`run`]'s loop; `jobs` is the processing threads' queue (`None`: batches run here).
    fn poll_loop(
        &self,
        jobs: Option<&mpsc::Sender<Job>>,
        done: &mpsc::Receiver<JobDone>,
        openers: &mut Openers,
    ) -> Result<(), DedupStateError> {
        let Driver {
            consumer,
            shards,
            settings,
            commands,
            stop,
            paused,
            watch,
        } = *self;
        let threads = settings.threads.max(1);
        // Polled records are held up to this many (then the loop waits for batches to finish).
        let hold = settings.max_records.saturating_mul(threads * 2);
        let mut is_paused = false;
        let mut pending = Pending::default();
        let mut last_dispatched = -1;
        let mut gaps: HashMap<i32, GapSeen> = HashMap::new();
        while !stop.load(Ordering::Relaxed) {
            if let Some(failure) = shards.failure() {
                return Err(DedupStateError::Worker(failure));
            }
            while let Ok(command) = commands.try_recv() {
                match command {
                    Command::Checkpoint { epoch, reply } => {
                        // The checkpoint holds what is committed: commit what may be first.
                        shards.apply_deliveries();
                        shards.persist_due(true);
                        let _ = reply.send(shards.checkpoint(epoch));
                    }
                }
            }
            for (partition, offset) in openers.turn(shards)? {
                // Whatever was polled of it before its shard was open is read again from its offset.
                pending.clear(partition);
                gaps.remove(&partition);
                self.start_partition(partition, offset, is_paused);
            }
            for accepted in watch.take_accepted(consumer, is_paused) {
                pending.clear(accepted.partition);
                gaps.insert(
                    accepted.partition,
                    GapSeen {
                        expected: accepted.expected,
                        attempts: 0,
                        accepted: true,
                    },
                );
            }
            shards.apply_deliveries();
            match jobs {
                // Commit points run on the processing threads, as batches without records.
                Some(jobs) => {
                    for partition in shards.due_for_commit() {
                        if !pending.running.insert(partition) {
                            continue;
                        }
                        let job = Job {
                            partition,
                            records: Vec::new(),
                            accept_gap: false,
                        };
                        if jobs.send(job).is_err() {
                            return Err(DedupStateError::Worker(
                                "the processing threads stopped".to_owned(),
                            ));
                        }
                    }
                }
                None => shards.persist_due(false),
            }
            while let Ok(finished) = done.try_recv() {
                pending.running.remove(&finished.job.partition);
                on_batch_done(consumer, settings, watch, &mut pending, &mut gaps, finished)?;
            }
            // Re-sends queued by an assignment go out before any newer output.
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
                    if !want_pause {
                        watch.keep_held_paused(consumer);
                        keep_paused(consumer, &settings.input_topic, &openers.unopened());
                    }
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
                    pending.push(message.partition(), OwnedRecord::from(&message));
                }
                continue;
            }
            // Wait (up to max_wait) only when nothing is held or running; then take what has already
            // arrived, without waiting: waiting to fill a batch would add up to max_wait to every
            // record's latency at low load, and under load the consumer's prefetch fills batches
            // anyway. While batches run elsewhere, poll in short steps to notice them finishing.
            let deadline = Instant::now() + settings.max_wait;
            while pending.total < hold {
                let wait = if pending.total > 0 {
                    Duration::ZERO
                } else if !pending.running.is_empty() {
                    Duration::from_millis(1)
                } else {
                    deadline.saturating_duration_since(Instant::now())
                };
                match consumer.poll(wait) {
                    Some(Ok(message)) => pending.push(message.partition(), OwnedRecord::from(&message)),
                    Some(Err(error)) => {
                        tracing::warn!(%error, "consumer error");
                        break;
                    }
                    None => break,
                }
            }
            // A rebalance during the poll may have queued re-sends: they go before new outputs.
            shards
                .produce_resends()
                .map_err(|error| DedupStateError::Broker(format!("produce: {error}")))?;
            match jobs {
                Some(jobs) => {
                    let mut dispatched = false;
                    while pending.running.len() < threads
                        && let Some((partition, records)) =
                            pending.next_batch(&mut last_dispatched, settings.max_records)
                    {
                        let accept_gap = gaps.get(&partition).is_some_and(|gap| gap.accepted);
                        pending.running.insert(partition);
                        dispatched = true;
                        if jobs
                            .send(Job {
                                partition,
                                records,
                                accept_gap,
                            })
                            .is_err()
                        {
                            return Err(DedupStateError::Worker(
                                "the processing threads stopped".to_owned(),
                            ));
                        }
                    }
                    if !dispatched && !pending.running.is_empty() {
                        // Nothing to start (what is held belongs to partitions with a batch running):
                        // wait a moment for one to finish, longer when no more may be polled.
                        let wait = Duration::from_millis(if pending.total >= hold { 20 } else { 1 });
                        if let Ok(finished) = done.recv_timeout(wait) {
                            pending.running.remove(&finished.job.partition);
                            on_batch_done(consumer, settings, watch, &mut pending, &mut gaps, finished)?;
                        }
                    }
                }
                None => {
                    while let Some((partition, records)) =
                        pending.next_batch(&mut last_dispatched, settings.max_records)
                    {
                        let accept_gap = gaps.get(&partition).is_some_and(|gap| gap.accepted);
                        let outcome = shards.process(partition, &records, settings.lateness_us, accept_gap);
                        let job = Job {
                            partition,
                            records,
                            accept_gap,
                        };
                        on_batch_done(
                            consumer,
                            settings,
                            watch,
                            &mut pending,
                            &mut gaps,
                            JobDone { job, outcome },
                        )?;
                    }
                }
            }
        }
        // Let the running batches finish (their outputs are produced before the shards close).
        while !pending.running.is_empty() {
            match done.recv_timeout(Duration::from_secs(120)) {
                Ok(finished) => {
                    pending.running.remove(&finished.job.partition);
                    finished.outcome?;
                }
                Err(_) => {
                    return Err(DedupStateError::Worker(
                        "a batch did not finish within 120 s".to_owned(),
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Driver<'_> {
    /// Puts a partition whose shard was just opened at the offset stored in it (the topic's first
    /// offset for a shard that never committed), judges that offset against the topic, and
    /// resumes the partition (unless the loop keeps its whole assignment paused) or holds it.
    fn start_partition(&self, partition: i32, offset: Offset, is_paused: bool) {
        let (consumer, topic) = (self.consumer, &self.settings.input_topic);
        let at = match offset {
            Offset::Offset(stored) => Offset::Offset(stored),
            _ => consumer
                .fetch_watermarks(topic, partition, BROKER_TIMEOUT)
                .map_or(Offset::Beginning, |(low, _)| Offset::Offset(low)),
        };
        if let Err(error) = consumer.seek(topic, partition, at, BROKER_TIMEOUT) {
            // The first batch is checked against the shard's offset anyway (a gap is read again).
            tracing::warn!(partition, ?at, %error, "seeking to the shard's offset");
        }
        match offset {
            Offset::Offset(stored) => {
                // Not judged (a broker hiccup): better read it than stop it — the batch check
                // still refuses to skip past the shard's offset (`on_gap`).
                for (partition, _) in
                    self.watch
                        .check_assigned(consumer, vec![(partition, stored)], is_paused)
                {
                    if !is_paused {
                        self.watch.resume(consumer, partition);
                    }
                }
            }
            _ if !is_paused => self.watch.resume(consumer, partition),
            _ => {}
        }
    }
}

/// Pauses `partitions` of `topic` again after the loop resumed its whole assignment.
fn keep_paused(consumer: &BaseConsumer<GroupContext>, topic: &str, partitions: &[i32]) {
    if partitions.is_empty() {
        return;
    }
    let mut list = TopicPartitionList::new();
    for partition in partitions {
        list.add_partition(topic, *partition);
    }
    if let Err(error) = consumer.pause(&list) {
        tracing::warn!(%error, ?partitions, "keeping the partitions whose shards are opening paused");
    }
}

/// How long a seek or a watermark request may wait for the broker.
const BROKER_TIMEOUT: Duration = Duration::from_secs(10);

/// Handles a finished batch: a gap repositions the partition (its held records are dropped and
/// read again) or is accepted (the records go back to be processed from the record read).
fn on_batch_done(
    consumer: &BaseConsumer<GroupContext>,
    settings: &WorkerSettings,
    watch: &GapWatch,
    pending: &mut Pending,
    gaps: &mut HashMap<i32, GapSeen>,
    finished: JobDone,
) -> Result<(), DedupStateError> {
    let JobDone { job, outcome } = finished;
    let partition = job.partition;
    match outcome? {
        // A batch without records (a commit point) says nothing about a gap being retried.
        Processed::Done if job.records.is_empty() => {}
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
            let watermarks = (gap.attempts >= GAP_RETRIES)
                .then(|| {
                    consumer
                        .fetch_watermarks(&settings.input_topic, partition, Duration::from_secs(10))
                        .ok()
                })
                .flatten();
            match on_gap(partition, expected, got, gap.attempts, watermarks) {
                GapAction::Reseek => {
                    tracing::warn!(
                        partition,
                        expected,
                        got,
                        attempt = gap.attempts,
                        "batch does not start at the shard's offset; reading again from it"
                    );
                    pending.clear(partition);
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
                    pending.put_back(partition, job.records);
                }
                GapAction::Hold(found) => {
                    pending.clear(partition);
                    watch.hold(consumer, partition, found);
                }
                GapAction::Fail(message) => return Err(DedupStateError::Worker(message)),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_is_read_again_then_held_if_the_broker_deleted_records_in_it() {
        assert_eq!(on_gap(2, 100, 105, 1, None), GapAction::Reseek);
        assert_eq!(
            on_gap(2, 100, 105, GAP_RETRIES - 1, Some((200, 300))),
            GapAction::Reseek
        );
        // The broker's log starts after the shard's offset: records were deleted (retention). The
        // partition is held at the gap, which ends where the log starts.
        assert_eq!(
            on_gap(2, 100, 105, GAP_RETRIES, Some((103, 150))),
            GapAction::Hold(gaps::Gap {
                cause: gaps::GapCause::Retention,
                stored_next: 100,
                log_start: 103,
                log_end: 150,
            })
        );
        // The log holds the offsets, yet three reads skip them: no records there.
        assert_eq!(
            on_gap(2, 100, 105, GAP_RETRIES, Some((0, 150))),
            GapAction::Accept
        );
        assert!(matches!(
            on_gap(2, 100, 105, GAP_RETRIES, None),
            GapAction::Fail(_)
        ));
    }
}
