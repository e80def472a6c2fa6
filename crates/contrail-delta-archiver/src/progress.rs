//! Where each partition stands, and when a batch is committed (pure, I/O-free).
//!
//! The Delta table — not the consumer group — is the record of progress: every commit carries a
//! `txn` action per `(table, topic, partition)` whose version is the last offset written
//! (DESIGN §4). A partition newly assigned to this instance resumes at that version + 1.

use std::time::Duration;

/// The next offset to archive, given the version stored in the table (`None`: nothing archived
/// yet, start at the partition's first retained offset `low`).
pub fn resume_at(stored: Option<i64>, low: i64) -> i64 {
    match stored {
        Some(version) => version + 1,
        None => low.max(0),
    }
}

/// What to do with a record at `offset` when `next` is the partition's next offset to archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The record is the next one: archive it.
    Take,
    /// Already archived (a prefetched or redelivered record below the resume point): skip it.
    Skip,
    /// The consumer is ahead of the table (its fetch position came from elsewhere): seek back to
    /// the resume point and skip this record.
    SeekTo(i64),
}

/// Places a record. `sought` says the consumer was positioned at `next` by a seek (so any offset
/// above `next` means the offsets in between do not exist).
pub fn place(next: i64, offset: i64, sought: bool) -> Placement {
    if offset == next || (offset > next && sought) {
        Placement::Take
    } else if offset < next {
        Placement::Skip
    } else {
        Placement::SeekTo(next)
    }
}

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
}

impl FlushReason {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            FlushReason::Rows => "rows",
            FlushReason::Bytes => "bytes",
            FlushReason::Latency => "latency",
            FlushReason::Stopping => "stopping",
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
    fn resumes_after_the_stored_version_or_at_the_first_retained_offset() {
        assert_eq!(resume_at(Some(41), 0), 42);
        assert_eq!(resume_at(None, 17), 17);
        assert_eq!(resume_at(None, -1), 0);
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
        /// Whatever order and repetition records arrive in (prefetch before a seek, redelivery
        /// after a rebalance), the offsets taken are exactly `next..` without gaps or repeats,
        /// as long as a seek is honoured by delivering from the sought offset.
        #[test]
        fn takes_each_offset_once_from_the_resume_point(
            next in 0i64..50,
            prefetched in proptest::collection::vec(0i64..100, 0..30),
            end in 50i64..120,
        ) {
            let mut taken = Vec::new();
            let mut position = next;
            let mut sought = false;
            let mut queue: std::collections::VecDeque<i64> = prefetched.into_iter().collect();
            let mut fetch = None::<i64>;
            loop {
                let offset = match queue.pop_front() {
                    Some(offset) => offset,
                    None => {
                        let offset = fetch.unwrap_or(position);
                        if offset >= end { break; }
                        fetch = Some(offset + 1);
                        offset
                    }
                };
                match place(position, offset, sought) {
                    Placement::Take => { taken.push(offset); position = offset + 1; }
                    Placement::Skip => {}
                    Placement::SeekTo(target) => {
                        // A seek discards what was prefetched and fetches from the target.
                        queue.clear();
                        fetch = Some(target);
                        sought = true;
                    }
                }
            }
            let expected: Vec<i64> = (next..end).collect();
            prop_assert_eq!(taken, expected);
        }

        #[test]
        fn the_fence_holds_only_for_the_expected_version(
            expected in proptest::option::of(0i64..5),
            stored in proptest::option::of(0i64..5),
        ) {
            prop_assert_eq!(fence_holds(expected, stored), expected == stored);
        }
    }
}
