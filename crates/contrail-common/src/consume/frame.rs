//! The consuming-stage frame: the consume → effect → commit loop, written once.
//!
//! A stage supplies its [`Effect`] — where it stores its positions, what it does with a record
//! (a version-guarded Cosmos DB upsert, a Delta commit), when that is durable — and the frame
//! does the rest:
//!
//! - **assignment**: each partition assigned (paused by [`super::RecordingContext::pausing`]
//!   before a record of it is fetched) starts at the position the effect stored, *judged* against
//!   the topic first ([`GapWatch`]): a position the topic no longer has holds that partition —
//!   reported, the others go on — until an operator accepts the gap; the partition then goes on
//!   at the topic's first offset, committed at once. A partition with no stored position starts
//!   at the topic's first offset: the frame seeks there itself, never leaving a partition to
//!   `auto.offset.reset`;
//! - **exact de-duplication by position**: a record below its partition's next offset (prefetched,
//!   or redelivered after a seek) is dropped; a first record past it without a seek there seeks
//!   back ([`position::place`]); a record of a partition not started (held, being judged, revoked) is
//!   dropped — it is read again from the judged position;
//! - **no silent gap while reading**: a record past its partition's next offset (librdkafka
//!   reset a position the broker lost to the topic's first offset) is judged against the topic's
//!   first offset ([`position::judge_jump`]) — records deleted before they were read hold the
//!   partition at a retention gap (a topic re-created under a running stage is found at its
//!   next start: librdkafka gives no sign of it while reading);
//! - **back-pressure and pause**: records are taken only while the effect has room and an
//!   operator has not paused the stage;
//! - **commit after the effect**: the offsets the effect reports durable are committed to the
//!   group for the partitions this instance still owns, then reported back to the effect;
//! - **drain on stop**: consumption stops, the effect finishes what it has in flight, and what it
//!   completed is committed. An error of the effect stops the frame at once; a stage whose store
//!   had an outage runs it again after [`Frame::restart_all`].
//!
//! Dead letters ([`super::DeadLetters`]), metrics and the admin status stay with the effect, which
//! knows what its records are.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};

use super::gap_watch::{Accepted, GapWatch};
use super::gaps::{Gap, GapCause};
use super::position::{self, Placement};
use super::rebalance::{RebalanceEvent, Rebalances, RecordingConsumer, TopicPartition};
use crate::shutdown::Shutdown;

/// How often the frame looks at assignments and accepted gaps when nothing else happens.
const TURN: Duration = Duration::from_millis(250);

/// How long partitions whose stored position could not be read wait before it is read again.
const RETRY_STORED: Duration = Duration::from_secs(1);

/// How long a seek or a commit may wait for the broker.
const BROKER_TIMEOUT: Duration = Duration::from_secs(10);

/// Offsets to commit: the next offset to read per partition, every record below it done.
pub type Points = Vec<(TopicPartition, i64)>;

/// What a consuming stage does with its records; the [`Frame`] calls it.
///
/// `ready` must be cancel-safe (the frame races it against consumption and stops); every other
/// method runs to completion.
#[allow(
    async_fn_in_trait,
    reason = "stages run the frame on their own task; no Send bound is asked for"
)]
pub trait Effect {
    /// What stops the frame (after a drain): the stage's error.
    type Error;
    /// Something the effect must act on (a write finished, a batch is due, a commit tick).
    type Ready;

    /// The stored positions of partitions just assigned: the next offset to read, `None` when
    /// nothing is stored (the partition starts at the topic's first offset). A partition left out
    /// of the answer (its store did not answer) is asked again a little later; an error stops the
    /// frame.
    async fn stored_positions(
        &mut self,
        consumer: &RecordingConsumer,
        partitions: &[TopicPartition],
    ) -> Result<Vec<(TopicPartition, Option<i64>)>, Self::Error>;

