//! Opening and closing shards: on assignment a shard is reopened from its directory, restored
//! from the newest complete checkpoint or started empty (the pure [`protocol::restore_plan`]),
//! then owned; on revocation its batch is waited for, its outputs flushed, and it is closed.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use contrail_state::protocol::{self, LocalShard, RestorePlan};
use contrail_state::{OutboxRecord, Shard, StateError};
use rdkafka::Offset;
use rdkafka::producer::Producer;

use super::{OwnedShard, ShardSet, lock_slot};

/// A shard opened for a partition just assigned, not owned yet ([`ShardSet::prepare`]).
pub(crate) struct Opened {
    partition: i32,
    shard: Shard,
    origin: String,
    outbox: Vec<(u64, OutboxRecord)>,
}

impl ShardSet {
    /// Opens the shard of `partition` — reopened from the local directory, restored from the newest
    /// complete checkpoint, or empty — and reads its outbox, without owning it yet: the slow part
    /// of an assignment (a restore downloads and opens the whole state), run off the polling
    /// thread so the consumer keeps serving the group meanwhile ([`crate::opening`]). Gives up
    /// (`Ok(None)`) as soon as `give_up` says so: asked before a download and while the shard's
    /// timers load, the long parts.
    pub(crate) fn prepare(
        &self,
        partition: i32,
        give_up: &dyn Fn() -> bool,
    ) -> Result<Option<Opened>, StateError> {
        let started = Instant::now();
        let dir = self.shard_dir(partition);
        let memory = Some(&self.processing.memory);
        let mut local_shard = None;
        let local = if dir.join("CURRENT").exists() {
            let Some(shard) = Shard::open_unless(&dir, partition, memory, give_up)? else {
                return Ok(None);
            };
            let next_offset = shard.progress().next_offset;
            local_shard = Some(shard);
            LocalShard::Present { next_offset }
        } else {
            // A directory without RocksDB's CURRENT file never committed anything.
            let _ = std::fs::remove_dir_all(&dir);
            LocalShard::Missing
        };
        let manifests = self.runtime.block_on(self.store.manifests())?;
        let origin = match protocol::restore_plan(local, &manifests, partition) {
            RestorePlan::ReopenLocal => "reopened".to_owned(),
            RestorePlan::Restore { epoch, checkpoint } => {
                if let Some(stale) = local_shard.take() {
                    drop(stale);
                    tracing::info!(
                        partition,
                        ?local,
                        checkpoint_offset = checkpoint.next_offset,
                        "local shard is behind the newest checkpoint; replacing it"
                    );
                    std::fs::remove_dir_all(&dir).map_err(|error| StateError::Storage {
                        path: dir.display().to_string(),
                        message: error.to_string(),
                    })?;
                }
                if give_up() {
                    return Ok(None);
                }
                tracing::info!(partition, epoch, "restoring the shard from the checkpoint store");
                self.runtime
                    .block_on(self.store.download_shard(&checkpoint, &dir))?;
                self.metrics.restores.inc();
                tracing::info!(
                    partition,
                    epoch,
                    next_offset = checkpoint.next_offset,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "shard restored from the checkpoint store"
                );
                format!("restored epoch {epoch}")
            }
            RestorePlan::StartEmpty => "empty".to_owned(),
        };
        let shard = match local_shard {
            Some(shard) => shard,
            None => match Shard::open_unless(&dir, partition, memory, give_up)? {
                Some(shard) => shard,
                None => return Ok(None),
            },
        };
        let outbox = shard.outbox()?;
        tracing::info!(
            partition,
            %origin,
            outbox = outbox.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "shard prepared"
        );
        Ok(Some(Opened {
            partition,
            shard,
            origin,
            outbox,
        }))
    }

    /// Owns a shard [`ShardSet::prepare`] opened: queues its outbox for re-sending (before any new
    /// output) and returns the offset its partition goes on from. Quick: the polling thread calls it.
    pub(crate) fn install(&self, opened: Opened) -> Offset {
        let Opened {
            partition,
            shard,
            origin,
            outbox,
        } = opened;
        let next_offset = protocol::resume_offset(shard.progress().next_offset);
        tracing::info!(partition, ?next_offset, %origin, outbox = outbox.len(), "shard opened");
        let mut inner = self.lock();
        self.metrics.outputs_resent.inc_by(outbox.len() as u64);
        inner.resend.extend(
            outbox
                .into_iter()
                .map(|(sequence, record)| (partition, sequence, record)),
        );
        self.metrics
            .shard_offset
            .with_label_values(&[&partition.to_string()])
            .set(next_offset.unwrap_or(-1));
        let generation = self.opens.fetch_add(1, Ordering::Relaxed);
        inner.acknowledged.remove(&partition);
        inner.shards.insert(
            partition,
            OwnedShard {
                slot: Arc::new(Mutex::new(Some(shard))),
                origin,
                generation,
            },
        );
        self.metrics.outbox_pending.set(inner.unacknowledged() as i64);
        next_offset.map_or(Offset::Beginning, Offset::Offset)
    }

    /// Waits for the batches of `partitions` in progress, flushes outputs, applies
    /// acknowledgements, and closes the shards.
    pub(crate) fn close(&self, partitions: &[i32]) {
        // Emptying a slot waits for its batch (commit and sends) and keeps any later one out.
        let mut closing: Vec<(i32, u64, Shard)> = self
            .slots(Some(partitions))
            .into_iter()
            .filter_map(|(partition, generation, slot)| {
                lock_slot(&slot)
                    .take()
                    .map(|shard| (partition, generation, shard))
            })
            .collect();
        if let Err(error) = self.produce_resends() {
            tracing::warn!(%error, "re-sending before closing shards; the outputs stay in the outbox");
        }
        if let Err(error) = self.producer.flush(Duration::from_secs(10)) {
            tracing::warn!(%error, "flush before closing shards; unacknowledged outputs stay in the outbox");
        }
        self.apply_deliveries();
        for (partition, generation, shard) in &mut closing {
            self.acknowledge_queued(*partition, *generation, shard);
            // Held batches whose outputs the broker has all acknowledged are written; otherwise
            // the next owner reprocesses them from the previous commit point.
            self.commit_if_due(*partition, shard, true);
        }
        let mut inner = self.lock();
        for partition in partitions {
            if inner.shards.remove(partition).is_some() {
                tracing::info!(partition, "shard closed");
            }
            inner.acknowledged.remove(partition);
            inner.resend.retain(|(owner, _, _)| owner != partition);
            inner.in_flight.closed(*partition);
        }
        self.metrics.outbox_pending.set(inner.unacknowledged() as i64);
        drop(inner);
        // The RocksDB instances close here (waiting for checkpoints still being taken of them).
        drop(closing);
    }

    /// Closes every shard (shutdown).
    pub fn close_all(&self) {
        let partitions: Vec<i32> = self.lock().shards.keys().copied().collect();
        self.close(&partitions);
    }
}
