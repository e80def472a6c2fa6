//! The polling thread's side of [`Gaps`] for one input topic: no silent gap (docs/CONTRACT.md,
//! "No silent gap"). A partition whose stored position is not in the topic any more is stopped —
//! that partition only — reported through the stage's [`Gaps`] (ERROR log, metric, readiness,
//! admin status) and goes on only once an operator accepts the gap.
//!
//! The stage pauses each partition it is assigned at a stored position before reading it (in its
//! rebalance callback); [`GapWatch::check_assigned`] judges that position against the partition's
//! watermarks ([`gaps::judge_start`]; a position past the end the broker reports is confirmed
//! with the broker, [`gaps::position_exists`]) and resumes the partition or holds it. A stage that
//! finds a gap while reading (a batch starting past its position with the records between
//! deleted) holds it with [`GapWatch::hold`]. An accepted gap resumes the partition at the topic's
//! first offset when the gap was found ([`GapWatch::take_accepted`]); what a stage must do with
//! its own positions then (and whether it can accept a gap past the end at all) is the stage's.
use std::time::Duration;

use super::gaps::{self, Gap, Gaps, Start};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};

/// How long the broker has to show the record before a stored offset past its reported end.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// A gap an operator accepted: the partition goes on at `from` instead of the stored `expected`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The partition.
    pub partition: i32,
    /// The stored position (the next offset the stage expected).
    pub expected: i64,
    /// Where the partition goes on (the topic's first offset when the gap was found).
    pub from: i64,
    /// The gap as it was held (what a stage records of it).
    pub held: gaps::Held,
}

/// The polling thread's side of [`Gaps`] for the input topic.
pub struct GapWatch {
    gaps: Gaps,
    probe: ClientConfig,
    topic: String,
}

impl GapWatch {
    /// Watches `topic`'s partitions; `probe` is the stage's client configuration.
    pub fn new(gaps: Gaps, probe: ClientConfig, topic: &str) -> GapWatch {
        GapWatch {
            gaps,
            probe,
            topic: topic.to_owned(),
        }
    }

    /// Whether `partition` is held at a gap (its records are dropped; none should arrive).
    pub fn is_held(&self, partition: i32) -> bool {
        self.gaps.is_held(&self.topic, partition)
    }

    /// The partition is not this instance's any more: a gap held on it is released (its new
    /// owner judges it again).
    pub fn release(&self, partition: i32) {
        self.gaps.release(&self.topic, partition);
    }

    /// Resumes a partition assigned without a stored position (it starts at the topic's first
    /// offset: nothing is skipped), or one the stage reads unjudged.
    pub fn resume<C: ConsumerContext>(&self, consumer: &impl Consumer<C>, partition: i32) {
        self.set_paused(consumer, partition, false);
    }

    /// Judges the partitions just assigned at their stored `(partition, next offset)`: resumes
    /// the ones whose position the topic holds (unless the loop keeps its whole assignment
    /// `paused`: its resume takes them along), holds the others. Returns the ones it could not
    /// judge (the broker did not answer), still paused: the stage decides — read them if it checks
    /// for gaps while reading, or judge them again.
    pub fn check_assigned<C: ConsumerContext>(
        &self,
        consumer: &impl Consumer<C>,
        assigned: Vec<(i32, i64)>,
        paused: bool,
    ) -> Vec<(i32, i64)> {
        let mut not_judged = Vec::new();
        for (partition, stored) in assigned {
            match self.judge(consumer, partition, stored) {
                Ok(None) => self.set_paused(consumer, partition, paused),
                Ok(Some(gap)) => self.hold(consumer, partition, gap),
                Err(error) => {
                    tracing::warn!(
                        topic = %self.topic,
                        partition,
                        stored,
                        %error,
                        "could not judge the partition's stored offset against the topic"
                    );
                    not_judged.push((partition, stored));
                }
            }
        }
        not_judged
    }

    fn judge<C: ConsumerContext>(
        &self,
        consumer: &impl Consumer<C>,
        partition: i32,
        stored: i64,
    ) -> Result<Option<Gap>, String> {
        let (low, high) = consumer
            .fetch_watermarks(&self.topic, partition, Duration::from_secs(10))
            .map_err(|error| format!("watermarks: {error}"))?;
        Ok(match gaps::judge_start(Some(stored), low, high) {
            Start::First(_) | Start::At(_) => None,
            Start::Gap(gap) => Some(gap),
            Start::PastReportedEnd(next) => {
                let exists = gaps::position_exists(&self.probe, &self.topic, partition, next, PROBE_TIMEOUT)
                    .map_err(|error| format!("asking for offset {}: {error}", next - 1))?;
                (!exists).then(|| gaps::past_end(next, low, high))
            }
        })
    }

    /// Holds `partition` at `gap`: reported, and paused so nothing of it is read.
    pub fn hold<C: ConsumerContext>(&self, consumer: &impl Consumer<C>, partition: i32, gap: Gap) {
        self.gaps.hold(&self.topic, partition, gap);
        self.set_paused(consumer, partition, true);
    }

    /// After the loop resumed its whole assignment: pauses the held partitions again.
    pub fn keep_held_paused<C: ConsumerContext>(&self, consumer: &impl Consumer<C>) {
        for held in self.gaps.held() {
            if held.topic == self.topic {
                self.set_paused(consumer, held.partition, true);
            }
        }
    }

    /// Whether an operator accepted a gap the loop has not taken yet (cheap: no I/O; any topic).
    pub fn any_accepted(&self) -> bool {
        self.gaps.any_accepted()
    }

    /// The topic this watch judges.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The gaps an operator accepted since the last call: each partition is sought to where it goes
    /// on and resumed (unless the loop keeps its whole assignment `paused`: its resume takes it
    /// along).
    pub fn take_accepted<C: ConsumerContext>(
        &self,
        consumer: &impl Consumer<C>,
        paused: bool,
    ) -> Vec<Accepted> {
        let mut accepted = Vec::new();
        for held in self.gaps.take_accepted_of(&self.topic) {
            let partition = held.partition;
            let from = held.gap.log_start;
            if let Err(error) = consumer.seek(
                &self.topic,
                partition,
                Offset::Offset(from),
                Duration::from_secs(10),
            ) {
                // Still paused at its old position: hold it again rather than read from a guess.
                tracing::error!(topic = %self.topic, partition, from, %error, "seeking to the accepted gap's end");
                self.gaps.hold(&self.topic, partition, held.gap);
                continue;
            }
            self.set_paused(consumer, partition, paused);
            tracing::warn!(
                topic = %self.topic,
                partition,
                expected = held.gap.stored_next,
                from,
                "partition goes on after its accepted gap"
            );
            accepted.push(Accepted {
                partition,
                expected: held.gap.stored_next,
                from,
                held,
            });
        }
        accepted
    }

    fn set_paused<C: ConsumerContext>(&self, consumer: &impl Consumer<C>, partition: i32, pause: bool) {
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.topic, partition);
        let result = if pause {
            consumer.pause(&list)
        } else {
            consumer.resume(&list)
        };
        if let Err(error) = result {
            tracing::warn!(topic = %self.topic, partition, pause, %error, "pausing or resuming a partition");
        }
    }
}
