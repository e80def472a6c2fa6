//! Held changes: batches applied in memory and written to RocksDB together at a commit point.
//!
//! A batch's changes are first *held* ([`Shard::hold`]): the in-memory mirrors (timer index,
//! progress, outbox sequence numbers) move at once, and the state writes join one overlay that
//! later batches read through, so the next batch sees them without any RocksDB write. At a commit
//! point [`Shard::persist`] writes everything held — the newest value of every key touched since
//! the last commit point, the net timer changes, the next input offset, the max event time and
//! the next outbox sequence — in one `WriteBatch`. A key written by ten batches between two commit
//! points is written to RocksDB once.
//!
//! What the caller must guarantee (docs/CONTRACT.md, "Guarantees across restarts"): an output of
//! a held batch that is not written into the outbox at the commit point must have been
//! acknowledged by the broker before the commit point is persisted; otherwise a crash after the
//! commit point loses it (the shard resumes after its input). A crash *before* the commit point
//! loses nothing: the shard reopens at the previous commit point's offset and reprocessing
//! regenerates the held batches' outputs byte for byte, which downstream's de-duplication by
//! position drops.
//!
//! A failed write leaves the mirrors ahead of the disk: the shard refuses further work
//! ([`StateError::Storage`]) and must be dropped and opened again, which restores the previous
//! commit point.

use std::collections::BTreeMap;
use std::time::Instant;

use rocksdb::WriteBatch;

use super::outbox::encode_outbox_record;
use super::{
    META_MAX_EVENT_TIME, META_NEXT_OFFSET, META_NEXT_SEQUENCE, Overlay, Shard, ShardProgress, TimerEntry,
};
use crate::error::StateError;
use crate::keys::{self, cf};
use crate::shard::OutboxRecord;

/// Changes applied in memory since the last commit point.
#[derive(Default)]
pub(crate) struct Held {
    /// Per family, per key, the newest value (`None`: deleted).
    pub(super) overlay: Overlay,
    /// Per timer, whether it is to be put (`true`) or deleted (`false`): the last change wins.
    pub(super) timers: BTreeMap<TimerEntry, bool>,
    /// Batches held.
    pub(super) batches: usize,
    /// Input records held.
    pub(super) records: usize,
    /// Bytes of the overlay's keys and values (an estimate of the memory the held state takes).
    pub(super) bytes: usize,
    /// When the oldest held batch was applied.
    pub(super) since: Option<Instant>,
    /// The first outbox sequence number given to a held batch's output: outputs from here on
    /// are held, not in the outbox.
    pub(super) first_sequence: u64,
    /// Held outputs the broker acknowledged.
    pub(super) acknowledged: u64,
}

/// What a shard holds in memory, not yet written ([`Shard::held`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeldSummary {
    /// Batches applied since the last commit point.
    pub batches: usize,
    /// Their input records.
    pub records: usize,
    /// Distinct state entries written since (keys of every family).
    pub entries: usize,
    /// Bytes of those entries' keys and values.
    pub bytes: usize,
    /// Net timer changes.
    pub timer_changes: usize,
    /// Outputs of the held batches.
    pub outputs: u64,
    /// Of those, the ones the broker has not acknowledged ([`Shard::acknowledge`]) yet: a commit
    /// point waits for 0.
    pub unacknowledged: u64,
    /// When the oldest held batch was applied.
    pub since: Option<Instant>,
}

impl Held {
    fn is_empty(&self) -> bool {
        self.batches == 0 && self.overlay.is_empty() && self.timers.is_empty()
    }

    /// Merges a batch's overlay: later values win.
    fn merge(&mut self, overlay: Overlay) {
        if self.overlay.is_empty() {
            self.bytes = overlay_bytes(&overlay);
            self.overlay = overlay;
            return;
        }
        for (family, entries) in overlay {
            let held = self.overlay.entry(family).or_default();
            for (key, value) in entries {
                let (key_len, value_len) = (key.len(), value.as_ref().map_or(0, Vec::len));
                match held.insert(key, value) {
                    Some(previous) => {
                        let previous_len = previous.as_ref().map_or(0, Vec::len);
                        self.bytes = (self.bytes + value_len).saturating_sub(previous_len);
                    }
                    None => self.bytes += key_len + value_len,
                }
            }
        }
    }
}

fn overlay_bytes(overlay: &Overlay) -> usize {
    overlay
        .values()
        .flat_map(BTreeMap::iter)
        .map(|(key, value)| key.len() + value.as_ref().map_or(0, Vec::len))
        .sum()
}

impl Shard {
    /// What is held in memory since the last commit point.
    pub fn held(&self) -> HeldSummary {
        let outputs = self.next_outbox_sequence - self.held.first_sequence;
        HeldSummary {
            outputs,
            unacknowledged: outputs.saturating_sub(self.held.acknowledged),
            since: self.held.since,
            batches: self.held.batches,
            records: self.held.records,
            entries: self.held.overlay.values().map(BTreeMap::len).sum(),
            bytes: self.held.bytes,
            timer_changes: self.held.timers.len(),
        }
    }

