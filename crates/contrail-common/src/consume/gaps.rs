//! No silent gap: a partition whose stored position the topic no longer holds is stopped, reported
//! and goes on only once an operator accepts the gap (docs/CONTRACT.md, "No silent gap").
//!
//! [`judge_start`] says where a partition starts from its stored position and the broker's
//! watermarks (pure). A position past the end the broker reports is confirmed with the broker
//! itself ([`position_exists`]): the local stand-in broker reports an end below the true one after
//! multi-record batches, so "past the reported end" alone is not a gap there. [`Gaps`] holds the
//! partitions stopped at a gap for the stage: readiness, the ERROR log, the metric
//! `contrail_consumer_gap_held` and the admin API's `Status` and `AcceptGap` read and change it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use contrail_proto::admin::v1 as admin;
use prometheus::{IntGaugeVec, Opts};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::metrics::MetricsRegistry;
use crate::server::Health;

/// Why a partition's stored position is not in its topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapCause {
    /// The records from the stored position on were deleted (retention) before they were read.
    Retention,
    /// The stored position is beyond the topic's end: the topic was deleted and created again (or
    /// truncated). The records after the stored position went with the old topic.
    PastEnd,
}

impl GapCause {
    /// As the admin API and the metric name it.
    pub fn label(self) -> &'static str {
        match self {
            GapCause::Retention => "retention",
            GapCause::PastEnd => "past-end",
        }
    }
}

/// A gap found in a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// Why.
    pub cause: GapCause,
    /// The next offset the stage stored for the partition.
    pub stored_next: i64,
    /// The topic's first offset when the gap was found: where the partition goes on once accepted.
    pub log_start: i64,
    /// The topic's next offset as the broker reported it.
    pub log_end: i64,
}

impl Gap {
    /// Records known lost, or `None` when the topic cannot tell (past the end: they were in the
    /// old topic).
    pub fn records_lost(&self) -> Option<i64> {
        match self.cause {
            GapCause::Retention => Some(self.log_start - self.stored_next),
            GapCause::PastEnd => None,
        }
    }
}

/// Where a partition starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Nothing stored: at the topic's first offset.
    First(i64),
    /// At the stored position, which the topic holds.
    At(i64),
    /// The stored position is past the end the broker reports: ask the broker whether the record
    /// before it exists ([`position_exists`]); if it does, start [`Start::At`] it, else it is
    /// [`GapCause::PastEnd`].
    PastReportedEnd(i64),
    /// Stop at a gap.
    Gap(Gap),
}

/// Judges where a partition starts: `stored_next` is the next offset the stage stored (`None`:
/// nothing stored), `low`/`high` the broker's first and next offset of the partition.
pub fn judge_start(stored_next: Option<i64>, low: i64, high: i64) -> Start {
    let low = low.max(0);
    match stored_next {
        None => Start::First(low),
        Some(next) if next < low => Start::Gap(Gap {
            cause: GapCause::Retention,
            stored_next: next,
            log_start: low,
            log_end: high,
        }),
        Some(next) if next <= high => Start::At(next),
        Some(next) => Start::PastReportedEnd(next),
    }
}

/// The gap of a position the broker said is not in its log (after [`Start::PastReportedEnd`]).
pub fn past_end(stored_next: i64, low: i64, high: i64) -> Gap {
    Gap {
        cause: GapCause::PastEnd,
        stored_next,
        log_start: low.max(0),
        log_end: high,
    }
}

