//! Prometheus metrics of delta-archiver. Per-table series carry a `table` label.

use contrail_common::metrics::MetricsRegistry;
use prometheus::{HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

/// The stage's metrics.
#[derive(Clone)]
pub struct ArchiverMetrics {
    /// Records consumed, by table.
    pub records: IntCounterVec,
    /// Rows committed, by table.
    pub rows: IntCounterVec,
    /// Records dropped as redeliveries of an identity already archived, by table.
    pub duplicates: IntCounterVec,
    /// Records sent to the dead-letter topic, by table.
    pub dead_letters: IntCounterVec,
    /// Delta commits, by table.
    pub commits: IntCounterVec,
    /// Parquet files committed, by table.
    pub files: IntCounterVec,
    /// Parquet bytes committed, by table.
    pub bytes: IntCounterVec,
    /// Commits refused because another instance committed for the partition first (zombie fence).
    pub fenced: IntCounterVec,
    /// Latency of a table's flush + commit.
    pub commit_seconds: HistogramVec,
    /// Batches, by what triggered the commit.
    pub batches: IntCounterVec,
    /// Files written but not yet committed (non-zero only inside the flush → commit window).
    pub uncommitted_files: IntGauge,
    /// Lag per partition (high watermark − next offset), by topic and partition.
    pub lag: IntGaugeVec,
    /// Maintenance runs: files compacted away, files vacuumed.
    pub compacted_files: IntCounter,
    /// Files removed by vacuum.
    pub vacuumed_files: IntCounter,
}

impl ArchiverMetrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &MetricsRegistry) -> ArchiverMetrics {
        let by_table = |name: &str, help: &str| registry.counter_vec(name, help, &["table"]);
        let metrics = ArchiverMetrics {
            records: by_table("contrail_delta_records_total", "Records consumed"),
            rows: by_table("contrail_delta_rows_total", "Rows committed to Delta tables"),
            duplicates: by_table(
                "contrail_delta_duplicates_total",
                "Redelivered records dropped: their identity is already archived",
            ),
            dead_letters: by_table(
                "contrail_delta_dead_letters_total",
                "Records sent to the dead-letter topic",
            ),
            commits: by_table("contrail_delta_commits_total", "Delta commits"),
            files: by_table("contrail_delta_files_total", "Parquet files committed"),
            bytes: by_table("contrail_delta_bytes_total", "Parquet bytes committed"),
            fenced: by_table(
                "contrail_delta_fenced_total",
                "Partition commits refused: another instance had committed for it (zombie fence)",
            ),
            commit_seconds: registry.histogram_vec(
                "contrail_delta_commit_seconds",
                "Latency of one table's Parquet flush and Delta commit",
                &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0],
                &["table"],
            ),
            batches: registry.counter_vec(
                "contrail_delta_batches_total",
                "Batches committed, by trigger",
                &["reason"],
            ),
            uncommitted_files: registry.gauge(
                "contrail_delta_uncommitted_files",
                "Parquet files written whose commit is pending",
            ),
            lag: registry.gauge_vec(
                "contrail_delta_lag_records",
                "Records not yet archived (high watermark - next offset; -1 when unknown)",
                &["topic", "partition"],
            ),
            compacted_files: registry.counter(
                "contrail_delta_compacted_files_total",
                "Small files replaced by compaction",
            ),
            vacuumed_files: registry
                .counter("contrail_delta_vacuumed_files_total", "Files removed by vacuum"),
        };
        // Every table's commit counter exists from the start at 0: the stalled-commits alert
        // (`increase` over it) then also fires for an archiver that never committed.
        for table in contrail_history::Table::ALL {
            metrics.commits.with_label_values(&[table.name()]);
        }
        metrics
    }
}
