//! Prometheus metrics of changefeed-sync.

use contrail_common::metrics::MetricsRegistry;
use prometheus::{GaugeVec, Histogram, HistogramOpts, IntCounter, IntGauge, Opts};

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
        let counter = |name: &str, help: &str| {
            let counter = IntCounter::new(name, help).expect("valid metric");
            registry.register(&counter);
            counter
        };
        let gauge = |name: &str, help: &str| {
            let gauge = GaugeVec::new(Opts::new(name, help), &["lease"]).expect("valid metric");
            registry.register(&gauge);
            gauge
        };
        let owned = IntGauge::new(
            "contrail_changefeed_leases_owned",
            "Leases owned by this instance",
        )
        .expect("valid metric");
        registry.register(&owned);
        let publish_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "contrail_changefeed_publish_seconds",
                "Time from reading a change feed page to the broker acknowledging all of it",
            )
            .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
        )
        .expect("valid metric");
        registry.register(&publish_seconds);
        ChangefeedMetrics {
            published: counter(
                "contrail_changefeed_changes_published_total",
                "Changes published to the change topic",
            ),
            pages: counter("contrail_changefeed_pages_total", "Change feed pages read"),
            missing_lsn: counter("contrail_changefeed_missing_lsn_total", "Changes without _lsn"),
            acquired: counter(
                "contrail_changefeed_leases_acquired_total",
                "Leases acquired or taken over",
            ),
            lost: counter(
                "contrail_changefeed_leases_lost_total",
                "Leases lost to another instance",
            ),
            owned,
            lag_seconds: gauge(
                "contrail_changefeed_lag_seconds",
                "Estimated lag per lease: now minus _ts of the last change published (0 when caught up)",
            ),
            last_lsn: gauge(
                "contrail_changefeed_last_lsn",
                "_lsn of the last change published per lease",
            ),
            publish_seconds,
        }
    }
}
