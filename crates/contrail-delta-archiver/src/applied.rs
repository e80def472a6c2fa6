//! Exact de-duplication by position (pure, I/O-free; docs/CONTRACT.md, "Exact de-duplication").
//!
//! Upstream stages use no Kafka transactions, so a topic may hold byte-identical copies of a
//! record — after a crash of the producing stage, or far apart: a dedup-state shard restored from
//! an hours-old checkpoint regenerates everything since. No window of offsets can be known to
//! cover such copies, so the archiver de-duplicates exactly, by the record's *origin*:
//!
//! - every record says where it comes from and its place there — dedup-state's outputs carry the
//!   raw-topic partition and offset of the input record that produced them (one output per input
//!   record and topic), changefeed-sync's changes their feed range and `_lsn`;
//! - the producers emit each origin's records in increasing position (dedup-state processes a
//!   partition in offset order and re-sends its outbox before anything newer; changefeed-sync
//!   reads a feed range in `_lsn` order and publishes a page in order), so in a topic partition a
//!   record's first copy comes after the first copies of every lower position of its origin;
//! - per (topic partition, origin) the archiver keeps the highest position it applied, in the
//!   same Delta commit as the rows (a `txn` action, [`origin_app_id`]), and drops every record
//!   at or below it.
//!
//! A restart reads the stored positions (one `txn` look-up per origin, cost independent of the
//! table's history) and decides exactly as a process that never stopped.

use std::collections::HashMap;

/// Where a record comes from and its place there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    /// The source whose records are ordered: `ops.events.raw:3` (an input partition) or
    /// `feed-range:…` (a Cosmos DB feed range, hashed when long). Part of a Delta app id.
    pub source: String,
    /// The record's place in it: the input offset, or the change's `_lsn`.
    pub position: i64,
}

/// The Delta `txn` app id holding the highest position applied from `source` in the topic
/// partition whose own app id is `partition_app_id`.
pub fn origin_app_id(partition_app_id: &str, source: &str) -> String {
    format!("{partition_app_id}-from-{source}")
}

/// What to do with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Above everything applied from its origin: archive it.
    Apply,
    /// At or below what was applied from its origin: a copy, drop it.
    Copy,
    /// The origin's stored position is not known yet: read it from the table, then decide.
    Unknown,
}

/// The highest position applied per origin in one topic partition: what the table stores and
/// what the batch in flight has taken since.
#[derive(Debug, Clone, Default)]
pub struct AppliedPositions {
    stored: HashMap<String, Option<i64>>,
    taken: HashMap<String, i64>,
}

impl AppliedPositions {
    /// Records what the table stores for `source` (`None`: nothing applied yet).
    pub fn load(&mut self, source: &str, stored: Option<i64>) {
        self.stored.insert(source.to_owned(), stored);
    }

    /// Decides on a record from `origin`; an applied record raises its origin's position.
    pub fn decide(&mut self, origin: &Origin) -> Decision {
        let Some(stored) = self.stored.get(&origin.source) else {
            return Decision::Unknown;
        };
        let applied = self.taken.get(&origin.source).copied().max(*stored);
        if applied.is_some_and(|applied| origin.position <= applied) {
            return Decision::Copy;
        }
        self.taken.insert(origin.source.clone(), origin.position);
        Decision::Apply
    }

    /// The positions the batch in flight raised: `(source, position)`, to commit as `txn`s.
    pub fn pending(&self) -> impl Iterator<Item = (&str, i64)> {
        self.taken
            .iter()
            .map(|(source, position)| (source.as_str(), *position))
    }

    /// The batch was committed: its positions are now the stored ones.
    pub fn committed(&mut self) {
        for (source, position) in self.taken.drain() {
            self.stored.insert(source, Some(position));
        }
    }
}