    /// The partition starts ([`Start`]: where, and after which accepted gap).
    async fn start(&mut self, partition: &TopicPartition, start: Start<'_>) -> Result<(), Self::Error>;

    /// The partition is not this instance's any more, or restarts from its stored position:
    /// whatever of it is not durable is forgotten (it is read again).
    fn stop(&mut self, partition: &TopicPartition);

    /// Whether the effect takes another record now.
    fn has_room(&self) -> bool;

    /// Takes a record: the next one of its partition.
    async fn take(&mut self, record: OwnedMessage) -> Result<(), Self::Error>;

    /// Waits for something to act on; never completes when there is nothing. Cancel-safe.
    async fn ready(&mut self) -> Self::Ready;

    /// Acts on it; returns the offsets to commit now (empty: none).
    async fn act(&mut self, ready: Self::Ready) -> Result<Points, Self::Error>;

    /// The broker acknowledged the commit of `points`.
    fn committed(&mut self, points: &[(TopicPartition, i64)]);

    /// Partitions the effect wants read again from their stored position (its store refused a
    /// write as another instance's: a zombie fence). Checked every turn.
    fn restarts(&mut self) -> Vec<TopicPartition> {
        Vec::new()
    }

    /// The stage stops: finish (or give up) what is in flight; returns the offsets to commit.
    async fn drain(&mut self) -> Result<Points, Self::Error>;
}

/// Where a partition starts, as the frame tells its effect.
#[derive(Debug, Clone, Copy)]
pub struct Start<'a> {
    /// The stored position it starts at (the next offset to read); `None`: nothing was stored.
    pub stored: Option<i64>,
    /// Where the consumer was put: the stored position, or the topic's first offset when nothing
    /// was stored (`None` if the broker did not say).
    pub at: Option<i64>,
    /// The gap an operator accepted, when it goes on after one (at the gap's end).
    pub accepted: Option<&'a Accepted>,
}

/// Where a started partition stands.
#[derive(Debug, Clone, Copy)]
struct Place {
    /// The next offset to take (`None`: the first record the topic has).
    next: Option<i64>,
    /// The consumer was sought to `next`.
    sought: bool,
}

/// The frame around one group consumer and its input topics.
pub struct Frame<'a> {
    consumer: &'a RecordingConsumer,
    rebalances: &'a Rebalances,
    /// One per input topic.
    watches: Vec<GapWatch>,
    paused: &'a AtomicBool,
    shutdown: &'a Shutdown,
    /// Partitions assigned and not started: their stored position is to be read and judged.
    unjudged: Vec<TopicPartition>,
    /// When the stored positions of `unjudged` may be read again.
    retry_at: Option<Instant>,
    /// Started partitions, by topic then partition (looked up by `&str` per record).
    places: HashMap<Arc<str>, HashMap<i32, Place>>,
}

