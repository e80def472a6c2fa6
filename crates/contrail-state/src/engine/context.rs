//! [`KeyContext`]: one key's state during a batch — typed values, lists and maps with a TTL per
//! variable, dedup entries, timers and outputs — read through the batch's pending changes.

use std::collections::BTreeMap;

use prost::Message;

use super::{DEDUP_TIMER, NO_EXPIRY, Pending, TTL_TIMER_PREFIX};
use crate::error::StateError;
use crate::keys::{self, cf};
use crate::shard::{OutboxRecord, Shard, TimeDomain, Timer, TimerEntry};

/// Access to one key's state during a batch.
pub struct KeyContext<'a> {
    pub(super) shard: &'a Shard,
    pub(super) pending: &'a mut Pending,
    pub(super) key: Vec<u8>,
}

impl KeyContext<'_> {
    /// The key being processed.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// Records an input's event time; advances the shard watermark.
    pub fn observe_event_time(&mut self, event_time_us: i64) {
        let progress = &mut self.pending.progress;
        progress.max_event_time_us = progress.max_event_time_us.max(event_time_us);
    }

    /// Max event time of the shard's input so far.
    pub fn max_event_time_us(&self) -> i64 {
        self.pending.progress.max_event_time_us
    }

    /// The shard's event-time watermark: max event time − allowed lateness.
    pub fn watermark_us(&self) -> i64 {
        self.pending.watermark_us()
    }

    /// Where in the shard's input this call happens: the offset of the record being handled, or,
    /// for a timer, of the record after which it fires (event-time timers fire after the record
    /// that moved the watermark past them; processing-time timers after the batch's last record,
    /// or the last committed one when the batch is empty). `None` before the shard's first record.
    /// Processing is deterministic, so `(input_offset, n-th emission there)` is the same on every
    /// replay of the input: a processor can give its outputs an increasing position from it.
    pub fn input_offset(&self) -> Option<i64> {
        self.pending
            .input_offset
            .or_else(|| self.pending.progress.next_offset.map(|next| next - 1))
    }

    pub(super) fn read(
        &self,
        family: &'static str,
        storage_key: &[u8],
    ) -> Result<Option<Vec<u8>>, StateError> {
        match self
            .pending
            .overlay
            .get(family)
            .and_then(|entries| entries.get(storage_key))
        {
            Some(value) => Ok(value.clone()),
            None => self.shard.get(family, storage_key),
        }
    }

    fn scan(&self, family: &'static str, prefix: &[u8]) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, StateError> {
        let mut entries: BTreeMap<Vec<u8>, Vec<u8>> =
            self.shard.scan_prefix(family, prefix)?.into_iter().collect();
        let Some(pending) = self.pending.overlay.get(family) else {
            return Ok(entries);
        };
        for (entry_key, value) in pending.range(prefix.to_vec()..keys::prefix_end(prefix)) {
            match value {
                Some(value) => entries.insert(entry_key.clone(), value.clone()),
                None => entries.remove(entry_key),
            };
        }
        Ok(entries)
    }

    pub(super) fn write(&mut self, family: &'static str, storage_key: Vec<u8>, value: Option<Vec<u8>>) {
        self.pending
            .overlay
            .entry(family)
            .or_default()
            .insert(storage_key, value);
    }

    fn decode<T: Message + Default>(&self, bytes: &[u8]) -> Result<Option<T>, StateError> {
        let Some(expires_at) = keys::decode_time(bytes) else {
            return Err(StateError::Corrupt {
                path: String::new(),
                message: "state value without expiry".into(),
            });
        };
        if expires_at != NO_EXPIRY && expires_at <= self.watermark_us() {
            return Ok(None); // expired; the TTL timer removes it
        }
        T::decode(&bytes[8..])
            .map(Some)
            .map_err(|error| StateError::Corrupt {
                path: String::new(),
                message: format!(
                    "state value of key {:?}: {error}",
                    String::from_utf8_lossy(&self.key)
                ),
            })
    }

    fn encode<T: Message>(value: &T, expires_at_us: Option<i64>) -> Vec<u8> {
        let mut bytes = keys::encode_time(expires_at_us.unwrap_or(NO_EXPIRY)).to_vec();
        value.encode(&mut bytes).unwrap_or_default();
        bytes
    }

    fn schedule_ttl(&mut self, timer_name: String, expires_at_us: Option<i64>) {
        match expires_at_us {
            Some(expiry) => self.ensure_ttl_timer(&timer_name, expiry),
            None => self.delete_timer(&timer_name, TimeDomain::EventTime),
        }
    }

    /// Lazy expiry: a TTL timer fires no later than its entry expires, but is not moved later each
    /// time the entry's expiry is — a value rewritten per event would otherwise delete and put a
    /// timer per event. When it fires, the engine reads the entry's stored expiry and either evicts
    /// it or sets the timer again at that expiry (see [`Shard::fire_due`]).
    fn ensure_ttl_timer(&mut self, name: &str, expires_at_us: i64) {
        match self.current_timer(name, TimeDomain::EventTime) {
            Some(fire_at) if fire_at <= expires_at_us => {}
            _ => self.register_timer(name, TimeDomain::EventTime, expires_at_us),
        }
    }

    /// Value state: the current value of `variable`, if set and not expired.
    pub fn get<T: Message + Default>(&self, variable: &str) -> Result<Option<T>, StateError> {
        match self.read(cf::VALUES, &keys::joined(&self.key, variable.as_bytes()))? {
            Some(bytes) => self.decode(&bytes),
            None => Ok(None),
        }
    }

    /// Value state: sets `variable`; with `expires_at_us` it is evicted once the watermark passes it.
    pub fn set<T: Message>(&mut self, variable: &str, value: &T, expires_at_us: Option<i64>) {
        let storage_key = keys::joined(&self.key, variable.as_bytes());
        self.write(cf::VALUES, storage_key, Some(Self::encode(value, expires_at_us)));
        self.schedule_ttl(format!("{TTL_TIMER_PREFIX}/v/{variable}"), expires_at_us);
    }

    /// Value state: removes `variable`.
    pub fn clear(&mut self, variable: &str) {
        self.write(cf::VALUES, keys::joined(&self.key, variable.as_bytes()), None);
        self.delete_timer(&format!("{TTL_TIMER_PREFIX}/v/{variable}"), TimeDomain::EventTime);
    }

    /// List state: all items of `variable`, oldest first.
    pub fn list<T: Message + Default>(&self, variable: &str) -> Result<Vec<T>, StateError> {
        let prefix = keys::map_prefix(&self.key, &format!("{variable}#list"));
        let mut items = Vec::new();
        for bytes in self.scan(cf::VALUES, &prefix)?.values() {
            if let Some(item) = self.decode(bytes)? {
                items.push(item);
            }
        }
        Ok(items)
    }

    /// List state: appends an item (its own TTL).
    pub fn list_append<T: Message>(
        &mut self,
        variable: &str,
        item: &T,
        expires_at_us: Option<i64>,
    ) -> Result<(), StateError> {
        let list_variable = format!("{variable}#list");
        let prefix = keys::map_prefix(&self.key, &list_variable);
        let next_index = self
            .scan(cf::VALUES, &prefix)?
            .keys()
            .last()
            .and_then(|last| last.get(prefix.len()..).and_then(keys::decode_time))
            .map_or(0, |index| index + 1);
        let storage_key = keys::map_entry(&self.key, &list_variable, &keys::encode_time(next_index));
        self.write(cf::VALUES, storage_key, Some(Self::encode(item, expires_at_us)));
        if let Some(expiry) = expires_at_us {
            self.register_timer(
                &format!("{TTL_TIMER_PREFIX}/l/{list_variable}/{next_index}"),
                TimeDomain::EventTime,
                expiry,
            );
        }
        Ok(())
    }

    /// Map state: one entry.
    pub fn map_get<T: Message + Default>(
        &self,
        variable: &str,
        map_key: &[u8],
    ) -> Result<Option<T>, StateError> {
        match self.read(cf::VALUES, &keys::map_entry(&self.key, variable, map_key))? {
            Some(bytes) => self.decode(&bytes),
            None => Ok(None),
        }
    }

    /// Map state: inserts or replaces an entry (its own TTL).
    pub fn map_put<T: Message>(
        &mut self,
        variable: &str,
        map_key: &[u8],
        value: &T,
        expires_at_us: Option<i64>,
    ) {
        let storage_key = keys::map_entry(&self.key, variable, map_key);
        self.write(cf::VALUES, storage_key, Some(Self::encode(value, expires_at_us)));
        if let Some(expiry) = expires_at_us {
            let name = format!("{TTL_TIMER_PREFIX}/m/{variable}/{}", hex(map_key));
            self.ensure_ttl_timer(&name, expiry);
        }
    }

    /// Map state: removes an entry.
    pub fn map_remove(&mut self, variable: &str, map_key: &[u8]) {
        self.write(cf::VALUES, keys::map_entry(&self.key, variable, map_key), None);
        self.delete_timer(
            &format!("{TTL_TIMER_PREFIX}/m/{variable}/{}", hex(map_key)),
            TimeDomain::EventTime,
        );
    }

    /// Map state: every live entry, by map key.
    pub fn map_entries<T: Message + Default>(&self, variable: &str) -> Result<Vec<(Vec<u8>, T)>, StateError> {
        let prefix = keys::map_prefix(&self.key, variable);
        let mut entries = Vec::new();
        for (storage_key, bytes) in self.scan(cf::VALUES, &prefix)? {
            if let Some(value) = self.decode(&bytes)? {
                entries.push((storage_key[prefix.len()..].to_vec(), value));
            }
        }
        Ok(entries)
    }

    /// Whether the shard holds any dedup entries (committed, or written in this batch): when not,
    /// [`KeyContext::dedup_contains`] is false for every id and need not be asked.
    pub fn dedup_in_use(&self) -> bool {
        self.shard.has_dedup_entries() || self.pending.overlay.contains_key(cf::DEDUP)
    }

    /// Whether `id` is among the key's live dedup entries.
    pub fn dedup_contains(&self, id: &[u8]) -> Result<bool, StateError> {
        Ok(self
            .read(cf::DEDUP, &keys::joined(&self.key, id))?
            .and_then(|bytes| keys::decode_time(&bytes))
            .is_some_and(|expires_at| expires_at > self.watermark_us()))
    }

    /// Remembers `id` for the key until the watermark passes `expires_at_us`.
    pub fn dedup_insert(&mut self, id: &[u8], expires_at_us: i64) {
        self.write(
            cf::DEDUP,
            keys::joined(&self.key, id),
            Some(keys::encode_time(expires_at_us).to_vec()),
        );
        let current = self.current_timer(DEDUP_TIMER, TimeDomain::EventTime);
        let earliest = current.map_or(expires_at_us, |fire_at| fire_at.min(expires_at_us));
        self.register_timer(DEDUP_TIMER, TimeDomain::EventTime, earliest);
    }

    /// The key's live dedup entries (for inspection).
    pub fn dedup_entries(&self) -> Result<Vec<(Vec<u8>, i64)>, StateError> {
        let prefix = keys::key_prefix(&self.key);
        Ok(self
            .scan(cf::DEDUP, &prefix)?
            .into_iter()
            .filter_map(|(storage_key, bytes)| {
                Some((storage_key[prefix.len()..].to_vec(), keys::decode_time(&bytes)?))
            })
            .collect())
    }

    /// When the key's timer `name` fires, as of this batch: from the batch's own changes, else
    /// from the shard's in-memory index of committed timers (no disk read).
    fn current_timer(&self, name: &str, domain: TimeDomain) -> Option<i64> {
        match self.pending.timer_overrides.get(&self.key, domain, name) {
            Some(fire_at) => fire_at,
            None => self.shard.committed_timer(&self.key, domain, name),
        }
    }

    /// Registers (or moves) the key's timer `name`. Registering it at the time it already has
    /// changes nothing (and writes nothing).
    pub fn register_timer(&mut self, name: &str, domain: TimeDomain, fire_at_us: i64) {
        if self.current_timer(name, domain) == Some(fire_at_us) {
            return;
        }
        self.delete_timer(name, domain);
        let timer = TimerEntry::new(fire_at_us, domain, &self.key, name);
        self.pending.timers_removed.remove(&timer);
        self.pending.timers_added.insert(timer);
        self.pending
            .timer_overrides
            .set(&self.key, domain, name, Some(fire_at_us));
    }

    /// Deletes the key's timer `name`, if any.
    pub fn delete_timer(&mut self, name: &str, domain: TimeDomain) {
        if let Some(fire_at_us) = self.current_timer(name, domain) {
            let timer = TimerEntry::new(fire_at_us, domain, &self.key, name);
            self.pending.timers_added.remove(&timer);
            // Also committed (it may have been re-registered at the same time in this batch):
            // the deletion must hide the committed copy too.
            if self.shard.committed_timer(&self.key, domain, name) == Some(fire_at_us) {
                self.pending.timers_removed.insert(timer);
            }
        }
        self.pending.timer_overrides.set(&self.key, domain, name, None);
    }

    /// The key's registered timers.
    pub fn timers(&self) -> Vec<Timer> {
        let mut timers: Vec<Timer> = self
            .shard
            .timers()
            .of_key(&self.key)
            .iter()
            .chain(
                self.pending
                    .timers_added
                    .iter()
                    .filter(|timer| *timer.key == *self.key),
            )
            .filter(|timer| !self.pending.timers_removed.contains(*timer))
            .map(TimerEntry::to_timer)
            .collect();
        timers.sort();
        timers.dedup();
        timers
    }

    /// Emits an output record; it is committed to the outbox with the batch.
    pub fn emit(&mut self, topic: &str, key: &[u8], payload: Vec<u8>) {
        self.pending.outbox.push(OutboxRecord {
            topic: topic.to_owned(),
            key: key.to_vec(),
            payload,
            trace: self.pending.trace.clone(),
        });
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
