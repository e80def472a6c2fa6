//! The checkpoint protocol's decisions, as pure functions over plain data (docs/CONTRACT.md,
//! "Checkpoints").
//!
//! A coordinator sends a barrier with an epoch to every shard owner; each owner takes a RocksDB
//! checkpoint of its shards at a batch boundary, uploads it, and acks with each shard's input
//! offset. The coordinator writes the epoch's manifest only when every partition of the input topic
//! acked. These functions decide when an epoch is complete, what may be garbage-collected, and
//! where a shard resumes; the I/O code gathers facts, calls them, and acts on the answer.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// One shard's part of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardCheckpoint {
    /// Input partition (= shard).
    pub partition: i32,
    /// The next input offset to read after restoring this checkpoint.
    pub next_offset: i64,
    /// Where the checkpoint's files are, relative to the checkpoint store root.
    pub location: String,
}

/// The manifest of a complete epoch: one checkpoint per partition of the input topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The epoch.
    pub epoch: u64,
    /// Every partition of the input topic when the barrier was sent.
    pub partitions: BTreeSet<i32>,
    /// One entry per partition.
    pub shards: BTreeMap<i32, ShardCheckpoint>,
    /// When the coordinator wrote it (µs since the epoch, wall clock; informational).
    pub created_at_us: i64,
}

impl Manifest {
    /// Whether every partition has a checkpoint.
    pub fn is_complete(&self) -> bool {
        epoch_complete(&self.partitions, &self.shards)
    }
}

/// An epoch is complete when every expected partition acked (extra acks do not count).
pub fn epoch_complete(expected: &BTreeSet<i32>, acks: &BTreeMap<i32, ShardCheckpoint>) -> bool {
    !expected.is_empty() && expected.iter().all(|partition| acks.contains_key(partition))
}

/// The epoch to start next: one above every epoch ever seen (complete or not), so an abandoned epoch
/// number is never reused.
pub fn next_epoch(seen: &BTreeSet<u64>) -> u64 {
    seen.last().map_or(1, |newest| newest + 1)
}

/// The newest complete manifest.
pub fn newest_complete(manifests: &[Manifest]) -> Option<&Manifest> {
    manifests
        .iter()
        .filter(|manifest| manifest.is_complete())
        .max_by_key(|manifest| manifest.epoch)
}

/// Which epochs' files may be deleted, given every epoch present in the store and which of those
/// have a complete manifest: everything older than the `keep` newest complete epochs. Epochs newer
/// than the newest complete one may still be in progress and are kept; with no complete epoch
/// nothing is deleted (a restore needs something to restore from).
pub fn garbage(present: &BTreeSet<u64>, complete: &BTreeSet<u64>, keep: usize) -> BTreeSet<u64> {
    let keep = keep.max(1);
    let kept_complete: Vec<u64> = complete
        .iter()
        .rev()
        .filter(|epoch| present.contains(epoch))
        .take(keep)
        .copied()
        .collect();
    let Some(&oldest_kept) = kept_complete.last() else {
        return BTreeSet::new();
    };
    present
        .iter()
        .filter(|epoch| **epoch < oldest_kept)
        .copied()
        .collect()
}

/// How a shard starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestorePlan {
    /// The local directory is the freshest state: reopen it and seek to the offset stored in it.
    ReopenLocal,
    /// Restore this epoch's checkpoint (replacing a missing or stale local directory), then seek
    /// to its offset.
    Restore {
        /// The epoch.
        epoch: u64,
        /// The shard's checkpoint in it.
        checkpoint: ShardCheckpoint,
    },
    /// No local directory and no checkpoint of this partition: start empty from the beginning.
    StartEmpty,
}

/// What is on the local volume for a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalShard {
    /// No shard directory (a new pod, or a partition this instance never owned).
    Missing,
    /// A shard directory whose stored next offset is this (`None`: nothing committed).
    Present {
        /// Its stored next input offset.
        next_offset: Option<i64>,
    },
}

