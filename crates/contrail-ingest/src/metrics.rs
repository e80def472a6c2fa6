//! Every metric of the ingest stage, with stable names.

use contrail_common::metrics::MetricsRegistry;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts};

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
        let counter = |name: &str, help: &str, label: &str| {
            IntCounterVec::new(Opts::new(name, help), &[label]).expect("static metric definition")
        };
        let metrics = IngestMetrics {
            records_received: counter(
                "contrail_ingest_records_received_total",
                "Records received",
                "origin",
            ),
            events_accepted: counter(
                "contrail_ingest_events_accepted_total",
                "Events acknowledged by the broker on the raw topic",
                "origin",
            ),
            records_rejected: counter(
                "contrail_ingest_records_rejected_total",
                "Records rejected by validation and sent to the dead-letter topic",
                "origin",
            ),
            records_failed: counter(
                "contrail_ingest_records_failed_total",
                "Valid records the broker did not acknowledge in time",
                "origin",
            ),
            requests_throttled: counter(
                "contrail_ingest_requests_throttled_total",
                "Requests refused with 429 for capacity",
                "origin",
            ),
            in_flight_records: IntGauge::new(
                "contrail_ingest_in_flight_records",
                "Records waiting for broker acknowledgement",
            )
            .expect("static metric definition"),
            publish_latency: Histogram::with_opts(
                HistogramOpts::new(
                    "contrail_ingest_publish_latency_seconds",
                    "Time from receiving a batch to the broker acknowledging all of it",
                )
                .buckets(vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ]),
            )
            .expect("static metric definition"),
            source_pages: counter(
                "contrail_ingest_source_pages_total",
                "Pages fetched by pull sources",
                "source",
            ),
            source_errors: counter(
                "contrail_ingest_source_errors_total",
                "Pull-source fetch errors",
                "source",
            ),
        };
        registry.register(&metrics.records_received);
        registry.register(&metrics.events_accepted);
        registry.register(&metrics.records_rejected);
        registry.register(&metrics.records_failed);
        registry.register(&metrics.requests_throttled);
        registry.register(&metrics.in_flight_records);
        registry.register(&metrics.publish_latency);
        registry.register(&metrics.source_pages);
        registry.register(&metrics.source_errors);
        metrics
    }
}
