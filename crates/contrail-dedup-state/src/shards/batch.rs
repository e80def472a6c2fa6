//! One batch of a partition: records into state, timers, outputs and the offset in one RocksDB
//! write batch, then the outputs handed to the producer.

use std::time::Instant;

use contrail_state::{EngineConfig, InputRecord, Shard};

use super::{ShardSet, lock_slot};
use crate::config::ProcessorKind;
use crate::error::DedupStateError;
use crate::processor::{FlightProcessor, INVALID_KEY};
use crate::records::{OwnedRecord, TracedBatch};
use crate::rotation::RotationProcessor;

impl ShardSet {
    /// Processes one partition's records (in offset order) as one batch and produces the outputs.
    /// Callers produce the queued re-sends first ([`ShardSet::produce_resends`]) and run one batch
    /// of a partition at a time, so each output topic receives a partition's outputs in the order
    /// of their input offsets; batches of different partitions may run on different threads. A
    /// batch that does not start at the shard's stored offset is not processed:
    /// [`Processed::Gap`] (the caller repositions the consumer).
    pub(crate) fn process(
        &self,
        partition: i32,
        records: &[OwnedRecord],
        lateness_us: i64,
        accept_gap: bool,
    ) -> Result<Processed, DedupStateError> {
        let started = Instant::now();
        let now_ms = chrono::Utc::now().timestamp_millis();
        for timestamp_ms in records.iter().filter_map(|record| record.timestamp_ms) {
            self.metrics
                .record_age_seconds
                .observe(now_ms.saturating_sub(timestamp_ms).max(0) as f64 / 1000.0);
        }
        // Not ours (revoked while buffered, or closed meanwhile): the new owner reads them from its
        // stored offset.
        let Some((_, generation, slot)) = self.slots(Some(&[partition])).pop() else {
            return Ok(Processed::Done);
        };
        let mut guard = lock_slot(&slot);
        let Some(shard) = guard.as_mut() else {
            return Ok(Processed::Done);
        };
        self.acknowledge_queued(partition, generation, shard);
        // A commit point due (a batch without records is how the polling thread asks for one).
        self.commit_if_due(partition, shard, false);
        let from = shard.progress().next_offset.unwrap_or(i64::MIN);
        let records: Vec<&OwnedRecord> = records.iter().filter(|record| record.offset >= from).collect();
        let traced = TracedBatch::new(partition, &records, &self.processing.sampler);
        let inputs: Vec<InputRecord<'_>> = records
            .iter()
            .zip(&traced.contexts)
            .map(|(record, trace)| InputRecord {
                key: if record.key.is_empty() || record.key.contains(&0) {
                    INVALID_KEY
                } else {
                    record.key.as_slice()
                },
                payload: &record.payload,
                offset: record.offset,
                trace: trace.as_deref().map(str::as_bytes),
                timestamp_us: record.timestamp_ms.map(|millis| millis.saturating_mul(1_000)),
            })
            .collect();
        let Some(first) = inputs.first() else {
            return Ok(Processed::Done);
        };
        if from != i64::MIN && first.offset != from && !accept_gap {
            // The fetch position is past the shard's offset (a seek that did not take, or records
            // gone from the broker): never commit over it.
            return Ok(Processed::Gap {
                expected: from,
                got: first.offset,
            });
        }
        let now_us = chrono::Utc::now().timestamp_micros();
        // Held batches wait for a commit point (`commit_if_due`); without a commit interval every
        // batch commits itself with its outputs in the outbox.
        let held = self.processing.commit.interval.is_some();
        let engine = EngineConfig {
            allowed_lateness_us: lateness_us,
        };
        let (topics, metrics, max_bytes) = (
            self.processing.topics.clone(),
            Some(self.metrics.clone()),
            self.processing.max_message_bytes,
        );
        let result = traced.batch.in_scope(|| match self.processing.processor {
            ProcessorKind::Flight => {
                let rules = self.processing.rules;
                let mut processor =
                    FlightProcessor::new(rules, topics, partition, metrics, max_bytes).with_clock(now_us);
                if held {
                    shard.process_held(&inputs, &mut processor, &engine)
                } else {
                    shard.process_batch(&inputs, &mut processor, &engine, now_us)
                }
            }
            ProcessorKind::Rotation => {
                let rules = self.processing.turn.clone();
                let mut processor = RotationProcessor::new(rules, topics, partition, metrics, max_bytes);
                if held {
                    shard.process_held(&inputs, &mut processor, &engine)
                } else {
                    shard.process_batch(&inputs, &mut processor, &engine, now_us)
                }
            }
        })?;
        traced.batch.record("outputs", result.outputs.len());
        let next_offset = shard.progress().next_offset.unwrap_or(-1);
        if next_offset % 64 == 0 || result.records >= 64 {
            let bytes = shard.approximate_size_bytes();
            self.metrics
                .state_bytes
                .with_label_values(&[&partition.to_string()])
                .set(bytes as i64);
        }
        self.metrics.records.inc_by(result.records as u64);
        self.metrics.evicted.inc_by(result.evicted as u64);
        if !held {
            self.metrics.commits.inc();
        }
        self.metrics
            .shard_offset
            .with_label_values(&[&partition.to_string()])
            .set(next_offset);
        // The outputs are in the outbox now (or held: regenerated by reprocessing until the commit
        // point that follows their acknowledgement). The slot stays held until they are handed to
        // the producer, so closing the shard waits for them.
        let produced = result
            .outputs
            .iter()
            .try_for_each(|(sequence, record)| self.send(partition, *sequence, record));
        drop(guard);
        if let Err(error) = produced {
            // Everything not sent is in the outbox, or held and never committed: a restart re-sends
            // it in order, or reprocesses its input.
            let message = format!("producing the outputs of partition {partition}: {error}");
            self.fail(message.clone());
            return Err(DedupStateError::Broker(message));
        }
        self.metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(Processed::Done)
    }
}