/// Decides how shard `partition` starts: from the freshest of the local directory and the newest
/// complete checkpoint. A local directory can be stale when another instance owned the partition
/// meanwhile (rescaling back and forth) — then a checkpoint further ahead replaces it. Both are
/// consistent states of the same input, so either is *correct*; the fresher one reprocesses less.
pub fn restore_plan(local: LocalShard, manifests: &[Manifest], partition: i32) -> RestorePlan {
    let newest = manifests
        .iter()
        .filter(|manifest| manifest.is_complete())
        .filter_map(|manifest| {
            manifest
                .shards
                .get(&partition)
                .map(|checkpoint| (manifest.epoch, checkpoint))
        })
        .max_by_key(|(epoch, _)| *epoch);
    match (local, newest) {
        (LocalShard::Present { next_offset }, Some((_, checkpoint)))
            if checkpoint.next_offset <= next_offset.unwrap_or(0) =>
        {
            RestorePlan::ReopenLocal
        }
        (LocalShard::Present { .. }, None) => RestorePlan::ReopenLocal,
        (_, Some((epoch, checkpoint))) => RestorePlan::Restore {
            epoch,
            checkpoint: checkpoint.clone(),
        },
        (LocalShard::Missing, None) => RestorePlan::StartEmpty,
    }
}

