//! Where each partition stands, and when a batch is committed (pure, I/O-free).
//!
//! The Delta table — not the consumer group — is the record of progress: every commit carries a
//! `txn` action per `(table, topic, partition)` whose version is the last offset written
//! (docs/CONTRACT.md, "History commits"). A partition newly assigned to this instance resumes at
//! that version + 1.

use std::time::Duration;

/// Whether the commit of a partition may go ahead: the table must still hold the version this
/// instance resumed from (or last committed). Anything else means another instance committed for
/// this partition since — this one is a zombie for it and must drop its buffered rows.
pub fn fence_holds(expected: Option<i64>, stored: Option<i64>) -> bool {
    expected == stored
}

/// Why a batch is committed now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushReason {
    /// `batch.max_rows` reached.
    Rows,
    /// `batch.max_bytes` reached.
    Bytes,
    /// `batch.max_latency_ms` elapsed since the batch's first record.
    Latency,
    /// The stage is stopping (SIGTERM): the batch in flight is committed before it exits.
    Stopping,
    /// A partition held at a gap while it was read goes on after the gap was accepted: what it
    /// took before the gap is committed first.
    Gap,
}

impl FlushReason {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            FlushReason::Rows => "rows",
            FlushReason::Bytes => "bytes",
            FlushReason::Latency => "latency",
            FlushReason::Stopping => "stopping",
            FlushReason::Gap => "gap",
        }
    }
}

/// Thresholds of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Records (rows, duplicates and dead letters) per batch.
    pub max_rows: usize,
    /// Record bytes per batch.
    pub max_bytes: usize,
    /// Age of the oldest record of the batch.
    pub max_latency: Duration,
}

/// Whether a batch of `records` records and `bytes` bytes whose first record arrived `age` ago
/// must be committed now.
pub fn flush_due(
    thresholds: &Thresholds,
    records: usize,
    bytes: usize,
    age: Duration,
) -> Option<FlushReason> {
    if records == 0 {
        None
    } else if records >= thresholds.max_rows {
        Some(FlushReason::Rows)
    } else if bytes >= thresholds.max_bytes {
        Some(FlushReason::Bytes)
    } else if age >= thresholds.max_latency {
        Some(FlushReason::Latency)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn app_ids_follow_the_contract() {
        assert_eq!(
            contrail_history::Table::Events.app_id("ops.events.accepted", 3),
            "events-ops.events.accepted-3"
        );
    }

    #[test]
    fn flushes_on_the_first_threshold_reached() {
        let thresholds = Thresholds {
            max_rows: 10,
            max_bytes: 100,
            max_latency: Duration::from_secs(1),
        };
        assert_eq!(flush_due(&thresholds, 0, 1000, Duration::from_secs(9)), None);
        assert_eq!(
            flush_due(&thresholds, 10, 0, Duration::ZERO),
            Some(FlushReason::Rows)
        );
        assert_eq!(
            flush_due(&thresholds, 1, 100, Duration::ZERO),
            Some(FlushReason::Bytes)
        );
        assert_eq!(
            flush_due(&thresholds, 1, 1, Duration::from_secs(1)),
            Some(FlushReason::Latency)
        );
        assert_eq!(flush_due(&thresholds, 9, 99, Duration::from_millis(999)), None);
    }

    proptest! {
        #[test]
        fn the_fence_holds_only_for_the_expected_version(
            expected in proptest::option::of(0i64..5),
            stored in proptest::option::of(0i64..5),
        ) {
            prop_assert_eq!(fence_holds(expected, stored), expected == stored);
        }
    }
}
