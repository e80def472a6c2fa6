//! One shard: a RocksDB instance holding a partition's per-key state, timers, dedup entries, input
//! offset and outbox. All changes of a micro-batch are committed in one `WriteBatch`.
//!
//! Reads during a batch see the batch's own writes (an overlay in front of RocksDB). Timers are also
//! mirrored in memory (`TimerIndex`) — a `BTreeSet` ordered by time, domain, key, name to find due
//! timers, and an index by key to find a key's timer, sharing one copy of each key and timer name —
//! so timer bookkeeping costs no disk reads; both are rebuilt from the `timers_by_time` family on
//! open (the only family timers are written to). That index is the one part of a shard's state
//! held in memory whole (≈ 190 bytes per timer); RocksDB's block cache and memtables can be bounded
//! for all the shards of a process together ([`StorageMemory`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// A timer as the engine keeps it: like [`Timer`], with the key and the name behind `Arc`s, so
/// that the in-memory index holds one copy of a key for all its timers and one copy of each
/// timer name. Orders exactly as [`Timer`] does (time, domain, key, name): the fire order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct TimerEntry {
    pub(crate) fire_at_us: i64,
    pub(crate) domain: TimeDomain,
    pub(crate) key: Arc<[u8]>,
    pub(crate) name: Arc<str>,
}

impl TimerEntry {
    pub(crate) fn new(fire_at_us: i64, domain: TimeDomain, key: &[u8], name: &str) -> TimerEntry {
        TimerEntry {
            fire_at_us,
            domain,
            key: Arc::from(key),
            name: Arc::from(name),
        }
    }

    /// The timer as the processor API shows it.
    pub(crate) fn to_timer(&self) -> Timer {
        Timer {
            fire_at_us: self.fire_at_us,
            domain: self.domain,
            key: self.key.to_vec(),
            name: self.name.to_string(),
        }
    }

    /// Its key in the `timers_by_time` family: `time ∙ domain ∙ key ∙ 0x00 ∙ name`.
    fn by_time_key(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(8 + 1 + self.key.len() + 1 + self.name.len());
        bytes.extend_from_slice(&keys::encode_time(self.fire_at_us));
        bytes.push(self.domain.byte());
        bytes.extend_from_slice(&keys::joined(&self.key, self.name.as_bytes()));
        bytes
    }
}

/// A `timers_by_time` entry's fire time, domain, key and name (borrowed from `bytes`).
fn decode_by_time(bytes: &[u8]) -> Option<(i64, TimeDomain, &[u8], &str)> {
    let fire_at_us = keys::decode_time(bytes)?;
    let domain = TimeDomain::from_byte(*bytes.get(8)?)?;
    let rest = bytes.get(9..)?;
    let separator = rest.iter().position(|byte| *byte == keys::SEPARATOR)?;
    let name = std::str::from_utf8(&rest[separator + 1..]).ok()?;
    Some((fire_at_us, domain, &rest[..separator], name))
}

/// A fast hasher for the in-memory indexes (keys and timer names): each 8-byte word is mixed in
/// with a folded multiply (the 128-bit product's halves XORed, so every input bit reaches every
/// output bit), from a per-process random seed. SipHash (std's default) was ≈ 15 % of the time to
/// rebuild the timer index of a shard. Like foldhash, it is not a keyed cryptographic hash: the
/// seed makes collisions differ per process, but it is no proof against someone who can watch
/// the table's timing and choose the keys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FastHash(u64);

/// The odd constant every word is multiplied by (2^64 divided by the golden ratio).
const FAST_HASH_MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

impl FastHash {
    /// Mixes `word` into the state: folded multiply of (state XOR word).
    fn mix(&mut self, word: u64) {
        let product = u128::from(self.0 ^ word) * u128::from(FAST_HASH_MULTIPLIER);
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

impl Default for FastHash {
    fn default() -> Self {
        static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        FastHash(*SEED.get_or_init(|| {
            use std::hash::BuildHasher;
            std::collections::hash_map::RandomState::new().hash_one(0x636f_6e74_7261_696c_u64)
        }))
    }
}

impl std::hash::Hasher for FastHash {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.mix(u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8])));
        }
        let mut tail = [0u8; 8];
        tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        // The length keeps "ab" and "ab\0" apart.
        self.mix(u64::from_le_bytes(tail) ^ (bytes.len() as u64).rotate_left(56));
    }

    fn write_u8(&mut self, byte: u8) {
        self.mix(u64::from(byte));
    }

    fn write_usize(&mut self, value: usize) {
        self.mix(value as u64);
    }

    fn finish(&self) -> u64 {
        // Already mixed both ways: hashbrown takes its control bits from the top, its bucket from
        // the bottom.
        self.0
    }
}

type FastHashMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FastHash>>;

/// One timer of a key in [`TimerIndex::by_key`]: domain, name, fire time.
type KeyTimer = (TimeDomain, Arc<str>, i64);

/// A key's timers in [`TimerIndex::by_key`], with the shared copy of the key.
#[derive(Debug)]
struct KeyTimers {
    key: Arc<[u8]>,
    /// Exactly as many as the key has (a key has one or a few).
    timers: Box<[KeyTimer]>,
}

/// The committed timers in memory: in fire order (to find due timers) and by key (to find a key's
/// timer), both without a disk read. Each key and each timer name is stored once and shared by
/// the entries that use it; a name is let go with the last committed timer that uses it (counted,
/// not read off the `Arc`: callers may hold clones of entries, e.g. the engine's cursors).
#[derive(Debug, Default)]
pub(crate) struct TimerIndex {
    by_time: BTreeSet<TimerEntry>,
    by_key: FastHashMap<Arc<[u8]>, KeyTimers>,
    /// Each name in use, with how many committed timers use it.
    names: FastHashMap<Arc<str>, usize>,
}

/// The shared copy of `name`, counted as used by one more timer.
fn intern(names: &mut FastHashMap<Arc<str>, usize>, name: &str) -> Arc<str> {
    if let Some((shared, _)) = names.get_key_value(name) {
        let shared = Arc::clone(shared);
        if let Some(uses) = names.get_mut(name) {
            *uses += 1;
        }
        return shared;
    }
    let shared: Arc<str> = Arc::from(name);
    names.insert(Arc::clone(&shared), 1);
    shared
}

/// One timer fewer uses `name`; the last one lets it go.
fn release(names: &mut FastHashMap<Arc<str>, usize>, name: &str) {
    if let Some(uses) = names.get_mut(name) {
        *uses -= 1;
        if *uses == 0 {
            names.remove(name);
        }
    }
}

impl TimerIndex {
    /// An empty index with room for `keys` keys without growing.
    pub(crate) fn with_key_capacity(keys: usize) -> TimerIndex {
        TimerIndex {
            by_key: FastHashMap::with_capacity_and_hasher(keys, Default::default()),
            ..TimerIndex::default()
        }
    }

    /// Every committed timer, in fire order.
    pub(crate) fn by_time(&self) -> &BTreeSet<TimerEntry> {
        &self.by_time
    }

    pub(crate) fn len(&self) -> usize {
        self.by_time.len()
    }

    /// How many distinct timer names committed timers use.
    #[cfg(test)]
    pub(crate) fn names_in_use(&self) -> usize {
        self.names.len()
    }

    /// When `key`'s timer `name` in `domain` fires, if it exists.
    pub(crate) fn get(&self, key: &[u8], domain: TimeDomain, name: &str) -> Option<i64> {
        self.by_key
            .get(key)?
            .timers
            .iter()
            .find_map(|(timer_domain, timer_name, fire_at)| {
                (*timer_domain == domain && &**timer_name == name).then_some(*fire_at)
            })
    }

    /// `key`'s timers.
    pub(crate) fn of_key(&self, key: &[u8]) -> Vec<TimerEntry> {
        let Some(entry) = self.by_key.get(key) else {
            return Vec::new();
        };
        entry
            .timers
            .iter()
            .map(|(domain, name, fire_at_us)| TimerEntry {
                fire_at_us: *fire_at_us,
                domain: *domain,
                key: Arc::clone(&entry.key),
                name: Arc::clone(name),
            })
            .collect()
    }

