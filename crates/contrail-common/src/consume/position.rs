//! Where a consuming stage's partition stands, and what a gap in it is (pure, I/O-free).
//!
//! Every consuming stage keeps its own record of progress per partition — a Delta `txn` version,
//! a RocksDB shard's offset, a consumer group's committed offset — and reads on from there. What
//! it does with a record at an offset, and how a first record past the stored position is judged,
//! is the same for all of them and is written here once.

/// What to do with a record at `offset` when `next` is the partition's next offset to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The record is the next one: apply it.
    Take,
    /// Already applied (a prefetched or redelivered record below the resume point): skip it.
    Skip,
    /// The consumer is ahead of the stored position (its fetch position came from elsewhere):
    /// seek back to the resume point and skip this record.
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

/// How many times a partition is re-read from its stored position before a gap is judged.
pub const GAP_RETRIES: u32 = 3;

/// A partition's first record read is past its stored position: what that means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jump {
    /// Not judged yet: seek back to the stored position and read again.
    Reseek,
    /// The broker holds no record between the two offsets (its log starts at or below the
    /// stored position, and repeated reads skip the same offsets: transaction markers or
    /// compaction): go on from the record read.
    NothingLost,
    /// Records `from..to` are gone from the broker, whose log now starts at `log_start`
    /// (retention deleted them before they were read): never skip them silently.
    Lost {
        /// The first offset lost (the stored position).
        from: i64,
        /// One past the last offset lost.
        to: i64,
        /// Where the broker's log starts.
        log_start: i64,
    },
    /// The broker's log start could not be read: the gap cannot be judged.
    Unknown,
}

/// Judges a gap: `expected` is the stored position, `got` the first record read, `attempts` how
/// many times in a row this gap was seen, `low_watermark` the partition's first offset on the
/// broker (if it could be read).
pub fn judge_jump(expected: i64, got: i64, attempts: u32, low_watermark: Option<i64>) -> Jump {
    if attempts < GAP_RETRIES {
        return Jump::Reseek;
    }
    match low_watermark {
        Some(low) if low > expected => Jump::Lost {
            from: expected,
            to: low.min(got),
            log_start: low,
        },
        Some(_) => Jump::NothingLost,
        None => Jump::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_gap_is_reread_then_judged_against_the_log_start() {
        assert_eq!(judge_jump(100, 105, 1, None), Jump::Reseek);
        assert_eq!(judge_jump(100, 105, GAP_RETRIES - 1, Some(200)), Jump::Reseek);
        assert_eq!(
            judge_jump(100, 105, GAP_RETRIES, Some(103)),
            Jump::Lost {
                from: 100,
                to: 103,
                log_start: 103
            }
        );
        assert_eq!(
            judge_jump(100, 105, GAP_RETRIES, Some(110)),
            Jump::Lost {
                from: 100,
                to: 105,
                log_start: 110
            }
        );
        assert_eq!(judge_jump(100, 105, GAP_RETRIES, Some(0)), Jump::NothingLost);
        assert_eq!(judge_jump(100, 105, GAP_RETRIES, Some(100)), Jump::NothingLost);
        assert_eq!(judge_jump(100, 105, GAP_RETRIES, None), Jump::Unknown);
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

        /// A judged gap is a loss exactly when the broker's log starts past the stored position,
        /// and the range it names starts at the stored position and ends at the earlier of the
        /// log start and the record read.
        #[test]
        fn a_loss_is_named_exactly_when_the_log_starts_past_the_stored_position(
            expected in 0i64..1_000,
            ahead in 1i64..1_000,
            low in proptest::option::of(0i64..3_000),
            attempts in 0u32..6,
        ) {
            let got = expected + ahead;
            let gap = judge_jump(expected, got, attempts, low);
            match gap {
                Jump::Reseek => prop_assert!(attempts < GAP_RETRIES),
                Jump::Unknown => prop_assert!(attempts >= GAP_RETRIES && low.is_none()),
                Jump::NothingLost => prop_assert!(low.is_some_and(|low| low <= expected)),
                Jump::Lost { from, to, log_start } => {
                    prop_assert_eq!(Some(log_start), low);
                    prop_assert!(log_start > expected);
                    prop_assert_eq!(from, expected);
                    prop_assert!(to > from && to <= got && to <= log_start);
                }
            }
        }
    }
}
