//! Where the archiver stands: the next offset per partition as committed to Delta, the lag
//! behind the high watermarks (a metric, refreshed every 10 s) and the admin `Status`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use contrail_common::admin::{AdminControls, StageStatus};
use contrail_common::consume::{Standing, standings_off_runtime};
use contrail_common::shutdown::Shutdown;
use contrail_history::Table;
use contrail_proto::admin::v1 as admin;
use rdkafka::consumer::BaseConsumer;

use crate::metrics::ArchiverMetrics;

/// Next offset to archive per partition, as last committed to Delta (for status and lag).
pub(crate) type Positions = Arc<Mutex<BTreeMap<(String, i32), i64>>>;

/// The `(topic, partition, next offset committed to Delta)` of every partition this instance has a
/// position for.
fn positions_now(positions: &Positions) -> Vec<(String, i32, i64)> {
    positions
        .lock()
        .map(|positions| {
            positions
                .iter()
                .map(|((topic, partition), next)| (topic.clone(), *partition, *next))
                .collect()
        })
        .unwrap_or_default()
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
        let standings = standings_off_runtime(watermarks.clone(), positions_now(&positions))
            .await
            .unwrap_or_default();
        for standing in standings {
            metrics
                .lag
                .with_label_values(&[standing.topic.as_str(), standing.partition.to_string().as_str()])
                .set(standing.lag());
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
        let partitions = standings_off_runtime(self.watermarks.clone(), positions_now(&self.positions))
            .await
            .map_err(|error| tonic::Status::internal(error.to_string()))?
            .iter()
            .map(Standing::to_status)
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
