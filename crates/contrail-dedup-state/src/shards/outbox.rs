//! The outbox's way out: outputs handed to the producer in commit order, delivery reports applied
//! (acknowledged outputs leave their shard's outbox), refused ones re-sent from the outbox.

use std::sync::Mutex;
use std::sync::mpsc::Sender;
use std::time::Duration;

use contrail_common::trace;
use contrail_state::{OutboxRecord, Shard};
use rdkafka::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext};

use super::{ShardSet, Slot};

/// One delivery report of an output.
#[derive(Debug)]
pub struct Delivery {
    partition: i32,
    /// Which open of the shard produced it (reports of an earlier open are only counted).
    generation: u64,
    sequence: u64,
    /// The broker's error, when it was not acknowledged.
    error: Option<String>,
}

/// Producer context: forwards delivery reports to the processing thread.
pub struct OutputContext {
    deliveries: Mutex<Sender<Delivery>>,
}

impl ClientContext for OutputContext {}

/// The producer context sending delivery reports to `deliveries`.
pub fn output_context(deliveries: Sender<Delivery>) -> OutputContext {
    OutputContext {
        deliveries: Mutex::new(deliveries),
    }
}

impl ProducerContext for OutputContext {
    type DeliveryOpaque = Box<(i32, u64, u64)>;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: Self::DeliveryOpaque) {
        let (partition, generation, sequence) = *opaque;
        let delivery = Delivery {
            partition,
            generation,
            sequence,
            error: result.as_ref().err().map(|(error, _)| error.to_string()),
        };
        if let Ok(sender) = self.deliveries.lock() {
            let _ = sender.send(delivery);
        }
    }
}

impl ShardSet {
    /// Applies the acknowledgements queued for `partition` to `shard` (of `generation`), whose
    /// slot the caller holds: held outputs are counted, outbox outputs deleted.
    pub(super) fn acknowledge_queued(&self, partition: i32, generation: u64, shard: &mut Shard) {
        let queued = self.lock().acknowledged.remove(&partition);
        match queued {
            Some((of, sequences)) if of == generation => {
                if let Err(error) = shard.acknowledge(&sequences) {
                    self.fail(error.to_string());
                }
            }
            // Reports of an earlier open: its outputs are re-sent from the outbox by this one.
            Some(_) => {}
            None => {}
        }
    }

    /// Applies delivery reports: acknowledged outputs leave the outbox (at once when their
    /// shard is idle, else by the thread running its batch, before the batch). A failed one fails
    /// the shard set: outputs are produced with no delivery timeout, so a failure is permanent, and
    /// re-sending it behind newer outputs would break the order downstream de-duplication relies
    /// on (docs/CONTRACT.md, "Exact de-duplication"). The restart re-sends the outbox, in order,
    /// before anything new.
    pub fn apply_deliveries(&self) {
        let reports: Vec<Delivery> = match self.deliveries.lock() {
            Ok(receiver) => receiver.try_iter().collect(),
            Err(_) => return,
        };
        let queued: Vec<(i32, u64, Slot)> = {
            let mut inner = self.lock();
            if reports.is_empty() && inner.acknowledged.is_empty() {
                return;
            }
            for report in reports {
                inner.in_flight.reported(report.partition, report.generation);
                let owned = inner
                    .shards
                    .get(&report.partition)
                    .is_some_and(|owned| owned.generation == report.generation);
                match report.error {
                    None if owned => {
                        let queued = inner
                            .acknowledged
                            .entry(report.partition)
                            .or_insert_with(|| (report.generation, Vec::new()));
                        if queued.0 != report.generation {
                            *queued = (report.generation, Vec::new());
                        }
                        queued.1.push(report.sequence);
                    }
                    // A report for a shard closed since: the output stays in that shard's outbox.
                    None => {}
                    Some(error) => self.fail(format!(
                        "output {} of partition {} was not acknowledged by the broker: {error}",
                        report.sequence, report.partition
                    )),
                }
            }
            self.metrics.outbox_pending.set(inner.unacknowledged() as i64);
            // Also those queued earlier while their shard was busy.
            inner
                .acknowledged
                .iter()
                .filter_map(|(partition, (generation, _))| {
                    let owned = inner.shards.get(partition)?;
                    Some((*partition, *generation, owned.slot.clone()))
                })
                .collect()
        };
        for (partition, generation, slot) in queued {
            // A shard in a batch takes its acknowledgements before its next batch.
            if let Ok(mut guard) = slot.try_lock()
                && let Some(shard) = guard.as_mut()
            {
                self.acknowledge_queued(partition, generation, shard);
            }
        }
    }

    /// Hands one output to the producer (waiting while its queue is full) and counts it in
    /// flight. `Err` for any other refusal: the output stays in the outbox.
    pub(super) fn send(
        &self,
        partition: i32,
        sequence: u64,
        record: &OutboxRecord,
    ) -> Result<(), KafkaError> {
        // Counted in flight before the producer has it: its delivery report can come back — and
        // be applied by another processing thread — before `producer.send` even returns. Counted
        // after, a report applied first found nothing to count off and the output stayed "in
        // flight" for good, holding back every caught-up check (CI, kill -9 test, batch.threads 3).
        let generation = {
            let mut inner = self.lock();
            match inner.shards.get(&partition) {
                Some(owned) => {
                    let generation = owned.generation;
                    inner.in_flight.sent(partition, generation);
                    generation
                }
                // Closed meanwhile: the next owner re-sends it from the outbox.
                None => return Ok(()),
            }
        };
        let mut attempts = 0u32;
        loop {
            let mut base =
                BaseRecord::with_opaque_to(&record.topic, Box::new((partition, generation, sequence)))
                    .key(&record.key)
                    .payload(&record.payload);
            if let Some(trace) = &record.trace {
                base = base.headers(trace::traceparent_headers(trace));
            }
            match self.producer.send(base) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull), _)) => {
                    attempts += 1;
                    if attempts.is_multiple_of(1000) {
                        tracing::warn!(partition, "producer queue full; waiting for the broker");
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err((error, _)) => {
                    // Never handed over: no report will come for it.
                    self.lock().in_flight.reported(partition, generation);
                    return Err(error);
                }
            }
        }
    }

    /// Produces the queued re-sends, oldest first. On a refusal the output goes back to the
    /// front of the queue and the error is returned.
    pub(crate) fn produce_resends(&self) -> Result<(), KafkaError> {
        loop {
            let next = self.lock().resend.pop_front();
            let Some((partition, sequence, record)) = next else {
                return Ok(());
            };
            if let Err(error) = self.send(partition, sequence, &record) {
                self.lock().resend.push_front((partition, sequence, record));
                return Err(error);
            }
        }
    }

    /// Outputs produced and not yet acknowledged (queued for re-sending, or in flight).
    pub fn unacknowledged(&self) -> usize {
        self.lock().unacknowledged()
    }
}
