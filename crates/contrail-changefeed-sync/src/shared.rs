//! What every lease task shares, and how a task shows its lease on the admin board and metrics.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use contrail_common::shutdown::Shutdown;
use contrail_proto::admin::v1 as admin;
use rdkafka::producer::FutureProducer;

use crate::config::ChangefeedSyncConfig;
use crate::lease::{Lease, LeaseStore, now_ms};
use crate::metrics::ChangefeedMetrics;
use crate::status::LeaseBoard;

/// What every lease task shares.
pub(crate) struct Shared {
    pub(crate) config: ChangefeedSyncConfig,
    pub(crate) store: LeaseStore,
    pub(crate) producer: FutureProducer,
    pub(crate) metrics: ChangefeedMetrics,
    pub(crate) board: LeaseBoard,
    pub(crate) paused: Arc<AtomicBool>,
    /// Lease tasks are spawned through it, so the process shutdown waits for them.
    pub(crate) tasks: Shutdown,
    /// Refused Cosmos DB credentials: readiness and the error log.
    pub(crate) outage: contrail_cosmos::CredentialOutage,
}

pub(crate) fn update_board(shared: &Shared, lease: &Lease, lag_seconds: f64) {
    shared
        .metrics
        .lag_seconds
        .with_label_values(&[&lease.id])
        .set(lag_seconds);
    shared
        .metrics
        .last_lsn
        .with_label_values(&[&lease.id])
        .set(lease.last_lsn as f64);
    if let Ok(mut board) = shared.board.lock() {
        show(&mut board, lease, lease.owner.clone(), Some(lag_seconds));
    }
}

/// Puts `lease` on the admin board with `owner` (empty: free); `lag_seconds` when known.
pub(crate) fn show(
    board: &mut BTreeMap<String, admin::LeaseStatus>,
    lease: &Lease,
    owner: String,
    lag_seconds: Option<f64>,
) {
    let entry = board.entry(lease.id.clone()).or_default();
    entry.feed_range = lease.feed_range.clone();
    entry.owner = owner;
    entry.last_lsn = lease.last_lsn;
    entry.last_ts = lease.last_ts;
    entry.renewed_ms_ago = now_ms().saturating_sub(lease.renewed_at_ms);
    entry.changes_published = lease.published;
    if let Some(lag) = lag_seconds {
        entry.lag_seconds = lag;
    }
}