impl<'a> Frame<'a> {
    /// A frame over `consumer` (created with [`super::RecordingContext::pausing`] recording into
    /// `rebalances`), judging each input topic with its [`GapWatch`].
    pub fn new(
        consumer: &'a RecordingConsumer,
        rebalances: &'a Rebalances,
        watches: Vec<GapWatch>,
        paused: &'a AtomicBool,
        shutdown: &'a Shutdown,
    ) -> Frame<'a> {
        Frame {
            consumer,
            rebalances,
            watches,
            paused,
            shutdown,
            unjudged: Vec::new(),
            retry_at: None,
            places: HashMap::new(),
        }
    }

    /// Consumes until the stage stops, then drains the effect and commits what it completed; or
    /// until the effect fails (returned at once, nothing more committed).
    pub async fn run<E: Effect>(&mut self, effect: &mut E) -> Result<(), E::Error> {
        let mut turn = tokio::time::interval(TURN);
        turn.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let result = loop {
            if let Err(error) = self.assignments(effect).await {
                break Err(error);
            }
            let room = effect.has_room() && !self.paused.load(Ordering::Relaxed);
            // Biased: stopping first, then the effect (what it finishes frees room and moves
            // commit points), then consumption.
            tokio::select! {
                biased;
                () = self.shutdown.triggered() => break Ok(()),
                ready = effect.ready() => match effect.act(ready).await {
                    Ok(points) => self.commit(effect, points),
                    Err(error) => break Err(error),
                },
                _ = turn.tick() => {}
                message = self.consumer.recv(), if room => match message {
                    Ok(message) => {
                        if let Err(error) = self.place(effect, message.detach()).await {
                            break Err(error);
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "consumer error");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                },
            }
        };
        // Stopping: consume no more, let the effect finish what is in flight, commit what it
        // completed. A failure stops at once: nothing more is committed (what the effect did not
        // report durable is read again).
        result?;
        let points = effect.drain().await?;
        self.commit(effect, points);
        Ok(())
    }

    /// After [`Frame::run`] failed (an outage of the effect's store): every partition this
    /// instance started or is judging is forgotten, paused, and started again from its stored
    /// position at the next run.
    pub fn restart_all<E: Effect>(&mut self, effect: &mut E) {
        let started: Vec<TopicPartition> = self
            .places
            .iter()
            .flat_map(|(topic, places)| places.keys().map(|partition| (topic.clone(), *partition)))
            .collect();
        for key in started {
            self.requeue(effect, key);
        }
        self.retry_at = None;
    }

    /// Forgets a started partition, pauses it and queues it to start again from its stored
    /// position.
    fn requeue<E: Effect>(&mut self, effect: &mut E, key: TopicPartition) {
        self.forget(effect, &key);
        self.set_paused(&key, true);
        if !self.unjudged.contains(&key) {
            self.unjudged.push(key);
        }
    }

    fn forget<E: Effect>(&mut self, effect: &mut E, partition: &TopicPartition) {
        let removed = self
            .places
            .get_mut(&partition.0)
            .and_then(|places| places.remove(&partition.1));
        if removed.is_some() {
            effect.stop(partition);
        }
    }

    /// Rebalances, restarts, stored positions and accepted gaps: every turn.
    async fn assignments<E: Effect>(&mut self, effect: &mut E) -> Result<(), E::Error> {
        for event in self.rebalances.take() {
            let (RebalanceEvent::Assigned(list) | RebalanceEvent::Revoked(list)) = &event;
            for (topic, partition) in list {
                let Some(watch) = self.watches.iter().find(|watch| watch.topic() == topic) else {
                    continue;
                };
                let key: TopicPartition = (Arc::from(topic.as_str()), *partition);
                self.unjudged.retain(|queued| *queued != key);
                match event {
                    // (Again): judged from its stored position.
                    RebalanceEvent::Assigned(_) => self.unjudged.push(key.clone()),
                    // Its new owner judges a gap held on it again.
                    RebalanceEvent::Revoked(_) => watch.release(*partition),
                }
                self.forget(effect, &key);
            }
        }
        for key in effect.restarts() {
            self.requeue(effect, key);
        }
        if !self.unjudged.is_empty() && self.retry_at.is_none_or(|at| Instant::now() >= at) {
            let stored = effect.stored_positions(self.consumer, &self.unjudged).await?;
            for (key, next) in stored {
                if !self.unjudged.contains(&key) {
                    continue;
                }
                self.unjudged.retain(|queued| *queued != key);
                if !self.judge(&key, next) {
                    continue;
                }
                // Nothing stored: the topic's first offset, as a number — a logical offset would
                // cost each partition an offset look-up before its first fetch.
                let at = next.or_else(|| self.first_offset(&key));
                let sought = self.seek(&key, at);
                // Nothing stored: the first record read is taken, wherever the topic starts now.
                self.places
                    .entry(key.0.clone())
                    .or_default()
                    .insert(key.1, Place { next, sought });
                let start = Start {
                    stored: next,
                    at,
                    accepted: None,
                };
                effect.start(&key, start).await?;
                // Resumed at once: it fetches while the next partitions are judged (each judgement
                // asks the broker for the partition's offsets, one round trip after the other).
                self.set_paused(&key, false);
            }
            self.retry_at = (!self.unjudged.is_empty()).then(|| Instant::now() + RETRY_STORED);
        }
        if self.watches.iter().any(GapWatch::any_accepted) {
            let consumer = self.consumer;
            let accepted: Vec<(Arc<str>, Accepted)> = tokio::task::block_in_place(|| {
                self.watches
                    .iter()
                    .flat_map(|watch| {
                        let topic: Arc<str> = Arc::from(watch.topic());
                        // Sought to `from`, still paused until it is committed there.
                        watch
                            .take_accepted(consumer, true)
                            .into_iter()
                            .map(move |accepted| (topic.clone(), accepted))
                    })
                    .collect()
            });
            for (topic, accepted) in accepted {
                let key: TopicPartition = (topic, accepted.partition);
                self.forget(effect, &key);
                self.unjudged.retain(|queued| *queued != key);
                let next = Some(accepted.from);
                self.places
                    .entry(key.0.clone())
                    .or_default()
                    .insert(key.1, Place { next, sought: true });
                let start = Start {
                    stored: next,
                    at: next,
                    accepted: Some(&accepted),
                };
                effect.start(&key, start).await?;
                // Committed at once, so a restart does not meet the gap again.
                self.commit(effect, vec![(key.clone(), accepted.from)]);
                self.set_paused(&key, false);
            }
        }
        Ok(())
    }

    /// Judges a stored position against the topic: `true` when the partition may start there
    /// (nothing stored, or the topic holds it); otherwise it is held at its gap or — the broker
    /// did not answer — judged again a little later.
    fn judge(&mut self, key: &TopicPartition, next: Option<i64>) -> bool {
        let Some(next) = next else { return true };
        let consumer = self.consumer;
        let Some(watch) = self.watches.iter().find(|watch| watch.topic() == &*key.0) else {
            return false;
        };
        let not_judged =
            tokio::task::block_in_place(|| watch.check_assigned(consumer, vec![(key.1, next)], true));
        if !not_judged.is_empty() {
            self.unjudged.push(key.clone());
            return false;
        }
        !watch.is_held(key.1)
    }

    /// The partition's first offset on the broker, if it answers.
    fn first_offset(&self, key: &TopicPartition) -> Option<i64> {
        let consumer = self.consumer;
        match tokio::task::block_in_place(|| consumer.fetch_watermarks(&key.0, key.1, BROKER_TIMEOUT)) {
            Ok((low, _)) => Some(low.max(0)),
            Err(error) => {
                tracing::debug!(topic = %key.0, partition = key.1, %error, "watermarks; seeking to the beginning instead");
                None
            }
        }
    }

    /// Positions the consumer at `next` (the topic's first offset for `None`); `false` when the
    /// seek failed — the first record read decides then ([`position::place`]).
    fn seek(&self, key: &TopicPartition, next: Option<i64>) -> bool {
        let offset = next.map_or(Offset::Beginning, Offset::Offset);
        let consumer = self.consumer;
        match tokio::task::block_in_place(|| consumer.seek(&key.0, key.1, offset, BROKER_TIMEOUT)) {
            Ok(()) => true,
            Err(error) => {
                tracing::debug!(topic = %key.0, partition = key.1, ?next, %error, "seek at start failed; the first record read decides");
                false
            }
        }
    }

    fn set_paused(&self, key: &TopicPartition, pause: bool) {
        let mut list = TopicPartitionList::new();
        list.add_partition(&key.0, key.1);
        let result = if pause {
            self.consumer.pause(&list)
        } else {
            self.consumer.resume(&list)
        };
        if let Err(error) = result {
            tracing::warn!(topic = %key.0, partition = key.1, pause, %error, "pausing or resuming a partition");
        }
    }

    /// Places a consumed record: taken by the effect when it is its partition's next.
    async fn place<E: Effect>(&mut self, effect: &mut E, record: OwnedMessage) -> Result<(), E::Error> {
        let offset = record.offset();
        let partition = record.partition();
        let Some(place) = self
            .places
            .get(record.topic())
            .and_then(|places| places.get(&partition))
            .copied()
        else {
            // Not started (held, being judged, revoked): read again from its judged position.
            return Ok(());
        };
        let placement = match place.next {
            None => Placement::Take,
            Some(next) if offset > next && place.sought => {
                let topic = record.topic().to_owned();
                match self.judge_jump(&topic, partition, next, offset) {
                    Some(placement) => placement,
                    None => {
                        // Held: nothing of it is read until the gap is accepted.
                        if let Some(places) = self.places.get_mut(topic.as_str()) {
                            places.remove(&partition);
                        }
                        return Ok(());
                    }
                }
            }
            Some(next) => position::place(next, offset, place.sought),
        };
        match placement {
            Placement::Take => {
                if let Some(place) = self
                    .places
                    .get_mut(record.topic())
                    .and_then(|places| places.get_mut(&partition))
                {
                    place.next = Some(offset + 1);
                }
                effect.take(record).await
            }
            Placement::Skip => Ok(()),
            Placement::SeekTo(next) => {
                let key: TopicPartition = (Arc::from(record.topic()), partition);
                tracing::info!(topic = %key.0, partition, offset, next, "seeking back to the stored position");
                if self.seek(&key, Some(next)) {
                    if let Some(place) = self
                        .places
                        .get_mut(&key.0)
                        .and_then(|places| places.get_mut(&partition))
                    {
                        place.sought = true;
                    }
                } else {
                    // Not assigned any more, or the broker is away: start it over.
                    self.requeue(effect, key);
                }
                Ok(())
            }
        }
    }

    /// A record at `offset` past the partition's `next` (the consumer was positioned at `next`):
    /// librdkafka jumped — the broker lost the position and it reset to the topic's first offset —
    /// or the offsets in between hold no record (compaction, transaction markers). Judged against
    /// the topic's first offset: `None` when records were lost (the partition is then held at a
    /// retention gap), else what to do with the record (take it; read again from `next` when the
    /// broker does not answer).
    fn judge_jump(&self, topic: &str, partition: i32, next: i64, offset: i64) -> Option<Placement> {
        let consumer = self.consumer;
        let watermarks =
            tokio::task::block_in_place(|| consumer.fetch_watermarks(topic, partition, BROKER_TIMEOUT)).ok();
        match position::judge_jump(
            next,
            offset,
            position::GAP_RETRIES,
            watermarks.map(|(low, _)| low),
        ) {
            position::Jump::NothingLost => Some(Placement::Take),
            position::Jump::Lost { from, log_start, .. } => {
                let watch = self.watches.iter().find(|watch| watch.topic() == topic)?;
                let gap = Gap {
                    cause: GapCause::Retention,
                    stored_next: from,
                    log_start,
                    log_end: watermarks.map_or(log_start, |(_, high)| high),
                };
                tokio::task::block_in_place(|| watch.hold(consumer, partition, gap));
                None
            }
            position::Jump::Unknown | position::Jump::Reseek => Some(Placement::SeekTo(next)),
        }
    }

    /// Commits `points` for the partitions this instance still owns and reports them committed.
    fn commit<E: Effect>(&self, effect: &mut E, mut points: Points) {
        if points.is_empty() {
            return;
        }
        // A partition lost in a rebalance may still have records in the effect (they finish all
        // the same), but its offsets are the new owner's to commit: a broker that checks the
        // assignment on commit would refuse the whole list, and committing would move the new
        // owner's point back. Should the partition come back, its point is still true.
        let assignment = match self.consumer.assignment() {
            Ok(assignment) => assignment,
            Err(error) => {
                tracing::warn!(%error, "reading the assignment; committing later");
                return;
            }
        };
        points.retain(|(key, _)| assignment.find_partition(&key.0, key.1).is_some());
        if points.is_empty() {
            return;
        }
        let mut list = TopicPartitionList::new();
        for (key, offset) in &points {
            if let Err(error) = list.add_partition_offset(&key.0, key.1, Offset::Offset(*offset)) {
                tracing::warn!(%error, "offset list");
            }
        }
        // Sync (off the async workers: it waits for the broker). A failed commit (the partition
        // moved to another member) only means records done are done again by the new owner.
        let consumer = self.consumer;
        match tokio::task::block_in_place(|| consumer.commit(&list, CommitMode::Sync)) {
            Ok(()) => effect.committed(&points),
            Err(error) => {
                tracing::warn!(%error, "the group's offset commit failed; records after its last commit may be read again")
            }
        }
    }
}

/// The group's committed offsets of `partitions`, for an effect whose positions are the group's:
/// partitions whose offsets the coordinator did not give are left out (asked again later).
pub fn group_positions(
    consumer: &RecordingConsumer,
    partitions: &[TopicPartition],
) -> Vec<(TopicPartition, Option<i64>)> {
    let mut list = TopicPartitionList::new();
    for (topic, partition) in partitions {
        list.add_partition(topic, *partition);
    }
    // Off the async workers: it waits for the group coordinator.
    match tokio::task::block_in_place(|| consumer.committed_offsets(list, BROKER_TIMEOUT)) {
        Ok(committed) => committed
            .elements()
            .iter()
            .map(|element| {
                let key: TopicPartition = (Arc::from(element.topic()), element.partition());
                let next = match element.offset() {
                    Offset::Offset(next) => Some(next),
                    _ => None,
                };
                (key, next)
            })
            .collect(),
        Err(error) => {
            tracing::warn!(%error, ?partitions, "reading the committed offsets of the partitions assigned; trying again");
            Vec::new()
        }
    }
}
