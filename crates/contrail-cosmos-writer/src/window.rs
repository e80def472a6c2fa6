//! The write window, as pure bookkeeping: which record is written when, and which offsets may be
//! committed.
//!
//! Records are offered as they are consumed and wait in the window as their flight's *pending*
//! write; a newer version of the flight replaces the pending one (coalescing across the whole
//! window). Flights with a pending write queue up in the order they arrived; the caller starts
//! the next queued write whenever it has room for one more in flight ([`Window::next_write`]). A
//! flight has at most one write in flight; when it is acknowledged the flight queues again if a
//! newer version arrived meanwhile. So under a backlog records coalesce while they queue, and at
//! low load a record is written as soon as it arrives. A record's offset is *done* when a write
//! of the same or a higher version of its flight has been acknowledged (or when it needs no
//! write: a dead letter). A partition may be committed up to its lowest offset that is not done —
//! so partitions advance independently, as their writes complete, and a slow write holds back
//! only its own partition's commit, never the next records' writes.
//!
//! Correctness argument (property-tested below against a model that knows nothing but "highest
//! version acknowledged per flight"): an offset is marked done only through the acknowledgement of
//! a write whose version is at least the record's, so whenever a partition's commit point is `C`,
//! every record of it below `C` has its effect in Cosmos DB. A crash redelivers from `C`; the
//! version guard makes the redelivered records harmless.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// A record's place in its topic.
pub type Position = (i32, i64);

/// A document write to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write<T> {
    /// Flight key (document id).
    pub key: String,
    /// The version written.
    pub version: u64,
    /// What the caller needs to write it (the document, the record for a dead letter).
    pub item: T,
}

/// What became of an offered record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// The record is its flight's next write.
    Queued,
    /// One record will not be written because a newer version of its flight is in the window
    /// (this one, or the pending write it replaced).
    Coalesced,
}

/// A position and the epoch of its partition when it was consumed: a partition restarted after an
/// accepted gap (its topic created again) may hand out the same offsets for other records, and a
/// write still in flight from before must not make those done.
type Stamped = (i32, i64, u32);

struct Pending<T> {
    version: u64,
    item: T,
    covers: Vec<Stamped>,
}

struct Slot<T> {
    /// The write in flight: its version and the records it makes done.
    writing: Option<(u64, Vec<Stamped>)>,
    /// The newest record waiting to be written, and the records it makes done.
    pending: Option<Pending<T>>,
}

#[derive(Default)]
struct Progress {
    /// Offsets consumed and not done, with a count (a partition re-consumed after a rebalance may
    /// deliver an offset twice).
    open: BTreeMap<i64, u32>,
    /// One past the highest offset seen.
    next: i64,
    /// The commit point last reported as committed.
    committed: Option<i64>,
    /// How many times the partition was restarted ([`Window::restart`]).
    epoch: u32,
}

impl Progress {
    fn point(&self) -> i64 {
        self.open.keys().next().copied().unwrap_or(self.next)
    }
}

/// The window of consumed, not yet committed records.
pub struct Window<T> {
    keys: HashMap<String, Slot<T>>,
    /// Flights with a pending write and none in flight, in arrival order.
    ready: VecDeque<String>,
    writing: usize,
    partitions: BTreeMap<i32, Progress>,
    open: usize,
}

impl<T> Default for Window<T> {
    fn default() -> Self {
        Window {
            keys: HashMap::new(),
            ready: VecDeque::new(),
            writing: 0,
            partitions: BTreeMap::new(),
            open: 0,
        }
    }
}

impl<T> Window<T> {
    /// Records consumed and not done yet.
    pub fn outstanding(&self) -> usize {
        self.open
    }

    /// Flights with a write in flight.
    pub fn writing(&self) -> usize {
        self.writing
    }

    fn open(&mut self, (partition, offset): Position) -> Stamped {
        let progress = self.partitions.entry(partition).or_default();
        *progress.open.entry(offset).or_insert(0) += 1;
        progress.next = progress.next.max(offset + 1);
        self.open += 1;
        (partition, offset, progress.epoch)
    }

