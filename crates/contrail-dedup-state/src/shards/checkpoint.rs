//! Checkpoints of the owned shards: the processing thread only hands out handles; the RocksDB
//! checkpoints are taken elsewhere while batches keep committing.

use std::path::PathBuf;

use contrail_state::{Checkpointer, StateError};

use super::{ShardSet, lock_slot};

/// A checkpoint of one owned shard for an epoch, to take off the processing thread.
pub struct PendingCheckpoint {
    /// Takes the RocksDB checkpoint while batches keep committing.
    pub checkpointer: Checkpointer,
    /// The RocksDB checkpoint directory (in the staging directory; must not exist).
    pub dir: PathBuf,
    /// Which open of the shard it comes from: SST file names are unique within one open, so
    /// uploads of the same generation may share SST files.
    pub generation: u64,
}

/// What a shard owner checkpointed locally for an epoch (uploaded by the async side).
#[derive(Debug, Clone)]
pub struct LocalCheckpoint {
    /// Input partition.
    pub partition: i32,
    /// Next input offset of the checkpointed state (0: nothing processed yet).
    pub next_offset: i64,
    /// The RocksDB checkpoint directory.
    pub dir: PathBuf,
    /// See [`PendingCheckpoint::generation`].
    pub generation: u64,
}

impl PendingCheckpoint {
    /// Writes the checkpoint (blocking: a memtable flush and file syncs) and reads its offset.
    pub fn take(self) -> Result<LocalCheckpoint, StateError> {
        let _ = std::fs::remove_dir_all(&self.dir);
        let next_offset = self.checkpointer.create(&self.dir)?;
        Ok(LocalCheckpoint {
            partition: self.checkpointer.partition(),
            next_offset: next_offset.unwrap_or(0),
            dir: self.dir,
            generation: self.generation,
        })
    }
}

impl ShardSet {
    /// Checkpoint handles of every owned shard for `epoch`: all the processing thread does for a
    /// checkpoint (the RocksDB checkpoints are taken by [`PendingCheckpoint::take`] elsewhere,
    /// while batches keep committing).
    pub(crate) fn checkpoint(&self, epoch: u64) -> Vec<PendingCheckpoint> {
        // Observed when dropped: includes waiting for a batch in progress on another thread.
        let _pause = self.metrics.checkpoint_pause_seconds.start_timer();
        self.slots(None)
            .into_iter()
            .filter_map(|(partition, generation, slot)| {
                lock_slot(&slot).as_ref().map(|shard| PendingCheckpoint {
                    checkpointer: shard.checkpointer(),
                    dir: self.staging_dir.join(format!("epoch-{epoch}-shard-{partition}")),
                    generation,
                })
            })
            .collect()
    }
}