    /// Adds a timer; one timer per key, domain and name (an existing one is moved).
    pub(crate) fn insert(&mut self, fire_at_us: i64, domain: TimeDomain, key: &[u8], name: &str) {
        let (key, name) = match self.by_key.get_mut(key) {
            Some(entry) => {
                let existing = entry
                    .timers
                    .iter_mut()
                    .find(|(timer_domain, timer_name, _)| *timer_domain == domain && &**timer_name == name);
                match existing {
                    Some(timer) => {
                        let previous = std::mem::replace(&mut timer.2, fire_at_us);
                        let name = Arc::clone(&timer.1);
                        self.by_time.remove(&TimerEntry {
                            fire_at_us: previous,
                            domain,
                            key: Arc::clone(&entry.key),
                            name: Arc::clone(&name),
                        });
                        (Arc::clone(&entry.key), name)
                    }
                    None => {
                        let name = intern(&mut self.names, name);
                        let mut timers = Vec::with_capacity(entry.timers.len() + 1);
                        timers.extend(entry.timers.iter().cloned());
                        timers.push((domain, Arc::clone(&name), fire_at_us));
                        entry.timers = timers.into_boxed_slice();
                        (Arc::clone(&entry.key), name)
                    }
                }
            }
            None => {
                let name = intern(&mut self.names, name);
                let shared: Arc<[u8]> = Arc::from(key);
                self.by_key.insert(
                    Arc::clone(&shared),
                    KeyTimers {
                        key: Arc::clone(&shared),
                        timers: Box::new([(domain, Arc::clone(&name), fire_at_us)]),
                    },
                );
                (shared, name)
            }
        };
        self.by_time.insert(TimerEntry {
            fire_at_us,
            domain,
            key,
            name,
        });
    }

    /// Removes `key`'s timer `name` in `domain` firing at `fire_at_us`, if present.
    pub(crate) fn remove(&mut self, fire_at_us: i64, domain: TimeDomain, key: &[u8], name: &str) {
        let Some(entry) = self.by_key.get_mut(key) else {
            return;
        };
        let Some(position) = entry
            .timers
            .iter()
            .position(|(timer_domain, timer_name, fire_at)| {
                *timer_domain == domain && &**timer_name == name && *fire_at == fire_at_us
            })
        else {
            return;
        };
        let mut timers = entry.timers.to_vec();
        let (_, name, _) = timers.remove(position);
        self.by_time.remove(&TimerEntry {
            fire_at_us,
            domain,
            key: Arc::clone(&entry.key),
            name: Arc::clone(&name),
        });
        if timers.is_empty() {
            self.by_key.remove(key);
        } else {
            entry.timers = timers.into_boxed_slice();
        }
        release(&mut self.names, &name);
    }
}

/// An output waiting in the outbox until the broker acknowledges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRecord {
    /// Destination topic.
    pub topic: String,
    /// Record key.
    pub key: Vec<u8>,
    /// Record value.
    pub payload: Vec<u8>,
    /// The trace context of the input it was emitted for ([`crate::InputRecord::trace`]): kept
    /// with the output so that a re-send after a restart carries the context it was emitted with.
    pub trace: Option<Vec<u8>>,
}

const META_NEXT_OFFSET: &[u8] = b"next_offset";
const META_MAX_EVENT_TIME: &[u8] = b"max_event_time_us";
/// The next outbox sequence number: persisted so that numbers are never reused, even after the
/// outbox drained (a late delivery report can then never acknowledge a newer output).
const META_NEXT_SEQUENCE: &[u8] = b"next_outbox_sequence";

/// Values per (key, time domain, timer name), looked up without allocating: per key, a short list
/// (a key has a handful of timers).
#[derive(Debug, Default)]
pub(crate) struct TimerSlots<T> {
    by_key: FastHashMap<Vec<u8>, Vec<Slot<T>>>,
}

/// One timer's entry in [`TimerSlots`]: its domain, its name and the value.
type Slot<T> = (TimeDomain, Box<str>, T);

impl<T: Copy> TimerSlots<T> {
    /// The value of `key`'s timer `name` in `domain`, if any.
    pub(crate) fn get(&self, key: &[u8], domain: TimeDomain, name: &str) -> Option<T> {
        self.by_key
            .get(key)?
            .iter()
            .find_map(|(slot_domain, slot_name, value)| {
                (*slot_domain == domain && &**slot_name == name).then_some(*value)
            })
    }

