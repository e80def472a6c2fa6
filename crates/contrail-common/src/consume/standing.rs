//! Where a consuming stage stands in each partition it owns: its next offset against the broker's
//! high watermark, for the admin `Status` and the lag metric.

use std::sync::Arc;
use std::time::Duration;

use contrail_proto::admin::v1 as admin;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::kafka::partition_lag;

/// How long one partition's high watermark may take to arrive before it counts as unknown.
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(2);

/// One partition's standing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    /// The partition's topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The next offset the stage will process (-1: none processed or stored yet).
    pub next: i64,
    /// The broker's high watermark, -1 when it did not answer.
    pub high_watermark: i64,
}

impl Standing {
    /// Records between the next offset and the high watermark; -1 when unknown
    /// ([`partition_lag`]).
    pub fn lag(&self) -> i64 {
        partition_lag(self.high_watermark, self.next)
    }

    /// The partition's row of the admin `Status`.
    pub fn to_status(&self) -> admin::PartitionStatus {
        admin::PartitionStatus {
            topic: self.topic.clone(),
            partition: self.partition,
            committed_offset: self.next,
            high_watermark: self.high_watermark,
            lag: self.lag(),
            state_bytes: 0,
        }
    }
}

/// The standing of each `(topic, partition, next offset)`, asking the broker for each high
/// watermark. Blocking: call it off the async workers ([`standings_off_runtime`]).
pub fn standings(watermarks: &BaseConsumer, positions: Vec<(String, i32, i64)>) -> Vec<Standing> {
    positions
        .into_iter()
        .map(|(topic, partition, next)| {
            let high_watermark = watermarks
                .fetch_watermarks(&topic, partition, WATERMARK_TIMEOUT)
                .map(|(_, high)| high)
                .unwrap_or(-1);
            Standing {
                topic,
                partition,
                next,
                high_watermark,
            }
        })
        .collect()
}

/// [`standings`] on tokio's blocking pool.
pub async fn standings_off_runtime(
    watermarks: Arc<BaseConsumer>,
    positions: Vec<(String, i32, i64)>,
) -> Result<Vec<Standing>, tokio::task::JoinError> {
    tokio::task::spawn_blocking(move || standings(&watermarks, positions)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_row_carries_the_lag_and_an_unknown_watermark_reads_as_unknown() {
        let standing = |next, high_watermark| Standing {
            topic: "ops.flights.curated".to_owned(),
            partition: 3,
            next,
            high_watermark,
        };
        let row = standing(40, 100).to_status();
        assert_eq!(
            (
                row.topic.as_str(),
                row.partition,
                row.committed_offset,
                row.high_watermark,
                row.lag
            ),
            ("ops.flights.curated", 3, 40, 100, 60)
        );
        assert_eq!(
            standing(-1, 100).lag(),
            100,
            "nothing processed: the whole partition"
        );
        assert_eq!(standing(40, -1).lag(), -1, "no watermark: unknown, never 0");
        assert_eq!(
            standing(140, 100).lag(),
            -1,
            "a watermark below the position: unknown"
        );
    }
}
