//! Assignment work off the rebalance callback: opening a shard — reopening its directory, or
//! downloading and opening a whole checkpoint (millions of keys) — runs on opener threads while
//! the polling thread goes on serving the group (heartbeats, the next rebalance, checkpoint
//! barriers) and the partitions it already owns.
//!
//! The rebalance callback only assigns and pauses the partitions and records them here
//! ([`Assignments`]), each assignment of a partition with a generation of its own. The polling
//! thread hands them to the opener threads ([`Openers`]); the open of a generation that is no
//! longer current (revoked, or revoked and assigned again meanwhile) is given up on the way, or
//! the shard closed unowned if it was open already. One partition is opened by one thread at a
//! time (its directory is one RocksDB instance): a new assignment of a partition still being
//! opened waits for that open to end ([`OpenBook`]).
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::Scope;

use contrail_state::StateError;
use rdkafka::Offset;

use crate::error::DedupStateError;
use crate::shards::{Opened, ShardSet};

/// How many shards open at once (downloads wait on the store; opening reads the state's timers).
pub const OPENER_THREADS: usize = 4;

/// The partitions assigned to this member, recorded by the rebalance callback.
#[derive(Default)]
pub struct Assignments(Mutex<AssignmentBook>);

#[derive(Default)]
struct AssignmentBook {
    next_generation: u64,
    /// Each owned partition's current generation.
    current: HashMap<i32, u64>,
    /// Assigned and not yet handed to an opener.
    to_open: Vec<(i32, u64)>,
}

impl Assignments {
    fn book(&self) -> MutexGuard<'_, AssignmentBook> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `partitions` are now this member's: each gets a new generation and waits to be opened.
    pub fn assigned(&self, partitions: &[i32]) {
        let mut book = self.book();
        for partition in partitions {
            book.next_generation += 1;
            let generation = book.next_generation;
            book.current.insert(*partition, generation);
            book.to_open.push((*partition, generation));
        }
    }

    /// `partitions` are not this member's any more (an open in progress for them is discarded).
    pub fn revoked(&self, partitions: &[i32]) {
        let mut book = self.book();
        for partition in partitions {
            book.current.remove(partition);
        }
        book.to_open
            .retain(|(partition, _)| !partitions.contains(partition));
    }

    /// Nothing is this member's any more.
    pub fn clear(&self) {
        let mut book = self.book();
        book.current.clear();
        book.to_open.clear();
    }

    /// Whether `generation` is still `partition`'s current assignment.
    pub fn is_current(&self, partition: i32, generation: u64) -> bool {
        self.book().current.get(&partition) == Some(&generation)
    }

    fn take_to_open(&self) -> Vec<(i32, u64)> {
        std::mem::take(&mut self.book().to_open)
    }
}

/// Which partitions are being opened and which wait for an open of theirs to end. Pure.
#[derive(Debug, Default)]
pub struct OpenBook {
    running: HashSet<i32>,
    queued: BTreeMap<i32, u64>,
}

impl OpenBook {
    /// Asks to open `partition` for `generation`: the job to start now, or none (an open of the
    /// partition runs; this one, replacing any queued before it, starts when that one ends).
    pub fn request(&mut self, partition: i32, generation: u64) -> Option<(i32, u64)> {
        if self.running.contains(&partition) {
            self.queued.insert(partition, generation);
            None
        } else {
            self.running.insert(partition);
            Some((partition, generation))
        }
    }

    /// The open of `partition` ended: the job queued for it, to start now.
    pub fn finished(&mut self, partition: i32) -> Option<(i32, u64)> {
        self.running.remove(&partition);
        let generation = self.queued.remove(&partition)?;
        self.running.insert(partition);
        Some((partition, generation))
    }

    /// The partitions being opened or waiting to be.
    pub fn unopened(&self) -> impl Iterator<Item = i32> + '_ {
        self.running.iter().chain(self.queued.keys()).copied()
    }

    /// Whether nothing is being opened or waits to be.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.queued.is_empty()
    }
}

/// What an opener thread did with a job (`None`: given up, its assignment was revoked before or
/// while it opened).
struct OpenDone {
    partition: i32,
    generation: u64,
    result: Option<Result<Opened, StateError>>,
}

/// The polling thread's side of the opener threads.
pub struct Openers {
    jobs: Option<Sender<(i32, u64)>>,
    done: Receiver<OpenDone>,
    book: OpenBook,
    assignments: Arc<Assignments>,
}

