//! Prometheus metrics of cosmos-writer.

use contrail_common::metrics::MetricsRegistry;
use prometheus::{Counter, Histogram, IntCounter, IntCounterVec};

/// The stage's metrics.
#[derive(Clone)]
pub struct WriterMetrics {
    /// Records consumed from the curated topic.
    pub records: IntCounter,
    /// Documents created or replaced.
    pub written: IntCounter,
    /// Writes skipped because the stored version was the same or higher.
    pub stale: IntCounter,
    /// Records not written because a newer version of the flight was in the write window.
    pub coalesced: IntCounter,
    /// Records sent to the dead-letter topic.
    pub dead_letters: IntCounter,
    /// Request units charged by Cosmos DB.
    pub request_units: Counter,
    /// Retries by cause (`429`, `503`, `412`, `409`, …).
    pub retries: IntCounterVec,
    /// Latency of one guarded document write (read + replace/create, retries included).
    pub write_seconds: Histogram,
    /// Offset commits (each moves one or more partitions forward).
    pub commits: IntCounter,
}

impl WriterMetrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &MetricsRegistry) -> WriterMetrics {
        WriterMetrics {
            records: registry.counter("contrail_cosmos_writer_records_total", "Curated records consumed"),
            written: registry.counter(
                "contrail_cosmos_writer_documents_written_total",
                "Documents created or replaced in Cosmos DB",
            ),
            stale: registry.counter(
                "contrail_cosmos_writer_stale_skipped_total",
                "Writes skipped: the stored document already had the same or a higher version",
            ),
            coalesced: registry.counter(
                "contrail_cosmos_writer_coalesced_total",
                "Records not written because a newer version of the flight was in the write window",
            ),
            dead_letters: registry.counter(
                "contrail_cosmos_writer_dead_letters_total",
                "Records sent to the dead-letter topic",
            ),
            request_units: registry.float_counter(
                "contrail_cosmos_writer_request_units_total",
                "Request units charged by Cosmos DB",
            ),
            retries: registry.counter_vec(
                "contrail_cosmos_writer_retries_total",
                "Cosmos DB request retries by cause",
                &["cause"],
            ),
            write_seconds: registry.histogram(
                "contrail_cosmos_writer_write_seconds",
                "Latency of one guarded document write, retries included",
                &[
                    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                ],
            ),
            commits: registry.counter(
                "contrail_cosmos_writer_offset_commits_total",
                "Offset commits (each moves one or more partitions past records whose writes are acknowledged)",
            ),
        }
    }

    /// Retries of every cause together.
    pub fn total_retries(&self) -> f64 {
        use prometheus::core::Collector;
        self.retries
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .map(|metric| metric.get_counter().get_value())
            .sum()
    }
}
