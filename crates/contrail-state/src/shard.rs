//! One shard: a RocksDB instance holding a partition's per-key state, timers, dedup entries, input
//! offset and outbox. All changes of a micro-batch are committed in one `WriteBatch`.
//!
//! Reads during a batch see the batch's own writes (an overlay in front of RocksDB). Timers are also
//! mirrored in memory (a `BTreeSet` ordered by time, domain, key, name) so finding due timers costs
//! no disk reads; the mirror is rebuilt from the `timers_by_time` family on open.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use rocksdb::{ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options, WriteBatch};
use serde::{Deserialize, Serialize};

use crate::error::StateError;
use crate::keys::{self, cf};

/// Which clock a timer follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TimeDomain {
    /// Fires when the shard's event-time watermark passes it (deterministic on replay).
    EventTime = 0,
    /// Fires when the wall clock passes it (checked between batches).
    ProcessingTime = 1,
}

impl TimeDomain {
    fn byte(self) -> u8 {
        self as u8
    }

    fn from_byte(byte: u8) -> Option<TimeDomain> {
        match byte {
            0 => Some(TimeDomain::EventTime),
            1 => Some(TimeDomain::ProcessingTime),
            _ => None,
        }
    }
}

/// A registered timer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timer {
    /// When it fires, µs.
    pub fire_at_us: i64,
    /// Its clock.
    pub domain: TimeDomain,
    /// The key it belongs to.
    pub key: Vec<u8>,
    /// Its name (one timer per key and name).
    pub name: String,
}

impl Timer {
    fn by_time_key(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(8 + 1 + self.key.len() + 1 + self.name.len());
        bytes.extend_from_slice(&keys::encode_time(self.fire_at_us));
        bytes.push(self.domain.byte());
        bytes.extend_from_slice(&keys::joined(&self.key, self.name.as_bytes()));
        bytes
    }

    fn by_key_key(key: &[u8], domain: TimeDomain, name: &str) -> Vec<u8> {
        let mut part = vec![domain.byte()];
        part.extend_from_slice(name.as_bytes());
        keys::joined(key, &part)
    }

    fn decode_by_time(bytes: &[u8]) -> Option<Timer> {
        let fire_at_us = keys::decode_time(bytes)?;
        let domain = TimeDomain::from_byte(*bytes.get(8)?)?;
        let rest = bytes.get(9..)?;
        let separator = rest.iter().position(|byte| *byte == keys::SEPARATOR)?;
        Some(Timer {
            fire_at_us,
            domain,
            key: rest[..separator].to_vec(),
            name: String::from_utf8(rest[separator + 1..].to_vec()).ok()?,
        })
    }
}

/// An output waiting in the outbox until the broker acknowledges it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxRecord {
    /// Destination topic.
    pub topic: String,
    /// Record key.
    pub key: Vec<u8>,
    /// Record value.
    pub payload: Vec<u8>,
}

const META_NEXT_OFFSET: &[u8] = b"next_offset";
const META_MAX_EVENT_TIME: &[u8] = b"max_event_time_us";
/// The next outbox sequence number: persisted so that numbers are never reused, even after the
/// outbox drained (a late delivery report can then never acknowledge a newer output).
const META_NEXT_SEQUENCE: &[u8] = b"next_outbox_sequence";

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
    db: DB,
    path: PathBuf,
    partition: i32,
    timers: BTreeSet<Timer>,
    progress: ShardProgress,
    next_outbox_sequence: u64,
}

fn options() -> Options {
    let mut options = Options::default();
    options.create_if_missing(true);
    options.create_missing_column_families(true);
    options.set_compression_type(rocksdb::DBCompressionType::Lz4);
    options
}