/// Where to seek in the input partition: the offset stored with the state, never a guessed one.
/// `None` (nothing processed yet) means the beginning.
pub fn resume_offset(stored_next_offset: Option<i64>) -> Option<i64> {
    stored_next_offset.filter(|offset| *offset >= 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(partition: i32, next_offset: i64) -> ShardCheckpoint {
        ShardCheckpoint {
            partition,
            next_offset,
            location: format!("epoch/p{partition}"),
        }
    }

    fn manifest(epoch: u64, partitions: &[i32], acked: &[i32]) -> Manifest {
        Manifest {
            epoch,
            partitions: partitions.iter().copied().collect(),
            shards: acked
                .iter()
                .map(|p| (*p, shard(*p, epoch as i64 * 10 + i64::from(*p))))
                .collect(),
            created_at_us: 0,
        }
    }

    /// All subsets of `0..n` as sets.
    fn subsets(n: u64) -> Vec<BTreeSet<u64>> {
        (0..(1u32 << n))
            .map(|mask| {
                (0..n)
                    .filter(|bit| mask & (1 << bit) != 0)
                    .map(|bit| bit + 1)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn completeness_needs_every_expected_partition() {
        let expected: BTreeSet<i32> = [0, 1, 2].into();
        for mask in 0..8u32 {
            let acks: BTreeMap<i32, ShardCheckpoint> = (0..3)
                .filter(|p| mask & (1 << p) != 0)
                .map(|p| (p, shard(p, 0)))
                .collect();
            assert_eq!(epoch_complete(&expected, &acks), mask == 7, "acks {mask:03b}");
        }
        let extra: BTreeMap<i32, ShardCheckpoint> =
            [(0, shard(0, 0)), (1, shard(1, 0)), (7, shard(7, 0))].into();
        assert!(
            !epoch_complete(&expected, &extra),
            "an unexpected partition does not stand in for a missing one"
        );
        assert!(
            !epoch_complete(&BTreeSet::new(), &BTreeMap::new()),
            "no partitions: nothing to be complete about"
        );
    }

    /// Exhaustive over 5 epochs: every combination of present and complete epochs and keep 1..=3.
    #[test]
    fn garbage_collection_is_safe_in_every_small_case() {
        for present in subsets(5) {
            for complete in subsets(5) {
                for keep in 1..=3 {
                    let deleted = garbage(&present, &complete, keep);
                    let complete_present: Vec<u64> = complete.intersection(&present).copied().collect();
                    assert!(deleted.is_subset(&present));
                    match complete_present.last() {
                        None => assert!(deleted.is_empty(), "nothing complete: keep everything"),
                        Some(newest) => {
                            assert!(!deleted.contains(newest), "the newest complete epoch survives");
                            assert!(
                                deleted.iter().all(|epoch| epoch < newest),
                                "in-progress epochs survive"
                            );
                            let kept: Vec<u64> = complete_present.iter().rev().take(keep).copied().collect();
                            assert!(
                                kept.iter().all(|epoch| !deleted.contains(epoch)),
                                "the {keep} newest complete survive"
                            );
                            let oldest_kept = *kept.last().expect("non-empty");
                            let expected: BTreeSet<u64> =
                                present.iter().filter(|e| **e < oldest_kept).copied().collect();
                            assert_eq!(deleted, expected, "everything older goes");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn restore_takes_the_newest_complete_checkpoint_of_the_partition() {
        let manifests = vec![
            manifest(1, &[0, 1], &[0, 1]),
            manifest(2, &[0, 1], &[0, 1]),
            manifest(3, &[0, 1], &[0]), // incomplete: never restored from
        ];
        let fresh = LocalShard::Present {
            next_offset: Some(25),
        };
        assert_eq!(restore_plan(fresh, &manifests, 0), RestorePlan::ReopenLocal);
        assert_eq!(restore_plan(fresh, &[], 0), RestorePlan::ReopenLocal);
        let missing = LocalShard::Missing;
        assert_eq!(
            restore_plan(missing, &manifests, 1),
            RestorePlan::Restore {
                epoch: 2,
                checkpoint: shard(1, 21)
            }
        );
        assert_eq!(
            restore_plan(missing, &manifests, 0),
            RestorePlan::Restore {
                epoch: 2,
                checkpoint: shard(0, 20)
            }
        );
        assert_eq!(restore_plan(missing, &manifests, 5), RestorePlan::StartEmpty);
        assert_eq!(restore_plan(missing, &[], 0), RestorePlan::StartEmpty);
        // A stale local directory (the partition was owned elsewhere meanwhile) is replaced.
        let stale = LocalShard::Present { next_offset: Some(3) };
        assert_eq!(
            restore_plan(stale, &manifests, 0),
            RestorePlan::Restore {
                epoch: 2,
                checkpoint: shard(0, 20)
            }
        );
        let empty = LocalShard::Present { next_offset: None };
        assert_eq!(
            restore_plan(empty, &manifests, 1),
            RestorePlan::Restore {
                epoch: 2,
                checkpoint: shard(1, 21)
            }
        );
    }

    #[test]
    fn exhaustive_restore_never_uses_an_incomplete_epoch() {
        for complete_mask in 0..16u32 {
            let manifests: Vec<Manifest> = (1..=4u64)
                .map(|epoch| {
                    let acked: &[i32] = if complete_mask & (1 << (epoch - 1)) != 0 {
                        &[0, 1]
                    } else {
                        &[0]
                    };
                    manifest(epoch, &[0, 1], acked)
                })
                .collect();
            let newest_complete_epoch = (1..=4u64)
                .rev()
                .find(|epoch| complete_mask & (1 << (epoch - 1)) != 0);
            for partition in [0, 1] {
                match (
                    restore_plan(LocalShard::Missing, &manifests, partition),
                    newest_complete_epoch,
                ) {
                    (RestorePlan::Restore { epoch, .. }, Some(expected)) => assert_eq!(epoch, expected),
                    (RestorePlan::StartEmpty, None) => {}
                    (plan, expected) => {
                        panic!("mask {complete_mask:04b} partition {partition}: {plan:?} vs {expected:?}")
                    }
                }
            }
        }
    }

    /// Exhaustive over local offsets 0..=30 and checkpoint offsets: the plan never goes backwards —
    /// the resume offset is the maximum of what is available.
    #[test]
    fn the_plan_resumes_from_the_freshest_state() {
        for local in (0..=30)
            .map(|offset| LocalShard::Present {
                next_offset: Some(offset),
            })
            .chain([LocalShard::Present { next_offset: None }, LocalShard::Missing])
        {
            for checkpoint_offset in [None, Some(0), Some(10), Some(20), Some(30)] {
                let manifests: Vec<Manifest> = checkpoint_offset
                    .map(|offset| Manifest {
                        epoch: 1,
                        partitions: [0].into(),
                        shards: [(0, shard(0, offset))].into(),
                        created_at_us: 0,
                    })
                    .into_iter()
                    .collect();
                let local_offset = match local {
                    LocalShard::Present { next_offset } => Some(next_offset.unwrap_or(0)),
                    LocalShard::Missing => None,
                };
                let resumed = match restore_plan(local, &manifests, 0) {
                    RestorePlan::ReopenLocal => local_offset.expect("reopen needs a local directory"),
                    RestorePlan::Restore { checkpoint, .. } => checkpoint.next_offset,
                    RestorePlan::StartEmpty => 0,
                };
                let best = local_offset
                    .into_iter()
                    .chain(checkpoint_offset)
                    .max()
                    .unwrap_or(0);
                assert_eq!(resumed, best, "local {local:?}, checkpoint {checkpoint_offset:?}");
            }
        }
    }

    #[test]
    fn epochs_are_never_reused_and_offsets_never_guessed() {
        assert_eq!(next_epoch(&BTreeSet::new()), 1);
        assert_eq!(next_epoch(&[1, 2, 7].into()), 8);
        assert_eq!(resume_offset(None), None);
        assert_eq!(resume_offset(Some(42)), Some(42));
        assert_eq!(resume_offset(Some(-1)), None);
        let manifests = vec![
            manifest(4, &[0], &[0]),
            manifest(9, &[0], &[0]),
            manifest(10, &[0, 1], &[0]),
        ];
        assert_eq!(newest_complete(&manifests).map(|m| m.epoch), Some(9));
    }
}