/// What became of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Processed {
    /// Committed (or nothing to do).
    Done,
    /// Not processed: the first record is not at the shard's stored offset.
    Gap {
        /// The shard's stored offset.
        expected: i64,
        /// The first record's offset.
        got: i64,
    },
}

impl ShardSet {
    /// A commit point for `shard` if it is due ([`crate::config::CommitPolicy::due`]; `force`:
    /// whenever its held outputs are all acknowledged). A failed write fails the shard set: the
    /// restart reopens the shard at its previous commit point.
    pub(super) fn commit_if_due(&self, partition: i32, shard: &mut Shard, force: bool) {
        let held = shard.held();
        if !self.processing.commit.due(&held, force) {
            return;
        }
        match shard.persist() {
            Ok(()) => {
                self.metrics.commits.inc();
                tracing::debug!(
                    partition,
                    batches = held.batches,
                    records = held.records,
                    bytes = held.bytes,
                    "commit point"
                );
            }
            Err(error) => self.fail(format!("commit point of partition {partition}: {error}")),
        }
    }

    /// The owned shards not busy with a batch whose commit point is due: the polling thread
    /// hands each to a processing thread as a batch without records, so the write does not hold
    /// up polling and the other shards' batches.
    pub(crate) fn due_for_commit(&self) -> Vec<i32> {
        self.slots(None)
            .into_iter()
            .filter(|(_, _, slot)| {
                slot.try_lock().is_ok_and(|guard| {
                    guard
                        .as_ref()
                        .is_some_and(|shard| self.processing.commit.due(&shard.held(), false))
                })
            })
            .map(|(partition, _, _)| partition)
            .collect()
    }

    /// Commit points for every owned shard that is due and not busy with a batch, on the calling
    /// thread (`force`: every one whose held outputs are all acknowledged — before a checkpoint).
    pub(crate) fn persist_due(&self, force: bool) {
        for (partition, _, slot) in self.slots(None) {
            if let Ok(mut guard) = slot.try_lock()
                && let Some(shard) = guard.as_mut()
            {
                self.commit_if_due(partition, shard, force);
            }
        }
    }
}