    /// Progress as of the last commit point: where the shard resumes after a reopen.
    pub fn persisted_progress(&self) -> ShardProgress {
        self.persisted
    }

    /// Refuses work once a write failed (the mirrors are ahead of the disk).
    pub(crate) fn refuse_if_failed(&self) -> Result<(), StateError> {
        match &self.failed {
            Some(message) => Err(StateError::Storage {
                path: self.path.display().to_string(),
                message: format!("a write failed earlier ({message}); reopen the shard"),
            }),
            None => Ok(()),
        }
    }

    /// Applies a processed batch in memory: its writes join the held overlay, its timer changes
    /// the timer index, its progress the shard's. Returns the outbox sequence numbers of its
    /// `outputs` outputs, in order.
    pub(crate) fn hold(
        &mut self,
        overlay: Overlay,
        timers_added: impl IntoIterator<Item = TimerEntry>,
        timers_removed: impl IntoIterator<Item = TimerEntry>,
        records: usize,
        outputs: usize,
        progress: ShardProgress,
    ) -> Result<std::ops::Range<u64>, StateError> {
        self.refuse_if_failed()?;
        self.dedup_entries |= overlay.contains_key(cf::DEDUP);
        for timer in timers_removed {
            self.timers
                .remove(timer.fire_at_us, timer.domain, &timer.key, &timer.name);
            self.held.timers.insert(timer, false);
        }
        for timer in timers_added {
            self.timers
                .insert(timer.fire_at_us, timer.domain, &timer.key, &timer.name);
            self.held.timers.insert(timer, true);
        }
        self.held.merge(overlay);
        self.held.since.get_or_insert_with(Instant::now);
        self.held.batches += 1;
        self.held.records += records;
        self.progress = progress;
        let first = self.next_outbox_sequence;
        self.next_outbox_sequence += outputs as u64;
        Ok(first..self.next_outbox_sequence)
    }

    /// A commit point: writes everything held since the last one in one `WriteBatch`.
    ///
    /// Refused ([`StateError::NotAcknowledged`], nothing written) while an output of the held
    /// batches is not acknowledged ([`Shard::acknowledge`]): after the commit point a reopen
    /// resumes after their input, so they could not be regenerated.
    pub fn persist(&mut self) -> Result<(), StateError> {
        self.persist_with(&[])
    }

    /// [`Shard::persist`], writing `outbox` (outputs not yet acknowledged, with their sequence
    /// numbers) into the outbox in the same write.
    pub(crate) fn persist_with(&mut self, outbox: &[(u64, &OutboxRecord)]) -> Result<(), StateError> {
        self.refuse_if_failed()?;
        if self.held.is_empty() && outbox.is_empty() {
            return Ok(());
        }
        let unacknowledged = self.held().unacknowledged.saturating_sub(outbox.len() as u64);
        if unacknowledged > 0 {
            return Err(StateError::NotAcknowledged(unacknowledged));
        }
        let written = self
            .commit_batch(outbox)
            .and_then(|batch| self.db.write(batch).map_err(|error| self.storage_error(error)));
        if let Err(error) = written {
            self.failed = Some(error.to_string());
            return Err(error);
        }
        self.held = Held {
            first_sequence: self.next_outbox_sequence,
            ..Held::default()
        };
        self.persisted = self.progress;
        Ok(())
    }

    /// The write batch of a commit point: everything held, `outbox`, and the progress.
    fn commit_batch(&self, outbox: &[(u64, &OutboxRecord)]) -> Result<WriteBatch, StateError> {
        let mut batch = WriteBatch::default();
        for (family, entries) in &self.held.overlay {
            let handle = self.handle(family)?;
            for (key, value) in entries {
                match value {
                    Some(value) => batch.put_cf(handle, key, value),
                    None => batch.delete_cf(handle, key),
                }
            }
        }
        let by_time = self.handle(cf::TIMERS_BY_TIME)?;
        for (timer, put) in &self.held.timers {
            if *put {
                batch.put_cf(by_time, timer.by_time_key(), []);
            } else {
                batch.delete_cf(by_time, timer.by_time_key());
            }
        }
        let outbox_family = self.handle(cf::OUTBOX)?;
        let mut bytes = Vec::new();
        for (sequence, record) in outbox {
            encode_outbox_record(record, &mut bytes);
            batch.put_cf(outbox_family, sequence.to_be_bytes(), &bytes);
        }
        let meta = self.handle(cf::META)?;
        if let Some(next_offset) = self.progress.next_offset {
            batch.put_cf(meta, META_NEXT_OFFSET, keys::encode_time(next_offset));
        }
        batch.put_cf(
            meta,
            META_MAX_EVENT_TIME,
            keys::encode_time(self.progress.max_event_time_us),
        );
        batch.put_cf(
            meta,
            META_NEXT_SEQUENCE,
            keys::encode_time(self.next_outbox_sequence as i64),
        );
        Ok(batch)
    }
}
