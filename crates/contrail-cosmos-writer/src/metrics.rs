//! Prometheus metrics of cosmos-writer.

use contrail_common::metrics::MetricsRegistry;
use contrail_cosmos::writer::WriteMetrics;
use prometheus::IntCounter;

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
    /// The guarded writes: request units, retries by cause, latency.
    pub writes: WriteMetrics,
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
            writes: WriteMetrics::new(
                registry,
                [
                    "contrail_cosmos_writer_request_units_total",
                    "contrail_cosmos_writer_retries_total",
                    "contrail_cosmos_writer_write_seconds",
                ],
            ),
            commits: registry.counter(
                "contrail_cosmos_writer_offset_commits_total",
                "Offset commits (each moves one or more partitions past records whose writes are acknowledged)",
            ),
        }
    }
}