    /// Sets the value of `key`'s timer `name` in `domain`.
    pub(crate) fn set(&mut self, key: &[u8], domain: TimeDomain, name: &str, value: T) {
        let slots = match self.by_key.get_mut(key) {
            Some(slots) => slots,
            None => self.by_key.entry(key.to_vec()).or_default(),
        };
        match slots
            .iter_mut()
            .find(|(slot_domain, slot_name, _)| *slot_domain == domain && &**slot_name == name)
        {
            Some(slot) => slot.2 = value,
            None => slots.push((domain, name.into(), value)),
        }
    }
}

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
    progress: ShardProgress,
    next_outbox_sequence: u64,
    /// Whether the dedup family may hold entries: it had one on open, or a batch wrote one since.
    dedup_entries: bool,
}

fn options(memory: Option<&StorageMemory>) -> Options {
    let mut options = Options::default();
    options.create_if_missing(true);
    options.create_missing_column_families(true);
    options.set_compression_type(rocksdb::DBCompressionType::Lz4);
    // Most point reads miss (a new flight's state, an event id never seen): bloom filters answer
    // a miss without searching each memtable and SST file.
    let mut table = rocksdb::BlockBasedOptions::default();
    table.set_bloom_filter(10.0, false);
    table.set_whole_key_filtering(true);
    if let Some(memory) = memory {
        table.set_block_cache(&memory.block_cache);
        options.set_write_buffer_manager(&memory.memtables);
    }
    options.set_block_based_table_factory(&table);
    options.set_memtable_whole_key_filtering(true);
    options.set_memtable_prefix_bloom_ratio(0.02);
    options
}

/// RocksDB memory that the shards of one process share: one block cache (SST data blocks read
/// back) and one budget for every shard's memtables. Without it each column family of each shard
/// gets RocksDB's defaults — its own 32 MiB block cache and up to two 64 MiB memtables — so a pod's
/// memory grows with the partitions it owns. Cheap to clone (handles to the same cache and budget).
#[derive(Clone)]
pub struct StorageMemory {
    block_cache: rocksdb::Cache,
    memtables: rocksdb::WriteBufferManager,
    block_cache_bytes: usize,
    memtable_bytes: usize,
}

impl std::fmt::Debug for StorageMemory {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("StorageMemory")
            .field("block_cache_bytes", &self.block_cache_bytes)
            .field("memtable_bytes", &self.memtable_bytes)
            .finish()
    }
}

impl StorageMemory {
    /// A block cache of `block_cache_bytes` and a memtable budget of `memtable_bytes`: once the
    /// shards' mutable memtables together pass 7/8 of it (or all memtables pass it while the
    /// mutable ones hold half), the shard being written flushes its oldest memtable. A soft
    /// target: writes are not stalled, and memtables being flushed still count.
    pub fn new(block_cache_bytes: usize, memtable_bytes: usize) -> StorageMemory {
        StorageMemory {
            block_cache: rocksdb::Cache::new_lru_cache(block_cache_bytes),
            memtables: rocksdb::WriteBufferManager::new_write_buffer_manager(memtable_bytes, false),
            block_cache_bytes,
            memtable_bytes,
        }
    }

    /// Bytes in the block cache now.
    pub fn block_cache_usage_bytes(&self) -> usize {
        self.block_cache.get_usage()
    }