/// Key-value entries of a family.
pub(crate) type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// One pending change of a batch.
pub(crate) type Overlay = BTreeMap<(&'static str, Vec<u8>), Option<Vec<u8>>>;

impl Shard {
    /// Opens (or creates) the shard of `partition` at `path`.
    pub fn open(path: &Path, partition: i32) -> Result<Shard, StateError> {
        let descriptors = cf::ALL
            .iter()
            .map(|name| ColumnFamilyDescriptor::new(*name, options()));
        let db =
            DB::open_cf_descriptors(&options(), path, descriptors).map_err(|error| StateError::Storage {
                path: path.display().to_string(),
                message: error.to_string(),
            })?;
        let mut shard = Shard {
            db,
            path: path.to_owned(),
            partition,
            timers: BTreeSet::new(),
            progress: ShardProgress {
                next_offset: None,
                max_event_time_us: i64::MIN,
            },
            next_outbox_sequence: 0,
        };
        shard.progress.next_offset = shard.read_meta(META_NEXT_OFFSET)?;
        shard.progress.max_event_time_us = shard.read_meta(META_MAX_EVENT_TIME)?.unwrap_or(i64::MIN);
        for item in shard
            .db
            .iterator_cf(shard.handle(cf::TIMERS_BY_TIME)?, IteratorMode::Start)
        {
            let (bytes, _) = item.map_err(|error| shard.storage_error(error))?;
            let timer = Timer::decode_by_time(&bytes).ok_or_else(|| StateError::Corrupt {
                path: shard.path.display().to_string(),
                message: "undecodable timer entry".to_owned(),
            })?;
            shard.timers.insert(timer);
        }
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
        Ok(shard)
    }

    /// The input partition this shard holds.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// Where its files are.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Progress as of the last commit.
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

    /// Reads one entry of a family as committed (no overlay).
    pub(crate) fn get(&self, family: &'static str, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.db
            .get_cf(self.handle(family)?, key)
            .map_err(|error| self.storage_error(error))
    }

    /// Committed entries of a family whose keys start with `prefix`.
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
        Ok(entries)
    }

    /// The in-memory timer index (committed timers).
    pub(crate) fn timers(&self) -> &BTreeSet<Timer> {
        &self.timers
    }

    /// Every output still in the outbox, in the order it was produced.
    pub fn outbox(&self) -> Result<Vec<(u64, OutboxRecord)>, StateError> {
        let mut records = Vec::new();
        for item in self.db.iterator_cf(self.handle(cf::OUTBOX)?, IteratorMode::Start) {
            let (key, value) = item.map_err(|error| self.storage_error(error))?;
            let record: OutboxRecord = postcard::from_bytes(&value).map_err(|error| StateError::Corrupt {
                path: self.path.display().to_string(),
                message: format!("outbox record: {error}"),
            })?;
            records.push((decode_sequence(&key)?, record));
        }
        Ok(records)
    }

    /// One output of the outbox, if still there (not yet acknowledged).
    pub fn outbox_record(&self, sequence: u64) -> Result<Option<OutboxRecord>, StateError> {
        let Some(bytes) = self.get(cf::OUTBOX, &sequence.to_be_bytes())? else {
            return Ok(None);
        };
        postcard::from_bytes(&bytes)
            .map(Some)
            .map_err(|error| StateError::Corrupt {
                path: self.path.display().to_string(),
                message: format!("outbox record: {error}"),
            })
    }

    /// Removes acknowledged outputs (one small write batch).
    pub fn acknowledge(&self, sequences: &[u64]) -> Result<(), StateError> {
        let mut batch = WriteBatch::default();
        let outbox = self.handle(cf::OUTBOX)?;
        for sequence in sequences {
            batch.delete_cf(outbox, sequence.to_be_bytes());
        }
        self.db.write(batch).map_err(|error| self.storage_error(error))
    }

    /// Commits a batch atomically: overlay writes, timer changes, the outbox records, the next input
    /// offset and the max event time. Returns the outbox sequence numbers assigned, in order.
    pub(crate) fn commit(
        &mut self,
        overlay: Overlay,
        timers_added: BTreeSet<Timer>,
        timers_removed: BTreeSet<Timer>,
        outbox: Vec<OutboxRecord>,
        progress: ShardProgress,
    ) -> Result<Vec<u64>, StateError> {
        let mut batch = WriteBatch::default();
        for ((family, key), value) in &overlay {
            let handle = self.handle(family)?;
            match value {
                Some(value) => batch.put_cf(handle, key, value),
                None => batch.delete_cf(handle, key),
            }
        }
        let by_time = self.handle(cf::TIMERS_BY_TIME)?;
        let by_key = self.handle(cf::TIMERS_BY_KEY)?;
        for timer in &timers_removed {
            batch.delete_cf(by_time, timer.by_time_key());
            batch.delete_cf(by_key, Timer::by_key_key(&timer.key, timer.domain, &timer.name));
        }
        for timer in &timers_added {
            batch.put_cf(by_time, timer.by_time_key(), []);
            batch.put_cf(
                by_key,
                Timer::by_key_key(&timer.key, timer.domain, &timer.name),
                keys::encode_time(timer.fire_at_us),
            );
        }
        let outbox_family = self.handle(cf::OUTBOX)?;
        let mut sequences = Vec::with_capacity(outbox.len());
        for record in &outbox {
            let sequence = self.next_outbox_sequence + sequences.len() as u64;
            let bytes = postcard::to_allocvec(record).map_err(|error| StateError::Corrupt {
                path: self.path.display().to_string(),
                message: format!("outbox encoding: {error}"),
            })?;
            batch.put_cf(outbox_family, sequence.to_be_bytes(), bytes);
            sequences.push(sequence);
        }
        let meta = self.handle(cf::META)?;
        if let Some(next_offset) = progress.next_offset {
            batch.put_cf(meta, META_NEXT_OFFSET, keys::encode_time(next_offset));
        }
        batch.put_cf(
            meta,
            META_MAX_EVENT_TIME,
            keys::encode_time(progress.max_event_time_us),
        );
        let next_sequence = self.next_outbox_sequence + sequences.len() as u64;
        batch.put_cf(meta, META_NEXT_SEQUENCE, keys::encode_time(next_sequence as i64));
        self.db.write(batch).map_err(|error| self.storage_error(error))?;
        // Only after the write succeeded: update the in-memory mirrors.
        self.next_outbox_sequence += sequences.len() as u64;
        for timer in &timers_removed {
            self.timers.remove(timer);
        }
        self.timers.extend(timers_added);
        self.progress = progress;
        Ok(sequences)
    }

    /// A consistent RocksDB checkpoint (hard links where possible) of the committed state in `dir`,
    /// which must not exist.
    pub fn checkpoint(&self, dir: &Path) -> Result<(), StateError> {
        self.db
            .flush_wal(true)
            .map_err(|error| self.storage_error(error))?;
        let checkpoint =
            rocksdb::checkpoint::Checkpoint::new(&self.db).map_err(|error| self.storage_error(error))?;
        checkpoint
            .create_checkpoint(dir)
            .map_err(|error| self.storage_error(error))
    }

    /// Approximate bytes on disk (SST files and memtables) across families.
    pub fn approximate_size_bytes(&self) -> u64 {
        cf::ALL
            .iter()
            .filter_map(|name| self.db.cf_handle(name))
            .map(|handle| {
                let sst = self
                    .db
                    .property_int_value_cf(handle, "rocksdb.total-sst-files-size")
                    .ok()
                    .flatten()
                    .unwrap_or(0);
                let memtable = self
                    .db
                    .property_int_value_cf(handle, "rocksdb.cur-size-all-mem-tables")
                    .ok()
                    .flatten()
                    .unwrap_or(0);
                sst + memtable
            })
            .sum()
    }
}

fn decode_sequence(bytes: &[u8]) -> Result<u64, StateError> {
    let array: [u8; 8] = bytes
        .get(..8)
        .and_then(|slice| slice.try_into().ok())
        .ok_or_else(|| StateError::Corrupt {
            path: String::new(),
            message: "outbox key is not a sequence number".to_owned(),
        })?;
    Ok(u64::from_be_bytes(array))
}
