//! Timers: the clock a timer follows, the in-memory index of a shard's committed timers (in fire
//! order and by key, one shared copy of each key and name) and per-timer slots for a batch.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::keys;

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
    pub(super) fn by_time_key(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(8 + 1 + self.key.len() + 1 + self.name.len());
        bytes.extend_from_slice(&keys::encode_time(self.fire_at_us));
        bytes.push(self.domain.byte());
        bytes.extend_from_slice(&keys::joined(&self.key, self.name.as_bytes()));
        bytes
    }
}

/// A `timers_by_time` entry's fire time, domain, key and name (borrowed from `bytes`).
pub(super) fn decode_by_time(bytes: &[u8]) -> Option<(i64, TimeDomain, &[u8], &str)> {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use proptest::prelude::*;

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