    /// Bytes of memtables now, all shards together.
    pub fn memtable_usage_bytes(&self) -> usize {
        self.memtables.get_usage()
    }
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
            next_outbox_sequence: 0,
            dedup_entries: false,
        };
        shard.progress.next_offset = shard.read_meta(META_NEXT_OFFSET)?;
        shard.progress.max_event_time_us = shard.read_meta(META_MAX_EVENT_TIME)?.unwrap_or(i64::MIN);
        // Sized once from RocksDB's estimate (a flight has one or two timers): growing the index
        // by key re-hashes every key in it, a cache miss each.
        let timers = shard
            .db
            .property_int_value_cf(shard.handle(cf::TIMERS_BY_TIME)?, "rocksdb.estimate-num-keys")
            .ok()
            .flatten()
            .unwrap_or(0);
        shard.timers = TimerIndex::with_key_capacity(usize::try_from(timers / 2).unwrap_or(0));
        for item in shard
            .db
            .iterator_cf(shard.handle(cf::TIMERS_BY_TIME)?, IteratorMode::Start)
        {
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

    /// Every output still in the outbox, in the order it was produced.
    pub fn outbox(&self) -> Result<Vec<(u64, OutboxRecord)>, StateError> {
        let mut records = Vec::new();
        for item in self.db.iterator_cf(self.handle(cf::OUTBOX)?, IteratorMode::Start) {
            let (key, value) = item.map_err(|error| self.storage_error(error))?;
            let record = decode_outbox_record(&value).ok_or_else(|| StateError::Corrupt {
                path: self.path.display().to_string(),
                message: "outbox record does not decode".to_owned(),
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
        decode_outbox_record(&bytes)
            .map(Some)
            .ok_or_else(|| StateError::Corrupt {
                path: self.path.display().to_string(),
                message: "outbox record does not decode".to_owned(),
            })
    }

    /// Removes acknowledged outputs (one small write batch: a range deletion per run of
    /// consecutive sequence numbers — acknowledgements mostly arrive in order — so a batch of
    /// outputs costs one entry, not one per output).
    pub fn acknowledge(&self, sequences: &[u64]) -> Result<(), StateError> {
        let mut batch = WriteBatch::default();
        let outbox = self.handle(cf::OUTBOX)?;
        for run in consecutive_runs(sequences) {
            if run.end - run.start == 1 {
                batch.delete_cf(outbox, run.start.to_be_bytes());
            } else {
                batch.delete_range_cf(outbox, run.start.to_be_bytes(), run.end.to_be_bytes());
            }
        }
        self.db.write(batch).map_err(|error| self.storage_error(error))
    }

    /// Commits a batch atomically: overlay writes, timer changes, the outbox records, the next input
    /// offset and the max event time. Returns the outbox sequence numbers assigned, in order.
    pub(crate) fn commit(
        &mut self,
        overlay: Overlay,
        timers_added: BTreeSet<TimerEntry>,
        timers_removed: BTreeSet<TimerEntry>,
        outbox: &[OutboxRecord],
        progress: ShardProgress,
    ) -> Result<Vec<u64>, StateError> {
        let mut batch = WriteBatch::default();
        for (family, entries) in &overlay {
            let handle = self.handle(family)?;
            for (key, value) in entries {
                match value {
                    Some(value) => batch.put_cf(handle, key, value),
                    None => batch.delete_cf(handle, key),
                }
            }
        }
        let by_time = self.handle(cf::TIMERS_BY_TIME)?;
        for timer in &timers_removed {
            batch.delete_cf(by_time, timer.by_time_key());
        }
        for timer in &timers_added {
            batch.put_cf(by_time, timer.by_time_key(), []);
        }
        let outbox_family = self.handle(cf::OUTBOX)?;
        let mut sequences = Vec::with_capacity(outbox.len());
        let mut bytes = Vec::new();
        for record in outbox {
            let sequence = self.next_outbox_sequence + sequences.len() as u64;
            encode_outbox_record(record, &mut bytes);
            batch.put_cf(outbox_family, sequence.to_be_bytes(), &bytes);
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
        self.dedup_entries |= overlay.contains_key(cf::DEDUP);
        for timer in &timers_removed {
            self.timers
                .remove(timer.fire_at_us, timer.domain, &timer.key, &timer.name);
        }
        for timer in &timers_added {
            self.timers
                .insert(timer.fire_at_us, timer.domain, &timer.key, &timer.name);
        }
        self.progress = progress;
        Ok(sequences)
    }

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

/// The distinct `sequences` as ranges of consecutive numbers, ascending.
fn consecutive_runs(sequences: &[u64]) -> Vec<std::ops::Range<u64>> {
    let mut sorted = sequences.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<std::ops::Range<u64>> = Vec::new();
    for sequence in sorted {
        match runs.last_mut() {
            Some(run) if run.end == sequence => run.end += 1,
            _ => runs.push(sequence..sequence.saturating_add(1)),
        }
    }
    runs
}

/// Encodes an outbox record into `bytes` (cleared first): each field a varint length and its
/// bytes — topic, key, payload exactly as `postcard` encodes the three-field record earlier
/// versions wrote — then, only for a traced output, its trace context as a fourth field. Records
/// without one are byte for byte what earlier versions wrote, and theirs read back here.
fn encode_outbox_record(record: &OutboxRecord, bytes: &mut Vec<u8>) {
    fn field(bytes: &mut Vec<u8>, value: &[u8]) {
        let mut length = value.len() as u64;
        while length >= 0x80 {
            bytes.push((length as u8) | 0x80);
            length >>= 7;
        }
        bytes.push(length as u8);
        bytes.extend_from_slice(value);
    }
    bytes.clear();
    let trace = record.trace.as_deref();
    bytes.reserve(
        record.topic.len() + record.key.len() + record.payload.len() + trace.map_or(0, <[u8]>::len) + 16,
    );
    field(bytes, record.topic.as_bytes());
    field(bytes, &record.key);
    field(bytes, &record.payload);
    if let Some(trace) = trace {
        field(bytes, trace);
    }
}

/// Decodes what [`encode_outbox_record`] wrote; `None` for anything else (never panics).
fn decode_outbox_record(mut bytes: &[u8]) -> Option<OutboxRecord> {
    fn field<'a>(bytes: &mut &'a [u8]) -> Option<&'a [u8]> {
        let mut length: u64 = 0;
        let mut shift = 0u32;
        loop {
            let (&byte, rest) = bytes.split_first()?;
            *bytes = rest;
            length |= u64::from(byte & 0x7f).checked_shl(shift)?;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 63 {
                return None;
            }
        }
        let length = usize::try_from(length).ok()?;
        let (value, rest) = (bytes.get(..length)?, bytes.get(length..)?);
        *bytes = rest;
        Some(value)
    }
    let topic = std::str::from_utf8(field(&mut bytes)?).ok()?.to_owned();
    let key = field(&mut bytes)?.to_vec();
    let payload = field(&mut bytes)?.to_vec();
    let trace = if bytes.is_empty() {
        None
    } else {
        Some(field(&mut bytes)?.to_vec())
    };
    bytes.is_empty().then_some(OutboxRecord {
        topic,
        key,
        payload,
        trace,
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The record earlier versions wrote (and `postcard` encoded).
    #[derive(serde::Serialize)]
    struct EarlierOutboxRecord {
        topic: String,
        key: Vec<u8>,
        payload: Vec<u8>,
    }

    proptest! {
        /// Every record reads back as written, whatever the field sizes (varint lengths of 1 to 3
        /// bytes); an untraced record is byte for byte what earlier versions wrote with `postcard`,
        /// so an outbox written before an upgrade is read after it.
        #[test]
        fn outbox_records_read_back_as_written_and_as_earlier_versions_wrote_them(
            topic in "[a-z.]{0,40}",
            key in prop::collection::vec(any::<u8>(), 0..200),
            payload_len in prop_oneof![0usize..200, 16_000usize..17_000, 2_097_000usize..2_097_200],
            trace in prop::option::of(prop::collection::vec(any::<u8>(), 0..60)),
        ) {
            let record = OutboxRecord { topic, key, payload: vec![7; payload_len], trace };
            let mut bytes = vec![1, 2, 3];
            encode_outbox_record(&record, &mut bytes);
            prop_assert_eq!(decode_outbox_record(&bytes), Some(record.clone()));
            if record.trace.is_none() {
                let earlier = EarlierOutboxRecord {
                    topic: record.topic.clone(),
                    key: record.key.clone(),
                    payload: record.payload.clone(),
                };
                prop_assert_eq!(&bytes, &postcard::to_allocvec(&earlier).expect("postcard"));
            }
        }

        /// Arbitrary bytes never panic the decoder (a corrupt outbox is an error, not a crash).
        #[test]
        fn the_outbox_decoder_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode_outbox_record(&bytes);
        }
    }

    proptest! {
        /// The runs cover exactly the given sequence numbers.
        #[test]
        fn consecutive_runs_cover_exactly_the_sequences(sequences in prop::collection::vec(0u64..64, 0..40)) {
            let runs = consecutive_runs(&sequences);
            let covered: std::collections::BTreeSet<u64> = runs.iter().flat_map(Clone::clone).collect();
            let given: std::collections::BTreeSet<u64> = sequences.iter().copied().collect();
            prop_assert_eq!(covered, given);
            prop_assert!(runs.windows(2).all(|pair| pair[0].end < pair[1].start), "{:?}", runs);
        }
    }

    /// Acknowledging removes exactly the acknowledged outputs, in and out of order.
    #[test]
    fn acknowledged_outputs_leave_the_outbox_and_no_other() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut shard = Shard::open(&dir.path().join("s"), 0).expect("open");
        let outbox: Vec<OutboxRecord> = (0..10)
            .map(|n| OutboxRecord {
                topic: "t".into(),
                key: vec![n],
                payload: vec![n],
                trace: (n % 2 == 0).then(|| vec![n; 55]),
            })
            .collect();
        let progress = shard.progress();
        let sequences = shard
            .commit(
                Overlay::new(),
                BTreeSet::new(),
                BTreeSet::new(),
                &outbox,
                progress,
            )
            .expect("commit");
        shard
            .acknowledge(&[
                sequences[0],
                sequences[1],
                sequences[2],
                sequences[5],
                sequences[7],
                sequences[6],
            ])
            .expect("ack");
        let left: Vec<u64> = shard
            .outbox()
            .expect("outbox")
            .into_iter()
            .map(|(sequence, _)| sequence)
            .collect();
        assert_eq!(left, [sequences[3], sequences[4], sequences[8], sequences[9]]);
        drop(shard);
        let shard = Shard::open(&dir.path().join("s"), 0).expect("reopen");
        assert_eq!(shard.outbox().expect("outbox").len(), 4, "after a reopen too");
    }

    #[test]
    fn timer_slots_keep_one_value_per_key_domain_and_name() {
        let mut slots = TimerSlots::default();
        slots.set(b"k", TimeDomain::EventTime, "a", 1);
        slots.set(b"k", TimeDomain::ProcessingTime, "a", 2);
        slots.set(b"k", TimeDomain::EventTime, "b", 3);
        slots.set(b"k", TimeDomain::EventTime, "a", 4);
        assert_eq!(slots.get(b"k", TimeDomain::EventTime, "a"), Some(4));
        assert_eq!(slots.get(b"k", TimeDomain::ProcessingTime, "a"), Some(2));
        assert_eq!(slots.get(b"j", TimeDomain::EventTime, "a"), None);
    }

    /// Keys that differ only in their last word's high bytes (the hardest case for a plain
    /// multiply, whose low bits see only the input's low bits) still spread over a table's
    /// buckets (low bits) and control bytes (top 7 bits) as random hashes would.
    #[test]
    fn the_fast_hash_spreads_keys_that_differ_only_in_their_high_bytes() {
        use std::hash::BuildHasher;
        let build = std::hash::BuildHasherDefault::<FastHash>::default();
        let mut buckets = BTreeSet::new();
        let mut controls = BTreeSet::new();
        for i in 0u32..4096 {
            let mut key = *b"AA1234:20130101:";
            key[13..16].copy_from_slice(&(i << 4).to_le_bytes()[..3]);
            let hash = build.hash_one(&key[..]);
            buckets.insert(hash & 0xfff);
            controls.insert(hash >> 57);
        }
        // 4,096 random hashes fill ≈ 2,589 of 4,096 buckets (σ ≈ 20).
        assert!(buckets.len() > 2400, "{} buckets of 4096", buckets.len());
        assert_eq!(controls.len(), 128);
    }

    #[test]
    fn the_timer_index_shares_one_copy_of_each_key_and_name_and_lets_unused_names_go() {
        use TimeDomain::{EventTime, ProcessingTime};
        let mut index = TimerIndex::default();
        index.insert(1, EventTime, b"k", "a");
        index.insert(2, ProcessingTime, b"k", "a");
        index.insert(3, EventTime, b"k", "b");
        index.insert(4, EventTime, b"k", "a"); // moves k's event-time "a" from 1 to 4
        index.insert(5, EventTime, b"j", "a");
        let entries: Vec<&TimerEntry> = index.by_time().iter().collect();
        let order: Vec<(i64, &[u8], &str)> = entries
            .iter()
            .map(|timer| (timer.fire_at_us, &*timer.key, &*timer.name))
            .collect();
        let expected: [(i64, &[u8], &str); 4] =
            [(2, b"k", "a"), (3, b"k", "b"), (4, b"k", "a"), (5, b"j", "a")];
        assert_eq!(order, expected);
        assert!(
            Arc::ptr_eq(&entries[0].key, &entries[2].key),
            "k's timers share its key"
        );
        assert!(
            Arc::ptr_eq(&entries[0].name, &entries[3].name),
            "every \"a\" is one copy"
        );
        index.remove(4, EventTime, b"k", "a");
        index.remove(5, EventTime, b"j", "a");
        assert!(
            index.names.contains_key("a"),
            "still used by k's processing-time timer"
        );
        index.remove(2, ProcessingTime, b"k", "a");
        assert!(!index.names.contains_key("a"));
        index.remove(9, EventTime, b"k", "b"); // not when it fires: nothing removed
        assert_eq!(index.get(b"k", EventTime, "b"), Some(3));
        index.remove(3, EventTime, b"k", "b");
        assert!(index.by_key.is_empty() && index.names.is_empty() && index.len() == 0);
    }

    /// One operation on the timer index: insert (moves an existing timer) or remove.
    #[derive(Debug, Clone)]
    enum IndexOp {
        Insert(i64, bool, u8, u8),
        Remove(i64, bool, u8, u8),
    }

    fn index_op() -> impl Strategy<Value = IndexOp> {
        prop_oneof![
            (0i64..6, any::<bool>(), 0u8..3, 0u8..3).prop_map(|(t, d, k, n)| IndexOp::Insert(t, d, k, n)),
            (0i64..6, any::<bool>(), 0u8..3, 0u8..3).prop_map(|(t, d, k, n)| IndexOp::Remove(t, d, k, n)),
        ]
    }

    proptest! {
        /// Against a model (one fire time per key, domain and name): the same timers by key and
        /// in fire order, and exactly the names in use kept, whatever clones of entries are held.
        #[test]
        fn the_timer_index_holds_what_a_map_of_timers_holds(ops in prop::collection::vec(index_op(), 0..40)) {
            let domain = |event: bool| if event { TimeDomain::EventTime } else { TimeDomain::ProcessingTime };
            let mut index = TimerIndex::default();
            let mut model: BTreeMap<(Vec<u8>, TimeDomain, String), i64> = BTreeMap::new();
            // Clones of entries held outside the index (as the engine's cursors are) do not keep
            // a name in use.
            let mut held: Vec<TimerEntry> = Vec::new();
            for op in ops {
                held.extend(index.by_time().iter().next().cloned());
                match op {
                    IndexOp::Insert(time, event, key, name) => {
                        let (key, name) = (vec![b'k', key], format!("n{name}"));
                        index.insert(time, domain(event), &key, &name);
                        model.insert((key, domain(event), name), time);
                    }
                    IndexOp::Remove(time, event, key, name) => {
                        let (key, name) = (vec![b'k', key], format!("n{name}"));
                        index.remove(time, domain(event), &key, &name);
                        let slot = (key, domain(event), name);
                        if model.get(&slot) == Some(&time) {
                            model.remove(&slot);
                        }
                    }
                }
            }
            let mut expected: Vec<(i64, TimeDomain, Vec<u8>, String)> = model
                .iter()
                .map(|((key, domain, name), time)| (*time, *domain, key.clone(), name.clone()))
                .collect();
            expected.sort();
            let actual: Vec<(i64, TimeDomain, Vec<u8>, String)> = index
                .by_time()
                .iter()
                .map(|timer| (timer.fire_at_us, timer.domain, timer.key.to_vec(), timer.name.to_string()))
                .collect();
            prop_assert_eq!(actual, expected);
            for ((key, domain, name), time) in &model {
                prop_assert_eq!(index.get(key, *domain, name), Some(*time));
            }
            let names_in_use: BTreeSet<String> = model.keys().map(|(_, _, name)| name.clone()).collect();
            let names_kept: BTreeSet<String> = index.names.keys().map(|name| name.to_string()).collect();
            prop_assert_eq!(names_kept, names_in_use);
            let keys_in_use: BTreeSet<Vec<u8>> = model.keys().map(|(key, _, _)| key.clone()).collect();
            let keys_kept: BTreeSet<Vec<u8>> = index.by_key.keys().map(|key| key.to_vec()).collect();
            prop_assert_eq!(keys_kept, keys_in_use);
        }
    }
}