impl Openers {
    /// Starts [`OPENER_THREADS`] opener threads in `scope`, opening shards of `shards` for the
    /// partitions recorded in `assignments`.
    pub fn start<'scope>(
        scope: &'scope Scope<'scope, '_>,
        shards: &'scope ShardSet,
        assignments: Arc<Assignments>,
    ) -> Result<Openers, DedupStateError> {
        let (job_sender, job_receiver) = mpsc::channel::<(i32, u64)>();
        let (done_sender, done) = mpsc::channel::<OpenDone>();
        let job_receiver = Arc::new(Mutex::new(job_receiver));
        for index in 0..OPENER_THREADS {
            let job_receiver = job_receiver.clone();
            let done_sender = done_sender.clone();
            let assignments = assignments.clone();
            std::thread::Builder::new()
                .name(format!("dedup-open-{index}"))
                .spawn_scoped(scope, move || {
                    loop {
                        // The receiver is only held while waiting for a job.
                        let job = match job_receiver.lock() {
                            Ok(receiver) => receiver.recv(),
                            Err(_) => return,
                        };
                        let Ok((partition, generation)) = job else { return };
                        let revoked = || !assignments.is_current(partition, generation);
                        let result = shards.prepare(partition, &revoked).transpose();
                        if result.is_none() {
                            tracing::info!(
                                partition,
                                "shard not opened: its assignment was revoked meanwhile"
                            );
                        }
                        let done = OpenDone {
                            partition,
                            generation,
                            result,
                        };
                        if done_sender.send(done).is_err() {
                            return;
                        }
                    }
                })
                .map_err(|error| {
                    DedupStateError::Worker(format!("cannot start an opener thread: {error}"))
                })?;
        }
        Ok(Openers {
            jobs: Some(job_sender),
            done,
            book: OpenBook::default(),
            assignments,
        })
    }

    /// Hands the partitions assigned since the last turn to the openers, and owns the shards
    /// opened since: returns each such partition with the offset it goes on from. A shard that
    /// failed to open fails the stage (a restart opens it again).
    pub fn turn(&mut self, shards: &ShardSet) -> Result<Vec<(i32, Offset)>, DedupStateError> {
        for (partition, generation) in self.assignments.take_to_open() {
            if let Some(job) = self.book.request(partition, generation) {
                self.send(job)?;
            }
        }
        let mut started = Vec::new();
        while let Ok(done) = self.done.try_recv() {
            if let Some(job) = self.book.finished(done.partition) {
                self.send(job)?;
            }
            let current = self.assignments.is_current(done.partition, done.generation);
            match done.result {
                Some(Ok(opened)) if current => {
                    started.push((done.partition, shards.install(opened)));
                }
                Some(Err(error)) if current => {
                    return Err(DedupStateError::Worker(format!(
                        "open shard {}: {error}",
                        done.partition
                    )));
                }
                // Revoked while it opened: closed unowned (its new owner opens it again).
                Some(_) => tracing::info!(
                    partition = done.partition,
                    "shard opened for an assignment revoked meanwhile; closed"
                ),
                None => {}
            }
        }
        Ok(started)
    }

    /// The partitions assigned and not owned yet (kept paused).
    pub fn unopened(&self) -> Vec<i32> {
        self.book.unopened().collect()
    }

    /// Whether no shard is being opened.
    pub fn is_idle(&self) -> bool {
        self.book.is_idle()
    }

    fn send(&self, job: (i32, u64)) -> Result<(), DedupStateError> {
        self.jobs
            .as_ref()
            .and_then(|jobs| jobs.send(job).ok())
            .ok_or_else(|| DedupStateError::Worker("the opener threads stopped".to_owned()))
    }
}

impl Drop for Openers {
    fn drop(&mut self) {
        // Closing the job queue ends the opener threads once their opens are done.
        self.jobs.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_partition_assigned_again_while_it_opens_waits_for_that_open() {
        let mut book = OpenBook::default();
        assert_eq!(book.request(3, 1), Some((3, 1)));
        assert_eq!(book.request(4, 2), Some((4, 2)));
        // Revoked and assigned twice more while generation 1 opens: only the newest waits.
        assert_eq!(book.request(3, 5), None);
        assert_eq!(book.request(3, 6), None);
        let mut unopened: Vec<i32> = book.unopened().collect();
        unopened.sort_unstable();
        assert_eq!(unopened, vec![3, 3, 4]);
        assert_eq!(book.finished(3), Some((3, 6)));
        assert_eq!(book.finished(4), None);
        assert_eq!(book.finished(3), None);
        assert!(book.is_idle());
    }

    #[test]
    fn assignments_know_which_generation_is_current() {
        let assignments = Assignments::default();
        assignments.assigned(&[0, 1]);
        assert_eq!(assignments.take_to_open(), vec![(0, 1), (1, 2)]);
        assignments.revoked(&[1]);
        assert!(assignments.is_current(0, 1));
        assert!(!assignments.is_current(1, 2));
        assignments.assigned(&[1]);
        assignments.revoked(&[1]);
        assert!(
            assignments.take_to_open().is_empty(),
            "revoked before it was handed out"
        );
        assignments.assigned(&[1]);
        assert!(assignments.is_current(1, 4) && !assignments.is_current(1, 3));
        assignments.clear();
        assert!(!assignments.is_current(0, 1) && assignments.take_to_open().is_empty());
    }

    proptest! {
        /// Whatever the order of requests and finished opens: a partition is never opened by two
        /// jobs at once, and the last generation requested for a partition is always opened
        /// (started at once or after the running open ends).
        #[test]
        fn one_open_per_partition_and_the_newest_generation_is_opened(
            steps in proptest::collection::vec((0..3i32, any::<bool>()), 1..200),
        ) {
            let mut book = OpenBook::default();
            let mut running: HashMap<i32, u64> = HashMap::new();
            let mut newest: HashMap<i32, u64> = HashMap::new();
            let mut opened_last: HashMap<i32, u64> = HashMap::new();
            let mut generation = 0;
            let start = |job: Option<(i32, u64)>, running: &mut HashMap<i32, u64>| -> Result<(), TestCaseError> {
                if let Some((partition, generation)) = job {
                    prop_assert!(running.insert(partition, generation).is_none(), "{partition} opened twice at once");
                }
                Ok(())
            };
            for (partition, request) in steps {
                if request {
                    generation += 1;
                    newest.insert(partition, generation);
                    let job = book.request(partition, generation);
                    start(job, &mut running)?;
                } else if let Some(generation) = running.remove(&partition) {
                    opened_last.insert(partition, generation);
                    let job = book.finished(partition);
                    start(job, &mut running)?;
                }
            }
            // Let every open end.
            while let Some((&partition, &generation)) = running.iter().next() {
                running.remove(&partition);
                opened_last.insert(partition, generation);
                let job = book.finished(partition);
                start(job, &mut running)?;
            }
            prop_assert!(book.is_idle());
            prop_assert_eq!(opened_last, newest);
        }
    }
}
