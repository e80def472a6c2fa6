//! Rebalances as events for a consuming loop. librdkafka calls the rebalance callbacks on its own
//! thread and they must return quickly, so the context only records what happened; the loop takes
//! the events ([`Rebalances::take`]) before it handles its next record and acts on them there.

use std::sync::{Arc, Mutex};

use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::{ClientContext, TopicPartitionList};

/// A `(topic, partition)`, cheap to clone as a map key.
pub type TopicPartition = (Arc<str>, i32);

/// What the group coordinator did to this consumer's partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebalanceEvent {
    /// These `(topic, partition)`s are now this consumer's.
    Assigned(Vec<(String, i32)>),
    /// These are not any more.
    Revoked(Vec<(String, i32)>),
}

/// The rebalances recorded so far and not yet taken, shared by the context and the loop.
#[derive(Debug, Clone, Default)]
pub struct Rebalances(Arc<Mutex<Vec<RebalanceEvent>>>);

impl Rebalances {
    /// Every event recorded since the last call, oldest first.
    pub fn take(&self) -> Vec<RebalanceEvent> {
        match self.0.lock() {
            Ok(mut events) => std::mem::take(&mut *events),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        }
    }

    fn record(&self, event: RebalanceEvent) {
        match self.0.lock() {
            Ok(mut events) => events.push(event),
            Err(poisoned) => poisoned.into_inner().push(event),
        }
    }
}

/// The consumer context that records rebalances for the loop.
pub struct RecordingContext {
    rebalances: Rebalances,
    pause_assigned: bool,
}

impl RecordingContext {
    /// A context recording into `rebalances` (keep a clone to take the events from).
    pub fn new(rebalances: Rebalances) -> Self {
        Self {
            rebalances,
            pause_assigned: false,
        }
    }

    /// Like [`RecordingContext::new`], and every partition assigned is paused before a record of
    /// it is fetched: the loop judges where it starts first ([`super::GapWatch::check_assigned`]
    /// resumes or holds it), so librdkafka never resets a stored position the topic no longer has.
    pub fn pausing(rebalances: Rebalances) -> Self {
        Self {
            rebalances,
            pause_assigned: true,
        }
    }
}

impl ClientContext for RecordingContext {}

impl ConsumerContext for RecordingContext {
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let event = match rebalance {
            Rebalance::Assign(partitions) => {
                if self.pause_assigned
                    && partitions.count() > 0
                    && let Err(error) = rdkafka::consumer::Consumer::pause(consumer, partitions)
                {
                    tracing::error!(%error, "pausing the partitions just assigned");
                }
                RebalanceEvent::Assigned(listed(partitions))
            }
            Rebalance::Revoke(partitions) => RebalanceEvent::Revoked(listed(partitions)),
            Rebalance::Error(error) => {
                tracing::warn!(%error, "rebalance error");
                return;
            }
        };
        tracing::info!(?event, "rebalance");
        self.rebalances.record(event);
    }
}

/// A group consumer whose rebalances the loop takes from a [`Rebalances`].
pub type RecordingConsumer = StreamConsumer<RecordingContext>;

fn listed(partitions: &TopicPartitionList) -> Vec<(String, i32)> {
    partitions
        .elements()
        .iter()
        .map(|element| (element.topic().to_owned(), element.partition()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_taken_once_in_the_order_they_were_recorded() {
        let rebalances = Rebalances::default();
        let recorder = rebalances.clone();
        recorder.record(RebalanceEvent::Assigned(vec![
            ("a".to_owned(), 0),
            ("a".to_owned(), 1),
        ]));
        recorder.record(RebalanceEvent::Revoked(vec![("a".to_owned(), 1)]));
        assert_eq!(
            rebalances.take(),
            vec![
                RebalanceEvent::Assigned(vec![("a".to_owned(), 0), ("a".to_owned(), 1)]),
                RebalanceEvent::Revoked(vec![("a".to_owned(), 1)]),
            ]
        );
        assert!(rebalances.take().is_empty(), "taken events are gone");
    }
}
