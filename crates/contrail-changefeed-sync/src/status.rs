//! What changefeed-sync reports in the admin `Status`: its leases (owner, last `_lsn`, lag) and
//! counters.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use contrail_common::admin::{AdminControls, StageStatus};
use contrail_proto::admin::v1 as admin;

use crate::metrics::ChangefeedMetrics;

/// What the admin API shows of each lease.
pub(crate) type LeaseBoard = Arc<Mutex<BTreeMap<String, admin::LeaseStatus>>>;

pub(crate) struct SyncStatus {
    pub(crate) instance: String,
    pub(crate) board: LeaseBoard,
    pub(crate) metrics: ChangefeedMetrics,
    /// Uptime (and the fields every stage stamps on its status).
    pub(crate) uptime: AdminControls,
}

#[tonic::async_trait]
impl StageStatus for SyncStatus {
    async fn status(&self) -> Result<admin::StatusResponse, tonic::Status> {
        let leases: Vec<admin::LeaseStatus> = self
            .board
            .lock()
            .map(|board| board.values().cloned().collect())
            .unwrap_or_default();
        let m = &self.metrics;
        let counters = [
            ("changes_published_total", m.published.get() as f64),
            ("pages_total", m.pages.get() as f64),
            ("leases_owned", m.owned.get() as f64),
            ("leases_acquired_total", m.acquired.get() as f64),
            ("leases_lost_total", m.lost.get() as f64),
            ("missing_lsn_total", m.missing_lsn.get() as f64),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        let uptime = self.uptime.uptime_seconds();
        Ok(admin::StatusResponse {
            instance: self.instance.clone(),
            uptime_seconds: uptime as i64,
            counters,
            events_per_second: m.published.get() as f64 / uptime,
            leases,
            ..admin::StatusResponse::default()
        })
    }
}