    fn close(&mut self, (partition, offset, epoch): Stamped) {
        let Some(progress) = self.partitions.get_mut(&partition) else {
            return;
        };
        if progress.epoch != epoch {
            // Consumed before the partition restarted: not one of its records any more.
            return;
        }
        if let Some(count) = progress.open.get_mut(&offset) {
            *count -= 1;
            if *count == 0 {
                progress.open.remove(&offset);
            }
            self.open -= 1;
        }
    }

    /// A record that needs no write (it went to the dead-letter topic, acknowledged).
    pub fn done(&mut self, position: Position) {
        let stamped = self.open(position);
        self.close(stamped);
    }

    /// A consumed record of flight `key` at `version`.
    pub fn offer(&mut self, position: Position, key: &str, version: u64, item: T) -> Offer {
        let position = self.open(position);
        let Some(slot) = self.keys.get_mut(key) else {
            self.keys.insert(
                key.to_owned(),
                Slot {
                    writing: None,
                    pending: Some(Pending {
                        version,
                        item,
                        covers: vec![position],
                    }),
                },
            );
            self.ready.push_back(key.to_owned());
            return Offer::Queued;
        };
        match (&mut slot.pending, &mut slot.writing) {
            (Some(pending), _) => {
                if version > pending.version {
                    pending.version = version;
                    pending.item = item;
                }
                pending.covers.push(position);
                Offer::Coalesced
            }
            (None, Some((writing, covers))) if version <= *writing => {
                // The write in flight already carries this version or a newer one.
                covers.push(position);
                Offer::Coalesced
            }
            (None, _) => {
                // Waits for the write in flight; queued when that one is acknowledged.
                slot.pending = Some(Pending {
                    version,
                    item,
                    covers: vec![position],
                });
                Offer::Queued
            }
        }
    }

    /// The next write to start: the newest version of the flight that has waited longest.
    pub fn next_write(&mut self) -> Option<Write<T>> {
        while let Some(key) = self.ready.pop_front() {
            let Some(slot) = self.keys.get_mut(&key) else {
                continue;
            };
            let Some(pending) = slot.pending.take() else {
                continue;
            };
            slot.writing = Some((pending.version, pending.covers));
            self.writing += 1;
            return Some(Write {
                key,
                version: pending.version,
                item: pending.item,
            });
        }
        None
    }

    /// The write in flight for `key` was acknowledged (written, or skipped as stale: either way
    /// the stored version is at least its version). A newer version that arrived meanwhile
    /// queues.
    pub fn complete(&mut self, key: &str) {
        let Some(slot) = self.keys.get_mut(key) else {
            return;
        };
        let Some((_, covers)) = slot.writing.take() else {
            return;
        };
        self.writing -= 1;
        if slot.pending.is_some() {
            self.ready.push_back(key.to_owned());
        } else {
            self.keys.remove(key);
        }
        for position in covers {
            self.close(position);
        }
    }

    /// Partitions whose commit point moved since it was last reported committed, with the offset
    /// to commit (the next record to consume after a restart).
    pub fn commit_points(&self) -> Vec<Position> {
        self.partitions
            .iter()
            .filter_map(|(partition, progress)| {
                let point = progress.point();
                progress
                    .committed
                    .is_none_or(|committed| committed < point)
                    .then_some((*partition, point))
            })
            .collect()
    }

    /// The partition goes on at `from` after an accepted gap (its offsets may now be lower than
    /// any before: a topic created again): what the window knew of it is forgotten, records of it
    /// still being written no longer hold its commit point, and `from` counts as committed (the
    /// loop commits it at once).
    pub fn restart(&mut self, partition: i32, from: i64) {
        let epoch = self
            .partitions
            .get(&partition)
            .map_or(0, |old| old.epoch.wrapping_add(1));
        let fresh = Progress {
            open: BTreeMap::new(),
            next: from,
            committed: Some(from),
            epoch,
        };
        if let Some(old) = self.partitions.insert(partition, fresh) {
            self.open -= old.open.values().map(|count| *count as usize).sum::<usize>();
        }
    }

