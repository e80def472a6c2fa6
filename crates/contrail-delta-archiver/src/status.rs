//! Where the archiver stands: the next offset per partition as committed to Delta, the lag
//! behind the high watermarks (a metric, refreshed every 10 s) and the admin `Status`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use contrail_common::admin::{AdminControls, StageStatus};
use contrail_common::shutdown::Shutdown;
use contrail_history::Table;
use contrail_proto::admin::v1 as admin;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::metrics::ArchiverMetrics;

/// Next offset to archive per partition, as last committed to Delta (for status and lag).
pub(crate) type Positions = Arc<Mutex<BTreeMap<(String, i32), i64>>>;

/// `(topic, partition, next offset committed to Delta, high watermark or -1)` of every partition
/// this instance has a position for. Blocking (asks the broker): call off the async workers.
fn partition_positions(watermarks: &BaseConsumer, positions: &Positions) -> Vec<(String, i32, i64, i64)> {
    let snapshot: Vec<((String, i32), i64)> = positions
        .lock()
        .map(|positions| positions.iter().map(|(k, v)| (k.clone(), *v)).collect())
        .unwrap_or_default();
    snapshot
        .into_iter()
        .map(|((topic, partition), next)| {
            let high = watermarks
                .fetch_watermarks(&topic, partition, Duration::from_secs(2))
                .map(|(_, high)| high)
                .unwrap_or(-1);
            (topic, partition, next, high)
        })
        .collect()
}

/// Refreshes the lag metric every 10 s until the shutdown.
pub(crate) async fn update_lag(
    watermarks: Arc<BaseConsumer>,
    positions: Positions,
    metrics: ArchiverMetrics,
    shutdown: Shutdown,
) {
    loop {
        tokio::select! {
            () = shutdown.triggered() => return,
            () = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
        let (watermarks, positions) = (watermarks.clone(), positions.clone());
        let lags = tokio::task::spawn_blocking(move || partition_positions(&watermarks, &positions))
            .await
            .unwrap_or_default();
        for (topic, partition, next, high) in lags {
            let lag = contrail_common::kafka::partition_lag(high, next);
            metrics
                .lag
                .with_label_values(&[topic.as_str(), partition.to_string().as_str()])
                .set(lag);
        }
    }
}

/// The admin `Status` of delta-archiver.
pub(crate) struct ArchiverStatus {
    pub(crate) instance: String,
    pub(crate) watermarks: Arc<BaseConsumer>,
    pub(crate) positions: Positions,
    pub(crate) metrics: ArchiverMetrics,
    /// Uptime (and the fields every stage stamps on its status).
    pub(crate) uptime: AdminControls,
}

#[tonic::async_trait]
impl StageStatus for ArchiverStatus {
    async fn status(&self) -> Result<admin::StatusResponse, tonic::Status> {
        let (watermarks, positions) = (self.watermarks.clone(), self.positions.clone());
        let partitions = tokio::task::spawn_blocking(move || partition_positions(&watermarks, &positions))
            .await
            .map_err(|error| tonic::Status::internal(error.to_string()))?
            .into_iter()
            .map(|(topic, partition, next, high)| admin::PartitionStatus {
                topic,
                partition,
                committed_offset: next,
                high_watermark: high,
                lag: contrail_common::kafka::partition_lag(high, next),
                state_bytes: 0,
            })
            .collect();
        let m = &self.metrics;
        let sum = |vec: &prometheus::IntCounterVec| -> f64 {
            Table::ALL
                .iter()
                .map(|table| vec.with_label_values(&[table.name()]).get() as f64)
                .sum()
        };
        let mut counters: HashMap<String, f64> = [
            ("records_total", sum(&m.records)),
            ("rows_total", sum(&m.rows)),
            ("duplicates_total", sum(&m.duplicates)),
            ("dead_letters_total", sum(&m.dead_letters)),
            ("commits_total", sum(&m.commits)),
            ("files_total", sum(&m.files)),
            ("bytes_total", sum(&m.bytes)),
            ("fenced_total", sum(&m.fenced)),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        for table in Table::ALL {
            counters.insert(
                format!("{}_rows_total", table.name()),
                m.rows.with_label_values(&[table.name()]).get() as f64,
            );
        }
        let uptime = self.uptime.uptime_seconds();
        Ok(admin::StatusResponse {
            instance: self.instance.clone(),
            uptime_seconds: uptime as i64,
            partitions,
            events_per_second: sum(&m.records) / uptime,
            counters,
            ..admin::StatusResponse::default()
        })
    }
}
