//! Prometheus metrics of changefeed-sync.

use contrail_common::metrics::MetricsRegistry;
use prometheus::{GaugeVec, Histogram, IntCounter, IntGauge};

/// The stage's metrics.
#[derive(Clone)]
pub struct ChangefeedMetrics {
    /// Changes published (broker-acknowledged).
    pub published: IntCounter,
    /// Change feed pages read (empty ones included).
    pub pages: IntCounter,
    /// Changes without `_lsn` (published with lsn 0).
    pub missing_lsn: IntCounter,
    /// Leases acquired (including takeovers).
    pub acquired: IntCounter,
    /// Leases lost to another instance.
    pub lost: IntCounter,
    /// Leases owned now.
    pub owned: IntGauge,
    /// Leases superseded because the monitored container was replaced.
    pub superseded: IntCounter,
    /// Per lease: estimated lag in seconds (now − `_ts` of the last change published; 0 caught up).
    pub lag_seconds: GaugeVec,
    /// Per lease: `_lsn` of the last change published.
    pub last_lsn: GaugeVec,
    /// Time from reading a page to the broker acknowledging all of it.
    pub publish_seconds: Histogram,
}

impl ChangefeedMetrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &MetricsRegistry) -> ChangefeedMetrics {
        ChangefeedMetrics {
            published: registry.counter(
                "contrail_changefeed_changes_published_total",
                "Changes published to the change topic",
            ),
            pages: registry.counter("contrail_changefeed_pages_total", "Change feed pages read"),
            missing_lsn: registry.counter("contrail_changefeed_missing_lsn_total", "Changes without _lsn"),
            acquired: registry.counter(
                "contrail_changefeed_leases_acquired_total",
                "Leases acquired or taken over",
            ),
            lost: registry.counter(
                "contrail_changefeed_leases_lost_total",
                "Leases lost to another instance",
            ),
            superseded: registry.counter(
                "contrail_changefeed_leases_superseded_total",
                "Leases of a replaced container (deleted and created again) superseded by leases of the new one",
            ),
            owned: registry.gauge(
                "contrail_changefeed_leases_owned",
                "Leases owned by this instance",
            ),
            lag_seconds: registry.float_gauge_vec(
                "contrail_changefeed_lag_seconds",
                "Estimated lag per lease: now minus _ts of the last change published (0 when caught up)",
                &["lease"],
            ),
            last_lsn: registry.float_gauge_vec(
                "contrail_changefeed_last_lsn",
                "_lsn of the last change published per lease",
                &["lease"],
            ),
            publish_seconds: registry.histogram(
                "contrail_changefeed_publish_seconds",
                "Time from reading a change feed page to the broker acknowledging all of it",
                &[0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0],
            ),
        }
    }
}
