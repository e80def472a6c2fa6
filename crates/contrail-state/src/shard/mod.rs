//! One shard: a RocksDB instance holding a partition's per-key state, timers, dedup entries, input
//! offset and outbox. All changes of a micro-batch are committed in one `WriteBatch` — or held in
//! memory with those of the batches after it and committed together at a commit point (`held`).
//!
//! Reads during a batch see the batch's own writes (an overlay in front of RocksDB). Timers are also
//! mirrored in memory (`TimerIndex`) — a `BTreeSet` ordered by time, domain, key, name to find due
//! timers, and an index by key to find a key's timer, sharing one copy of each key and timer name —
//! so timer bookkeeping costs no disk reads; both are rebuilt from the `timers_by_time` family on
//! open (the only family timers are written to). That index is the one part of a shard's state
//! held in memory whole (≈ 190 bytes per timer); RocksDB's block cache and memtables can be bounded
//! for all the shards of a process together ([`StorageMemory`]).

mod checkpoint;
mod held;
mod outbox;
mod storage;
mod timers;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, DB, Direction, IteratorMode};

use crate::error::StateError;
use crate::keys::{self, cf};

pub use checkpoint::Checkpointer;
use held::Held;
pub use held::HeldSummary;
pub use outbox::OutboxRecord;
use outbox::decode_sequence;
pub use storage::StorageMemory;
use storage::options;
use timers::decode_by_time;
pub use timers::{TimeDomain, Timer};
pub(crate) use timers::{TimerEntry, TimerIndex, TimerSlots};

const META_NEXT_OFFSET: &[u8] = b"next_offset";
const META_MAX_EVENT_TIME: &[u8] = b"max_event_time_us";
/// The next outbox sequence number: persisted so that numbers are never reused, even after the
/// outbox drained (a late delivery report can then never acknowledge a newer output).
const META_NEXT_SEQUENCE: &[u8] = b"next_outbox_sequence";
/// How many timers [`Shard::open_unless`] loads between two questions whether to give up (a
/// million timers load in seconds: a question every few milliseconds).
pub const GIVE_UP_EVERY: usize = 4096;

/// What a shard knows about its progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardProgress {
    /// The next input offset to read; `None` if nothing was committed yet.
    pub next_offset: Option<i64>,
    /// Max event time of the shard's input so far (µs); `i64::MIN` if none.
    pub max_event_time_us: i64,
}

/// A shard's RocksDB instance and in-memory indexes.
pub struct Shard {
    /// Shared with [`Checkpointer`]s only while they run; dropping the shard waits for them, so
    /// the database is closed (its lock released) before the shard may be opened again.
    db: Arc<DB>,
    path: PathBuf,
    partition: i32,
    /// The committed timers.
    timers: TimerIndex,
    /// Progress of the batches applied, held ones included.
    progress: ShardProgress,
    /// Progress as of the last commit point.
    persisted: ShardProgress,
    /// Changes applied since the last commit point, not yet written.
    held: Held,
    /// Why a write failed, once one did: the shard then refuses work until reopened.
    failed: Option<String>,
    next_outbox_sequence: u64,
    /// Whether the dedup family may hold entries: it had one on open, or a batch wrote one since.
    dedup_entries: bool,
}

/// Key-value entries of a family.
pub(crate) type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// The pending changes of a batch: per family, per key, the new value (`None`: deleted).
pub(crate) type Overlay = BTreeMap<&'static str, BTreeMap<Vec<u8>, Option<Vec<u8>>>>;

impl Shard {
    /// Opens (or creates) the shard of `partition` at `path`, with RocksDB's own memory defaults.
    pub fn open(path: &Path, partition: i32) -> Result<Shard, StateError> {
        Shard::open_in(path, partition, None)
    }

    /// Opens (or creates) the shard of `partition` at `path`; with `memory`, its block cache and
    /// memtables come out of that shared budget.
    pub fn open_in(path: &Path, partition: i32, memory: Option<&StorageMemory>) -> Result<Shard, StateError> {
        Shard::open_unless(path, partition, memory, &|| false)?.ok_or_else(|| StateError::Storage {
            path: path.display().to_string(),
            message: "the open was given up".to_owned(),
        })
    }

