//! Every metric of the dedup-state stage, with stable names.

use contrail_common::metrics::MetricsRegistry;
use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

/// The dedup-state stage's metrics.
#[derive(Clone)]
pub struct DedupMetrics {
    /// Input records processed (reprocessing after a restore counts again).
    pub records: IntCounter,
    /// Verdicts: `accepted`, `duplicate`, `late`, `late_expired`, `invalid`, `implausible`,
    /// `state_too_large` (the last three are dead-lettered).
    pub verdicts: IntCounterVec,
    /// User timers fired, by kind.
    pub timers_fired: IntCounter,
    /// Alerts emitted, by state: `firing`, `resolved` (reprocessing after a restore counts again).
    pub alerts: IntCounterVec,
    /// State entries evicted by TTL (values and dedup entries).
    pub evicted: IntCounter,
    /// Micro-batches committed (one RocksDB write batch each per shard).
    pub commits: IntCounter,
    /// Time to process and commit a micro-batch of one shard.
    pub commit_seconds: Histogram,
    /// Age of each input record when its batch is processed: now − the record's broker timestamp
    /// (freshness; includes the broker's and the consumer's delays).
    pub record_age_seconds: Histogram,
    /// Outputs committed to the outbox and not yet acknowledged by the broker.
    pub outbox_pending: IntGauge,
    /// Outputs re-sent (after a restart, or after a failed delivery).
    pub outputs_resent: IntCounter,
    /// Approximate RocksDB bytes per shard.
    pub state_bytes: IntGaugeVec,
    /// Next input offset per shard.
    pub shard_offset: IntGaugeVec,
    /// Checkpoint rounds, by outcome (`complete`, `incomplete`, `failed`).
    pub checkpoints: IntCounterVec,
    /// Time of a checkpoint round (barrier to manifest).
    pub checkpoint_seconds: Histogram,
    /// Time the processing thread is stopped for a checkpoint round: it only hands out a
    /// checkpoint handle per shard (the RocksDB checkpoints and the upload run beside processing).
    pub checkpoint_pause_seconds: Histogram,
    /// The RocksDB checkpoints of a round, taken off the processing thread.
    pub checkpoint_local_seconds: Histogram,
    /// Shards restored from the checkpoint store.
    pub restores: IntCounter,
}

impl DedupMetrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &MetricsRegistry) -> DedupMetrics {
        let metrics = DedupMetrics {
            records: registry.counter("contrail_dedup_records_total", "Input records processed"),
            verdicts: registry.counter_vec(
                "contrail_dedup_events_total",
                "Events by verdict: accepted, duplicate, late, late_expired, invalid, implausible, flight_full, state_too_large",
                &["verdict"],
            ),
            timers_fired: registry.counter("contrail_dedup_timers_fired_total", "User timers fired"),
            alerts: registry.counter_vec(
                "contrail_dedup_alerts_total",
                "Alerts emitted to the alerts topic, by state: firing, resolved",
                &["state"],
            ),
            evicted: registry.counter("contrail_dedup_evicted_total", "State entries evicted by TTL"),
            commits: registry.counter(
                "contrail_dedup_commits_total",
                "Micro-batches committed per shard",
            ),
            commit_seconds: registry.histogram(
                "contrail_dedup_commit_seconds",
                "Process + commit time of one shard batch",
                &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0],
            ),
            record_age_seconds: registry.histogram(
                "contrail_dedup_record_age_seconds",
                "Age of an input record when processed (now - its broker timestamp)",
                &[
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                ],
            ),
            outbox_pending: registry.gauge(
                "contrail_dedup_outbox_pending",
                "Outputs committed but not yet acknowledged by the broker",
            ),
            outputs_resent: registry.counter(
                "contrail_dedup_outputs_resent_total",
                "Outputs re-sent from the outbox",
            ),
            state_bytes: registry.gauge_vec(
                "contrail_dedup_state_bytes",
                "Approximate RocksDB bytes per shard",
                &["partition"],
            ),
            shard_offset: registry.gauge_vec(
                "contrail_dedup_shard_next_offset",
                "Next input offset per shard",
                &["partition"],
            ),
            checkpoints: registry.counter_vec(
                "contrail_dedup_checkpoints_total",
                "Checkpoint rounds by outcome",
                &["outcome"],
            ),
            checkpoint_seconds: registry.histogram(
                "contrail_dedup_checkpoint_seconds",
                "Checkpoint round duration",
                &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0],
            ),
            checkpoint_pause_seconds: registry.histogram(
                "contrail_dedup_checkpoint_pause_seconds",
                "Processing stopped for a checkpoint round (to hand out the shards' checkpoint handles)",
                &[0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5],
            ),
            checkpoint_local_seconds: registry.histogram(
                "contrail_dedup_checkpoint_local_seconds",
                "RocksDB checkpoints of a round's shards (memtable flush, file syncs), taken while processing goes on",
                &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0],
            ),
            restores: registry.counter(
                "contrail_dedup_restores_total",
                "Shards restored from the checkpoint store",
            ),
        };
        // Every outcome exists from the start at 0, so "no complete checkpoint in 15 minutes"
        // (the checkpoint alert's `increase`) also holds for a stage that never completed one.
        for outcome in ["complete", "incomplete", "failed"] {
            metrics.checkpoints.with_label_values(&[outcome]);
        }
        for state in ["firing", "resolved"] {
            metrics.alerts.with_label_values(&[state]);
        }
        metrics
    }
}