/// Whether the broker holds the record before `next` in `topic`/`partition` (so `next` is a
/// position in its log, at most its end): a fetch of that one offset with no reset policy returns
/// the record if it is there. Kafka and Event Hubs answer a fetch past the end "offset out of
/// range"; the local broker (tansu 0.6.0) answers it with nothing at all, while it returns a
/// record that exists at once — so no record within `timeout` (of a broker that just answered
/// the watermarks) also means it is not there. Erring that way holds a partition an operator
/// then looks at, never skips one. `config` is the stage's client configuration.
pub fn position_exists(
    config: &ClientConfig,
    topic: &str,
    partition: i32,
    next: i64,
    timeout: Duration,
) -> Result<bool, KafkaError> {
    if next <= 0 {
        return Ok(true);
    }
    let mut config = config.clone();
    // librdkafka assigns only within a group; the probe never joins it (no subscribe) nor commits.
    config
        .set("group.id", "contrail-gap-probe")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "error")
        .set("enable.partition.eof", "false");
    let probe: BaseConsumer = config.create()?;
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, partition, Offset::Offset(next - 1))?;
    probe.assign(&list)?;
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        match probe.poll(Duration::from_millis(200)) {
            Some(Ok(message)) if message.partition() == partition => return Ok(true),
            Some(Ok(_)) | None => {}
            Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset))) => {
                return Ok(false);
            }
            Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::OffsetOutOfRange))) => {
                return Ok(false);
            }
            Some(Err(error)) => {
                tracing::debug!(topic, partition, %error, "probing a position");
            }
        }
    }
    tracing::info!(
        topic,
        partition,
        offset = next - 1,
        timeout_ms = timeout.as_millis() as u64,
        "no record at the offset before the stored position: past the topic's end"
    );
    Ok(false)
}

/// A partition held at a gap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The gap.
    pub gap: Gap,
    /// When it was found, µs since the Unix epoch.
    pub found_at_us: i64,
}

impl Held {
    /// As the admin API reports it.
    pub fn to_status(&self) -> admin::GapStatus {
        admin::GapStatus {
            topic: self.topic.clone(),
            partition: self.partition,
            cause: self.gap.cause.label().to_owned(),
            stored_next: self.gap.stored_next,
            log_start: self.gap.log_start,
            log_end: self.gap.log_end,
            records_lost: self.gap.records_lost().unwrap_or(-1),
            found_at_us: self.found_at_us,
        }
    }
}

#[derive(Default)]
struct Book {
    held: BTreeMap<(String, i32), Held>,
    accepted: Vec<Held>,
}

/// The partitions this instance holds at a gap, shared by the stage's loop (which holds and
/// releases them, and picks up acceptances), its readiness, its metric and its admin API.
/// Clones share the book.
#[derive(Clone)]
pub struct Gaps {
    stage: &'static str,
    book: Arc<Mutex<Book>>,
    health: Health,
    metric: IntGaugeVec,
}

impl Gaps {
    /// No partition held.
    pub fn new(stage: &'static str, health: Health) -> Gaps {
        let metric = IntGaugeVec::new(
            Opts::new(
                "contrail_consumer_gap_held",
                "1 while this instance holds an input partition at a gap: the position it stored \
                 is gone from the topic (cause: retention or past-end); the partition is not \
                 consumed until an operator runs `contrail admin accept-gap`",
            ),
            &["topic", "partition", "cause"],
        )
        .expect("a valid metric definition");
        Gaps {
            stage,
            book: Arc::default(),
            health,
            metric,
        }
    }

    /// Exports `contrail_consumer_gap_held` in `registry`.
    pub fn register_metrics(&self, registry: &MetricsRegistry) {
        registry.register(&self.metric);
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds `topic`/`partition` at `gap`: an ERROR log naming it, the metric, not ready. Holding
    /// it again (a rebalance gave it back) keeps the first finding.
    pub fn hold(&self, topic: &str, partition: i32, gap: Gap) {
        let mut book = self.book();
        let key = (topic.to_owned(), partition);
        match book.held.get(&key) {
            Some(held) if held.gap == gap => return,
            // Found again with other offsets: its old series goes, the new one is exported below.
            Some(held) => self.unexport(held),
            None => {}
        }
        let found_at_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| i64::try_from(since.as_micros()).unwrap_or(i64::MAX));
        tracing::error!(
            stage = self.stage,
            topic,
            partition,
            cause = gap.cause.label(),
            from = gap.stored_next,
            log_start = gap.log_start,
            log_end = gap.log_end,
            records_lost = gap.records_lost().unwrap_or(-1),
            "GAP: the position stored for this partition is not in the topic any more; the \
             partition is stopped (the others go on). Nothing of it is consumed until an operator \
             accepts the gap: contrail admin accept-gap --topic {topic} --partition {partition}",
        );
        self.metric
            .with_label_values(&[topic, &partition.to_string(), gap.cause.label()])
            .set(1);
        book.held.insert(
            key,
            Held {
                topic: topic.to_owned(),
                partition,
                gap,
                found_at_us,
            },
        );
        self.health.set_held_gaps(book.held.len());
    }

