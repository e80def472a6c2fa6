//! Every metric of the ingest stage, with stable names.

use contrail_common::metrics::MetricsRegistry;
use prometheus::{Histogram, IntCounterVec, IntGauge};

/// The ingest stage's metrics.
#[derive(Clone)]
pub struct IngestMetrics {
    /// Records received, by origin (`http`, `grpc`, `source`).
    pub records_received: IntCounterVec,
    /// Records acknowledged by the broker on the raw topic.
    pub events_accepted: IntCounterVec,
    /// Records rejected by validation (and sent to the DLQ).
    pub records_rejected: IntCounterVec,
    /// Valid records the broker did not acknowledge in time.
    pub records_failed: IntCounterVec,
    /// Requests refused for capacity (429).
    pub requests_throttled: IntCounterVec,
    /// Records waiting for broker acknowledgement.
    pub in_flight_records: IntGauge,
    /// Time from receiving a batch to the broker acknowledging all of it.
    pub publish_latency: Histogram,
    /// Pages fetched by pull sources, by source.
    pub source_pages: IntCounterVec,
    /// Pull-source fetch errors, by source.
    pub source_errors: IntCounterVec,
}

impl IngestMetrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &MetricsRegistry) -> IngestMetrics {
        let by = |name: &str, help: &str, label: &str| registry.counter_vec(name, help, &[label]);
        IngestMetrics {
            records_received: by(
                "contrail_ingest_records_received_total",
                "Records received",
                "origin",
            ),
            events_accepted: by(
                "contrail_ingest_events_accepted_total",
                "Events acknowledged by the broker on the raw topic",
                "origin",
            ),
            records_rejected: by(
                "contrail_ingest_records_rejected_total",
                "Records rejected by validation and sent to the dead-letter topic",
                "origin",
            ),
            records_failed: by(
                "contrail_ingest_records_failed_total",
                "Valid records the broker did not acknowledge in time",
                "origin",
            ),
            requests_throttled: by(
                "contrail_ingest_requests_throttled_total",
                "Requests refused with 429 for capacity",
                "origin",
            ),
            in_flight_records: registry.gauge(
                "contrail_ingest_in_flight_records",
                "Records waiting for broker acknowledgement",
            ),
            publish_latency: registry.histogram(
                "contrail_ingest_publish_latency_seconds",
                "Time from receiving a batch to the broker acknowledging all of it",
                &[
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ],
            ),
            source_pages: by(
                "contrail_ingest_source_pages_total",
                "Pages fetched by pull sources",
                "source",
            ),
            source_errors: by(
                "contrail_ingest_source_errors_total",
                "Pull-source fetch errors",
                "source",
            ),
        }
    }
}