    /// [`Shard::open_in`] that gives up (`Ok(None)`, nothing written) as soon as `give_up` says so
    /// — asked before the open and every [`GIVE_UP_EVERY`] timers while the timer index loads, the
    /// long part of opening a large shard (a shard whose assignment was revoked meanwhile).
    pub fn open_unless(
        path: &Path,
        partition: i32,
        memory: Option<&StorageMemory>,
        give_up: &dyn Fn() -> bool,
    ) -> Result<Option<Shard>, StateError> {
        if give_up() {
            return Ok(None);
        }
        let descriptors = cf::ALL
            .iter()
            .map(|name| ColumnFamilyDescriptor::new(*name, options(memory)));
        let db = DB::open_cf_descriptors(&options(memory), path, descriptors).map_err(|error| {
            StateError::Storage {
                path: path.display().to_string(),
                message: error.to_string(),
            }
        })?;
        let mut shard = Shard {
            db: Arc::new(db),
            path: path.to_owned(),
            partition,
            timers: TimerIndex::default(),
            progress: ShardProgress {
                next_offset: None,
                max_event_time_us: i64::MIN,
            },
            persisted: ShardProgress {
                next_offset: None,
                max_event_time_us: i64::MIN,
            },
            held: Held::default(),
            failed: None,
            next_outbox_sequence: 0,
            dedup_entries: false,
        };
        shard.progress.next_offset = shard.read_meta(META_NEXT_OFFSET)?;
        shard.progress.max_event_time_us = shard.read_meta(META_MAX_EVENT_TIME)?.unwrap_or(i64::MIN);
        shard.persisted = shard.progress;
        // Sized once from RocksDB's estimate (a flight has one or two timers): growing the index
        // by key re-hashes every key in it, a cache miss each.
        let timers = shard
            .db
            .property_int_value_cf(shard.handle(cf::TIMERS_BY_TIME)?, "rocksdb.estimate-num-keys")
            .ok()
            .flatten()
            .unwrap_or(0);
        shard.timers = TimerIndex::with_key_capacity(usize::try_from(timers / 2).unwrap_or(0));
        for (loaded, item) in shard
            .db
            .iterator_cf(shard.handle(cf::TIMERS_BY_TIME)?, IteratorMode::Start)
            .enumerate()
        {
            if loaded % GIVE_UP_EVERY == GIVE_UP_EVERY - 1 && give_up() {
                return Ok(None);
            }
            let (bytes, _) = item.map_err(|error| shard.storage_error(error))?;
            let (fire_at_us, domain, key, name) =
                decode_by_time(&bytes).ok_or_else(|| StateError::Corrupt {
                    path: shard.path.display().to_string(),
                    message: "undecodable timer entry".to_owned(),
                })?;
            shard.timers.insert(fire_at_us, domain, key, name);
        }
        shard.clear_family(cf::TIMERS_BY_KEY)?;
        shard.dedup_entries = shard
            .db
            .iterator_cf(shard.handle(cf::DEDUP)?, IteratorMode::Start)
            .next()
            .is_some();
        if let Some(item) = shard
            .db
            .iterator_cf(shard.handle(cf::OUTBOX)?, IteratorMode::End)
            .next()
        {
            let (bytes, _) = item.map_err(|error| shard.storage_error(error))?;
            shard.next_outbox_sequence = decode_sequence(&bytes)? + 1;
        }
        let persisted = shard
            .read_meta(META_NEXT_SEQUENCE)?
            .map_or(0, |sequence| sequence as u64);
        shard.next_outbox_sequence = shard.next_outbox_sequence.max(persisted);
        shard.held.first_sequence = shard.next_outbox_sequence;
        Ok(Some(shard))
    }

    /// The input partition this shard holds.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// Where its files are.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Progress of the batches applied (held ones included; see [`Shard::persisted_progress`]).
    pub fn progress(&self) -> ShardProgress {
        self.progress
    }

    fn storage_error(&self, error: rocksdb::Error) -> StateError {
        StateError::Storage {
            path: self.path.display().to_string(),
            message: error.to_string(),
        }
    }

    fn handle(&self, name: &str) -> Result<&rocksdb::ColumnFamily, StateError> {
        self.db.cf_handle(name).ok_or_else(|| StateError::Corrupt {
            path: self.path.display().to_string(),
            message: format!("column family {name} is missing"),
        })
    }