    /// Whether `topic`/`partition` is held.
    pub fn is_held(&self, topic: &str, partition: i32) -> bool {
        self.book().held.contains_key(&(topic.to_owned(), partition))
    }

    /// The partitions held, in order.
    pub fn held(&self) -> Vec<Held> {
        self.book().held.values().cloned().collect()
    }

    /// The partition left this instance (a rebalance): not held here any more; its new owner
    /// judges it again.
    pub fn release(&self, topic: &str, partition: i32) {
        let mut book = self.book();
        if let Some(held) = book.held.remove(&(topic.to_owned(), partition)) {
            self.unexport(&held);
            tracing::info!(
                stage = self.stage,
                topic,
                partition,
                "partition held at a gap left this instance"
            );
        }
        book.accepted
            .retain(|held| !(held.topic == topic && held.partition == partition));
        self.health.set_held_gaps(book.held.len());
    }

    fn unexport(&self, held: &Held) {
        let partition = held.partition.to_string();
        let _ = self
            .metric
            .remove_label_values(&[&held.topic, &partition, held.gap.cause.label()]);
    }

    /// An operator accepts the gap of `partition` (`None`: of every partition held). Returns what
    /// was accepted; the stage's loop picks it up with [`Gaps::take_accepted`].
    pub fn accept(&self, partition: Option<(&str, i32)>) -> Vec<Held> {
        let mut book = self.book();
        let keys: Vec<(String, i32)> = match partition {
            Some((topic, partition)) => vec![(topic.to_owned(), partition)],
            None => book.held.keys().cloned().collect(),
        };
        let mut accepted = Vec::new();
        for key in keys {
            if let Some(held) = book.held.remove(&key) {
                self.unexport(&held);
                tracing::warn!(
                    stage = self.stage,
                    topic = %held.topic,
                    partition = held.partition,
                    cause = held.gap.cause.label(),
                    from = held.gap.stored_next,
                    log_start = held.gap.log_start,
                    records_lost = held.gap.records_lost().unwrap_or(-1),
                    "gap ACCEPTED by an operator: the partition goes on from the topic's first offset",
                );
                accepted.push(held);
            }
        }
        book.accepted.extend(accepted.iter().cloned());
        self.health.set_held_gaps(book.held.len());
        accepted
    }

    /// The acceptances the stage's loop has not acted on yet.
    pub fn take_accepted(&self) -> Vec<Held> {
        std::mem::take(&mut self.book().accepted)
    }

    /// Whether an acceptance waits for its stage's loop (cheap: no I/O).
    pub fn any_accepted(&self) -> bool {
        !self.book().accepted.is_empty()
    }

