//! The consumer and its rebalance events: callbacks only record what happened; the archiver's
//! loop acts on it before its next record.

use std::sync::{Arc, Mutex};

use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::{ClientContext, TopicPartitionList};

/// A `(topic, partition)`.
pub(crate) type TopicPartition = (Arc<str>, i32);

/// Rebalances seen by the consumer, handled by the loop before its next record.
#[derive(Debug)]
pub(crate) enum RebalanceEvent {
    Assigned(Vec<(String, i32)>),
    Revoked(Vec<(String, i32)>),
}

/// The consumer context: records rebalances for the loop (callbacks must return quickly).
pub(crate) struct ArchiverContext {
    pub(crate) events: Arc<Mutex<Vec<RebalanceEvent>>>,
}

impl ClientContext for ArchiverContext {}

impl ConsumerContext for ArchiverContext {
    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let list = |partitions: &TopicPartitionList| {
            partitions
                .elements()
                .iter()
                .map(|element| (element.topic().to_owned(), element.partition()))
                .collect::<Vec<_>>()
        };
        let event = match rebalance {
            Rebalance::Assign(partitions) => RebalanceEvent::Assigned(list(partitions)),
            Rebalance::Revoke(partitions) => RebalanceEvent::Revoked(list(partitions)),
            Rebalance::Error(error) => {
                tracing::warn!(%error, "rebalance error");
                return;
            }
        };
        tracing::info!(?event, "rebalance");
        if let Ok(mut events) = self.events.lock() {
            events.push(event);
        }
    }
}

pub(crate) type ArchiverConsumer = StreamConsumer<ArchiverContext>;