    /// The broker acknowledged the commit of `points`.
    pub fn committed(&mut self, points: &[Position]) {
        for (partition, offset) in points {
            if let Some(progress) = self.partitions.get_mut(partition) {
                progress.committed = Some(progress.committed.map_or(*offset, |old| old.max(*offset)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_restarted_partition_commits_from_its_new_start_even_below_its_old_offsets() {
        let mut window: Window<&str> = Window::default();
        window.offer((0, 300), "AA1", 1, "old");
        window.offer((1, 7), "BB2", 1, "other");
        assert_eq!(window.outstanding(), 2);
        window.restart(0, 0);
        assert_eq!(
            window.outstanding(),
            1,
            "the old partition's record no longer counts"
        );
        assert_eq!(
            window.commit_points(),
            vec![(1, 7)],
            "0 counts as committed, 1 still open at 7"
        );
        window.offer((0, 0), "CC3", 1, "new");
        window.offer((0, 1), "CC3", 2, "newer");
        while let Some(write) = window.next_write() {
            window.complete(&write.key);
        }
        assert_eq!(
            window.outstanding(),
            0,
            "the old record's write closed nothing twice"
        );
        assert_eq!(window.commit_points(), vec![(0, 2), (1, 8)]);
    }

    #[test]
    fn a_write_from_before_a_restart_does_not_make_the_new_records_at_its_offsets_done() {
        let mut window: Window<&str> = Window::default();
        window.offer((0, 5), "OLD", 1, "old topic's offset 5");
        let old = window.next_write().expect("the old record's write starts");
        // The gap is accepted: the topic was created again and starts at 0.
        window.restart(0, 0);
        for offset in 0..=5 {
            window.offer((0, offset), "NEW", offset as u64 + 1, "new topic");
        }
        let new = window.next_write().expect("the new records' write starts");
        window.complete(&old.key);
        assert_eq!(
            window.commit_points(),
            vec![],
            "the old write's acknowledgement closes none of the new topic's records"
        );
        assert_eq!(window.outstanding(), 6);
        window.complete(&new.key);
        assert_eq!(window.commit_points(), vec![(0, 6)]);
        assert_eq!(window.outstanding(), 0);
    }

    #[test]
    fn a_slow_write_holds_back_only_its_own_partition() {
        let mut window = Window::default();
        assert_eq!(window.offer((0, 10), "A", 1, ()), Offer::Queued);
        assert_eq!(window.offer((1, 20), "B", 1, ()), Offer::Queued);
        let slow = window.next_write().expect("A first");
        let fast = window.next_write().expect("then B");
        assert_eq!((slow.key.as_str(), fast.key.as_str()), ("A", "B"));
        assert_eq!(window.next_write(), None);
        window.complete(&fast.key);
        assert_eq!(window.commit_points(), vec![(0, 10), (1, 21)]);
        window.committed(&[(0, 10), (1, 21)]);
        assert_eq!(window.commit_points(), vec![]);
        window.complete(&slow.key);
        assert_eq!(window.commit_points(), vec![(0, 11)]);
    }

    #[test]
    fn versions_coalesce_while_they_wait_and_behind_the_write_in_flight() {
        let mut window = Window::default();
        assert_eq!(window.offer((0, 0), "A", 1, "v1"), Offer::Queued);
        assert_eq!(window.offer((0, 1), "A", 2, "v2"), Offer::Coalesced);
        let first = window.next_write().expect("A queued");
        assert_eq!((first.version, first.item), (2, "v2"));
        assert_eq!(window.offer((0, 2), "A", 1, "v1 again"), Offer::Coalesced);
        assert_eq!(window.offer((0, 3), "A", 4, "v4"), Offer::Queued);
        assert_eq!(window.offer((0, 4), "A", 3, "v3"), Offer::Coalesced);
        assert_eq!(window.next_write(), None, "one write per flight in flight");
        assert_eq!(window.writing(), 1);
        window.complete("A");
        // Offsets 0..=2 are done (version 2 written); 3 and 4 wait for version 4.
        assert_eq!(window.commit_points(), vec![(0, 3)]);
        let next = window.next_write().expect("the newer version queued");
        assert_eq!((next.version, next.item), (4, "v4"));
        window.complete("A");
        assert_eq!(window.commit_points(), vec![(0, 5)]);
        assert_eq!(window.outstanding(), 0);
        assert_eq!(window.writing(), 0);
        assert_eq!(window.next_write(), None);
    }

    #[test]
    fn dead_letters_are_done_at_once_and_never_move_a_point_back() {
        let mut window: Window<()> = Window::default();
        window.done((2, 5));
        assert_eq!(window.commit_points(), vec![(2, 6)]);
        window.committed(&[(2, 6)]);
        // A rebalance re-delivers an older offset: the reported point does not go back.
        window.done((2, 3));
        assert_eq!(window.commit_points(), vec![]);
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// Consume the next record of this partition, for this flight and version.
        Consume { partition: i32, key: u8, version: u64 },
        /// Start the next queued write, if any.
        Start,
        /// Acknowledge the n-th write in flight (modulo their number).
        Acknowledge(usize),
        /// Report the current commit points as committed.
        Commit,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..3i32, 0..6u8, 1..8u64).prop_map(|(partition, key, version)| Step::Consume { partition, key, version }),
            2 => Just(Step::Start),
            3 => any::<usize>().prop_map(Step::Acknowledge),
            1 => Just(Step::Commit),
        ]
    }

    proptest! {
        /// Against a model that only knows the highest version acknowledged per flight: a commit
        /// point never passes a record whose version is not yet in the store, each flight has at
        /// most one write in flight, points only move forward, and once every write is
        /// acknowledged every partition is committable to its end with every flight at its
        /// highest version.
        #[test]
        fn commits_never_pass_a_record_whose_version_is_not_stored(steps in proptest::collection::vec(step(), 1..200)) {
            let mut window: Window<u64> = Window::default();
            let mut store: HashMap<String, u64> = HashMap::new();
            let mut records: HashMap<i32, Vec<(String, u64)>> = HashMap::new();
            let mut in_flight: VecDeque<Write<u64>> = VecDeque::new();
            let mut last_points: HashMap<i32, i64> = HashMap::new();
            let check = |window: &Window<u64>, store: &HashMap<String, u64>, records: &HashMap<i32, Vec<(String, u64)>>, last: &mut HashMap<i32, i64>| {
                for (partition, point) in window.commit_points() {
                    for (key, version) in &records[&partition][..point as usize] {
                        prop_assert!(store.get(key).is_some_and(|stored| stored >= version),
                            "partition {partition} committable to {point} but {key} v{version} is not stored");
                    }
                    prop_assert!(last.get(&partition).is_none_or(|old| *old <= point));
                    last.insert(partition, point);
                }
                Ok(())
            };
            for step in steps {
                match step {
                    Step::Consume { partition, key, version } => {
                        let key = format!("F{key}");
                        let list = records.entry(partition).or_default();
                        let offset = list.len() as i64;
                        list.push((key.clone(), version));
                        window.offer((partition, offset), &key, version, version);
                    }
                    Step::Start => {
                        if let Some(write) = window.next_write() {
                            prop_assert!(in_flight.iter().all(|other| other.key != write.key),
                                "two writes of {} in flight", write.key);
                            in_flight.push_back(write);
                        }
                    }
                    Step::Acknowledge(n) if !in_flight.is_empty() => {
                        let write = in_flight.remove(n % in_flight.len()).expect("in range");
                        prop_assert_eq!(write.item, write.version);
                        let stored = store.entry(write.key.clone()).or_insert(0);
                        *stored = (*stored).max(write.version);
                        window.complete(&write.key);
                    }
                    Step::Acknowledge(_) => {}
                    Step::Commit => {
                        let points = window.commit_points();
                        window.committed(&points);
                    }
                }
                check(&window, &store, &records, &mut last_points)?;
                prop_assert_eq!(window.writing(), in_flight.len());
            }
            loop {
                while let Some(write) = window.next_write() {
                    in_flight.push_back(write);
                }
                let Some(write) = in_flight.pop_front() else { break };
                let stored = store.entry(write.key.clone()).or_insert(0);
                *stored = (*stored).max(write.version);
                window.complete(&write.key);
                check(&window, &store, &records, &mut last_points)?;
            }
            prop_assert_eq!(window.outstanding(), 0);
            for (partition, list) in &records {
                let point = window.partitions[partition].point();
                prop_assert_eq!(point, list.len() as i64);
                for (key, version) in list {
                    prop_assert!(store[key] >= *version);
                }
            }
            let mut highest: HashMap<&String, u64> = HashMap::new();
            for (key, version) in records.values().flatten() {
                let entry = highest.entry(key).or_insert(0);
                *entry = (*entry).max(*version);
            }
            for (key, version) in highest {
                prop_assert_eq!(store[key], version);
            }
        }
    }
}