    /// The acceptances of `topic`'s partitions not acted on yet (the others stay for their own
    /// taker).
    pub fn take_accepted_of(&self, topic: &str) -> Vec<Held> {
        let mut book = self.book();
        if book.accepted.is_empty() {
            return Vec::new();
        }
        let (taken, kept) = std::mem::take(&mut book.accepted)
            .into_iter()
            .partition(|held| held.topic == topic);
        book.accepted = kept;
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_partition_starts_at_its_stored_position_or_stops_at_a_gap() {
        assert_eq!(judge_start(None, 40, 90), Start::First(40));
        assert_eq!(judge_start(None, -1, 0), Start::First(0));
        assert_eq!(judge_start(Some(40), 40, 90), Start::At(40));
        assert_eq!(judge_start(Some(90), 40, 90), Start::At(90));
        assert_eq!(judge_start(Some(91), 40, 90), Start::PastReportedEnd(91));
        let gap = Gap {
            cause: GapCause::Retention,
            stored_next: 10,
            log_start: 40,
            log_end: 90,
        };
        assert_eq!(judge_start(Some(10), 40, 90), Start::Gap(gap));
        assert_eq!(gap.records_lost(), Some(30));
        assert_eq!(past_end(500, 0, 100).records_lost(), None);
    }

    proptest! {
        /// A stored position is never skipped silently: a partition starts at it, or at the log
        /// start when nothing was stored, or stops at a gap that starts at it; and it stops
        /// exactly when the log starts past it.
        #[test]
        fn no_stored_position_is_skipped(
            stored in proptest::option::of(0i64..1_000),
            low in 0i64..1_000,
            length in 0i64..1_000,
        ) {
            let high = low + length;
            match judge_start(stored, low, high) {
                Start::First(at) => prop_assert!(stored.is_none() && at == low),
                Start::At(at) => prop_assert!(Some(at) == stored && low <= at && at <= high),
                Start::PastReportedEnd(next) => prop_assert!(Some(next) == stored && next > high),
                Start::Gap(gap) => {
                    prop_assert_eq!(Some(gap.stored_next), stored);
                    prop_assert!(gap.stored_next < low);
                    prop_assert_eq!(gap.records_lost(), Some(low - gap.stored_next));
                }
            }
        }
    }

    fn gap() -> Gap {
        Gap {
            cause: GapCause::Retention,
            stored_next: 5,
            log_start: 9,
            log_end: 20,
        }
    }

    #[test]
    fn holding_a_gap_makes_the_stage_unready_until_every_gap_is_accepted_or_released() {
        let health = Health::new();
        health.set_ready(true);
        let gaps = Gaps::new("test-stage", health.clone());
        let registry = MetricsRegistry::new();
        gaps.register_metrics(&registry);
        gaps.hold("t", 0, gap());
        gaps.hold("t", 1, past_end(50, 0, 3));
        assert!(!health.is_ready());
        assert!(gaps.is_held("t", 1) && !gaps.is_held("t", 2));
        let text = registry.render();
        assert!(
            text.contains(r#"contrail_consumer_gap_held{cause="retention",partition="0",topic="t"} 1"#),
            "{text}"
        );
        assert_eq!(gaps.accept(Some(("t", 7))), Vec::new(), "nothing held there");
        // Found again with another cause: one series for it, the new one.
        gaps.hold("t", 0, past_end(5, 9, 20));
        let text = registry.render();
        assert!(!text.contains(r#"cause="retention",partition="0""#), "{text}");
        assert!(text.contains(r#"cause="past-end",partition="0""#), "{text}");
        gaps.hold("t", 0, gap());
        let accepted = gaps.accept(Some(("t", 0)));
        assert_eq!(accepted.len(), 1);
        assert_eq!(accepted[0].to_status().records_lost, 4);
        assert!(!health.is_ready(), "t/1 is still held");
        assert!(!registry.render().contains(r#"partition="0""#));
        gaps.release("t", 1);
        assert!(health.is_ready());
        assert_eq!(gaps.take_accepted(), accepted);
        assert!(gaps.take_accepted().is_empty());
    }

    #[test]
    fn accepting_every_gap_takes_all_and_a_second_hold_keeps_the_first_finding() {
        let gaps = Gaps::new("test-stage", Health::new());
        gaps.hold("t", 0, gap());
        let first = gaps.held();
        gaps.hold("t", 0, gap());
        assert_eq!(gaps.held(), first);
        gaps.hold("u", 3, past_end(7, 0, 0));
        let all = gaps.accept(None);
        assert_eq!(all.len(), 2);
        assert!(gaps.held().is_empty());
        assert_eq!(all[1].to_status().cause, "past-end");
        assert_eq!(all[1].to_status().records_lost, -1);
    }
}
