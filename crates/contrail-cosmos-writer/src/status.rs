//! What cosmos-writer reports in the admin `Status`: owned partitions with committed offsets,
//! high watermarks and lag, and its counters.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use contrail_common::admin::{AdminControls, StageStatus};
use contrail_common::consume::{RecordingConsumer, Standing, standings_off_runtime};
use contrail_proto::admin::v1 as admin;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::metrics::WriterMetrics;

/// Offsets committed by this instance (next offset to read, per partition).
pub(crate) type Committed = Arc<Mutex<BTreeMap<i32, i64>>>;

pub(crate) struct WriterStatus {
    pub(crate) instance: String,
    pub(crate) topic: String,
    pub(crate) consumer: Arc<RecordingConsumer>,
    pub(crate) watermarks: Arc<BaseConsumer>,
    pub(crate) committed: Committed,
    pub(crate) metrics: WriterMetrics,
    /// Uptime (and the fields every stage stamps on its status).
    pub(crate) uptime: AdminControls,
}

#[tonic::async_trait]
impl StageStatus for WriterStatus {
    async fn status(&self) -> Result<admin::StatusResponse, tonic::Status> {
        let owned: Vec<i32> = self
            .consumer
            .assignment()
            .map(|list| {
                list.elements()
                    .iter()
                    .map(|element| element.partition())
                    .collect()
            })
            .unwrap_or_default();
        let committed = self
            .committed
            .lock()
            .map(|committed| committed.clone())
            .unwrap_or_default();
        let positions = owned
            .into_iter()
            .map(|partition| {
                let next = committed.get(&partition).copied().unwrap_or(-1);
                (self.topic.clone(), partition, next)
            })
            .collect();
        let partitions = standings_off_runtime(self.watermarks.clone(), positions)
            .await
            .map_err(|error| tonic::Status::internal(error.to_string()))?
            .iter()
            .map(Standing::to_status)
            .collect();
        let m = &self.metrics;
        let counters = [
            ("records_total", m.records.get() as f64),
            ("documents_written_total", m.written.get() as f64),
            ("stale_skipped_total", m.stale.get() as f64),
            ("coalesced_total", m.coalesced.get() as f64),
            ("dead_letters_total", m.dead_letters.get() as f64),
            ("request_units_total", m.writes.request_units.get()),
            ("offset_commits_total", m.commits.get() as f64),
            ("retries_total", m.writes.total_retries()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        let uptime = self.uptime.uptime_seconds();
        Ok(admin::StatusResponse {
            instance: self.instance.clone(),
            uptime_seconds: uptime as i64,
            partitions,
            counters,
            events_per_second: m.records.get() as f64 / uptime,
            ..admin::StatusResponse::default()
        })
    }
}
