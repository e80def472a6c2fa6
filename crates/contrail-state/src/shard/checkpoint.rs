//! Checkpoints of a shard, taken off the thread that commits its batches.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rocksdb::{DB, Options};

use super::{META_NEXT_OFFSET, Shard};
use crate::error::StateError;
use crate::keys::{self, cf};

impl Shard {
    /// A consistent RocksDB checkpoint (hard links where possible) of the committed state in `dir`,
    /// which must not exist.
    pub fn checkpoint(&self, dir: &Path) -> Result<(), StateError> {
        self.checkpointer().create(dir).map(|_| ())
    }

    /// A handle that checkpoints this shard from another thread while batches keep committing.
    pub fn checkpointer(&self) -> Checkpointer {
        Checkpointer {
            db: Arc::clone(&self.db),
            path: self.path.clone(),
            partition: self.partition,
        }
    }
}

/// How long dropping a shard waits for its checkpointers before closing it anyway.
const CHECKPOINTER_WAIT: Duration = Duration::from_secs(120);

impl Drop for Shard {
    fn drop(&mut self) {
        // A checkpointer still running holds the database open; reopening the shard at the same
        // path before it finishes would fail on RocksDB's lock file.
        let started = Instant::now();
        while Arc::strong_count(&self.db) > 1 && started.elapsed() < CHECKPOINTER_WAIT {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Takes RocksDB checkpoints of one shard off the thread that processes its batches.
///
/// Every batch is one atomic `WriteBatch` (state, timers, outbox, input offset), so a checkpoint
/// taken while batches commit holds the shard exactly at some batch boundary; which one is read
/// back from the checkpoint itself ([`Checkpointer::create`] returns its input offset).
pub struct Checkpointer {
    db: Arc<DB>,
    path: PathBuf,
    partition: i32,
}

impl Checkpointer {
    /// The shard's input partition.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// Writes a checkpoint into `dir` (which must not exist) and returns the next input offset
    /// stored in it (`None`: nothing committed yet).
    pub fn create(&self, dir: &Path) -> Result<Option<i64>, StateError> {
        let storage = |path: &Path, error: rocksdb::Error| StateError::Storage {
            path: path.display().to_string(),
            message: error.to_string(),
        };
        self.db
            .flush_wal(true)
            .map_err(|error| storage(&self.path, error))?;
        rocksdb::checkpoint::Checkpoint::new(&self.db)
            .and_then(|checkpoint| checkpoint.create_checkpoint(dir))
            .map_err(|error| storage(&self.path, error))?;
        let copy = DB::open_cf_for_read_only(&Options::default(), dir, cf::ALL, false)
            .map_err(|error| storage(dir, error))?;
        let meta = copy.cf_handle(cf::META).ok_or_else(|| StateError::Corrupt {
            path: dir.display().to_string(),
            message: format!("column family {} is missing", cf::META),
        })?;
        let bytes = copy
            .get_cf(meta, META_NEXT_OFFSET)
            .map_err(|error| storage(dir, error))?;
        Ok(bytes.as_deref().and_then(keys::decode_time))
    }
}