    fn read_meta(&self, name: &[u8]) -> Result<Option<i64>, StateError> {
        let bytes = self
            .db
            .get_cf(self.handle(cf::META)?, name)
            .map_err(|error| self.storage_error(error))?;
        Ok(bytes.as_deref().and_then(keys::decode_time))
    }

    /// Reads one entry of a family as applied: held changes, else RocksDB (no batch's overlay).
    pub(crate) fn get(&self, family: &'static str, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        if let Some(value) = self.held.overlay.get(family).and_then(|entries| entries.get(key)) {
            return Ok(value.clone());
        }
        self.db
            .get_cf(self.handle(family)?, key)
            .map_err(|error| self.storage_error(error))
    }

    /// Entries of a family whose keys start with `prefix`, as applied (held changes included).
    pub(crate) fn scan_prefix(&self, family: &'static str, prefix: &[u8]) -> Result<Entries, StateError> {
        let mut entries = Vec::new();
        let iterator = self.db.iterator_cf(
            self.handle(family)?,
            IteratorMode::From(prefix, Direction::Forward),
        );
        for item in iterator {
            let (key, value) = item.map_err(|error| self.storage_error(error))?;
            if !key.starts_with(prefix) {
                break;
            }
            entries.push((key.to_vec(), value.to_vec()));
        }
        let Some(held) = self.held.overlay.get(family) else {
            return Ok(entries);
        };
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = entries.into_iter().collect();
        for (key, value) in held.range(prefix.to_vec()..keys::prefix_end(prefix)) {
            match value {
                Some(value) => merged.insert(key.clone(), value.clone()),
                None => merged.remove(key),
            };
        }
        Ok(merged.into_iter().collect())
    }

    /// The in-memory timer index (committed timers).
    pub(crate) fn timers(&self) -> &TimerIndex {
        &self.timers
    }

    /// Whether the dedup family may hold entries (see [`crate::KeyContext::dedup_in_use`]).
    pub(crate) fn has_dedup_entries(&self) -> bool {
        self.dedup_entries
    }

    /// When `key`'s committed timer `name` in `domain` fires, if it exists.
    pub(crate) fn committed_timer(&self, key: &[u8], domain: TimeDomain, name: &str) -> Option<i64> {
        self.timers.get(key, domain, name)
    }

    /// Deletes everything in a family no longer written (a shard written by an older version).
    fn clear_family(&self, family: &'static str) -> Result<(), StateError> {
        let handle = self.handle(family)?;
        let first = self.db.iterator_cf(handle, IteratorMode::Start).next();
        let last = self.db.iterator_cf(handle, IteratorMode::End).next();
        if let (Some(first), Some(last)) = (first, last) {
            let (first, _) = first.map_err(|error| self.storage_error(error))?;
            let (last, _) = last.map_err(|error| self.storage_error(error))?;
            let mut end = last.to_vec();
            end.push(0);
            self.db
                .delete_range_cf(handle, &*first, &end)
                .map_err(|error| self.storage_error(error))?;
        }
        Ok(())
    }

    /// Approximate bytes on disk (SST files and memtables) across families.
    pub fn approximate_size_bytes(&self) -> u64 {
        self.property_sum("rocksdb.total-sst-files-size")
            + self.property_sum("rocksdb.cur-size-all-mem-tables")
    }

    /// Memory the shard holds outside a shared block cache: its memtables, RocksDB's table
    /// readers (SST index and bloom filter blocks), and the in-memory timer index.
    pub fn memory(&self) -> ShardMemory {
        ShardMemory {
            memtable_bytes: self.property_sum("rocksdb.cur-size-all-mem-tables"),
            table_reader_bytes: self.property_sum("rocksdb.estimate-table-readers-mem"),
            timers: self.timers.len(),
        }
    }

    /// An integer property summed over the column families.
    fn property_sum(&self, property: &str) -> u64 {
        cf::ALL
            .iter()
            .filter_map(|name| self.db.cf_handle(name))
            .filter_map(|handle| self.db.property_int_value_cf(handle, property).ok().flatten())
            .sum()
    }
}

/// What [`Shard::memory`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardMemory {
    /// Bytes of memtables (active and not yet flushed).
    pub memtable_bytes: u64,
    /// Bytes of SST index and filter blocks held by RocksDB's table readers.
    pub table_reader_bytes: u64,
    /// Timers in the in-memory index (every committed timer of the shard).
    pub timers: usize,
}