/// A short, stable name for a long source id (Delta app ids should stay short): FNV-1a, 64 bit.
pub fn short_source(prefix: &str, text: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{prefix}:{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn origin(source: &str, position: i64) -> Origin {
        Origin {
            source: source.to_owned(),
            position,
        }
    }

    #[test]
    fn a_copy_at_or_below_the_applied_position_is_dropped_whatever_its_distance() {
        let mut applied = AppliedPositions::default();
        assert_eq!(applied.decide(&origin("raw:0", 5)), Decision::Unknown);
        applied.load("raw:0", Some(1_000_000));
        // A copy regenerated from an hours-old checkpoint: millions of offsets away.
        assert_eq!(applied.decide(&origin("raw:0", 7)), Decision::Copy);
        assert_eq!(applied.decide(&origin("raw:0", 1_000_000)), Decision::Copy);
        assert_eq!(applied.decide(&origin("raw:0", 1_000_001)), Decision::Apply);
        assert_eq!(applied.decide(&origin("raw:0", 1_000_001)), Decision::Copy);
        // Origins are independent.
        applied.load("raw:1", None);
        assert_eq!(applied.decide(&origin("raw:1", 0)), Decision::Apply);
        assert_eq!(
            applied.pending().collect::<HashMap<_, _>>(),
            HashMap::from([("raw:0", 1_000_001), ("raw:1", 0)])
        );
        applied.committed();
        assert_eq!(applied.pending().count(), 0);
        assert_eq!(applied.decide(&origin("raw:1", 0)), Decision::Copy);
    }

    #[test]
    fn app_ids_and_short_sources_are_stable() {
        assert_eq!(
            origin_app_id("events-ops.events.accepted-3", "ops.events.raw:1"),
            "events-ops.events.accepted-3-from-ops.events.raw:1"
        );
        assert_eq!(short_source("feed-range", ""), "feed-range:cbf29ce484222325");
        assert_ne!(short_source("fr", "a"), short_source("fr", "b"));
    }

    /// One topic partition as producers write it: each origin's records in increasing position
    /// (first copies), with copies of earlier records anywhere after their first copy.
    fn topic() -> impl Strategy<Value = Vec<(u8, i64)>> {
        (
            prop::collection::vec((0u8..3, 1i64..4), 1..60),
            prop::collection::vec(
                (any::<prop::sample::Index>(), any::<prop::sample::Index>()),
                0..40,
            ),
        )
            .prop_map(|(steps, copies)| {
                let mut next = [0i64; 3];
                let mut records: Vec<(u8, i64)> = steps
                    .into_iter()
                    .map(|(source, gap)| {
                        next[source as usize] += gap;
                        (source, next[source as usize])
                    })
                    .collect();
                for (which, at) in copies {
                    let original = which.index(records.len());
                    let copy = records[original];
                    let after = original + 1 + at.index(records.len() - original);
                    records.insert(after.min(records.len()), copy);
                }
                records
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever the copies and wherever the archiver crashes (losing the batch in flight,
        /// resuming after the last committed offset with the stored positions), every distinct
        /// record is applied exactly once.
        #[test]
        fn every_record_is_applied_once_across_crashes(
            records in topic(),
            events in prop::collection::vec(0u8..10, 1..200),
        ) {
            let mut stored: HashMap<String, Option<i64>> = HashMap::new();
            let mut committed_rows: Vec<(u8, i64)> = Vec::new();
            let mut committed_offset = 0usize;
            // Finite: once the events are used up, nothing crashes any more and the run ends.
            let mut events = events.into_iter();
            'run: loop {
                let mut applied = AppliedPositions::default();
                let mut batch: Vec<(u8, i64)> = Vec::new();
                let mut offset = committed_offset;
                while offset < records.len() {
                    let (source, position) = records[offset];
                    let record = origin(&format!("raw:{source}"), position);
                    let mut decision = applied.decide(&record);
                    if decision == Decision::Unknown {
                        applied.load(&record.source, stored.get(&record.source).copied().flatten());
                        decision = applied.decide(&record);
                    }
                    match decision {
                        Decision::Apply => batch.push((source, position)),
                        Decision::Copy => {}
                        Decision::Unknown => prop_assert!(false, "loaded above"),
                    }
                    offset += 1;
                    match events.next().unwrap_or(9) {
                        0 | 1 => {
                            // Commit: rows and positions together.
                            for (source, position) in applied.pending() {
                                stored.insert(source.to_owned(), Some(position));
                            }
                            applied.committed();
                            committed_rows.append(&mut batch);
                            committed_offset = offset;
                        }
                        2 => continue 'run, // crash: the batch in flight is lost
                        _ => {}
                    }
                }
                for (source, position) in applied.pending() {
                    stored.insert(source.to_owned(), Some(position));
                }
                committed_rows.append(&mut batch);
                break;
            }
            let mut distinct: Vec<(u8, i64)> = records.clone();
            distinct.sort_unstable();
            distinct.dedup();
            committed_rows.sort_unstable();
            prop_assert_eq!(committed_rows, distinct);
        }
    }
}
