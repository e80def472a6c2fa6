//! Polled records on their way to a batch: copied out of librdkafka's buffer ([`OwnedRecord`]),
//! held per partition until their partition's next batch ([`Pending`]), and the trace side of a
//! batch ([`TracedBatch`]).
use std::collections::{BTreeMap, HashSet, VecDeque};

use contrail_common::trace::{self, TraceParent};
use rdkafka::message::Message;

/// Records polled and not yet processed, per partition, and the partitions with a batch running.
#[derive(Default)]
pub(crate) struct Pending {
    records: BTreeMap<i32, VecDeque<OwnedRecord>>,
    pub(crate) total: usize,
    pub(crate) running: HashSet<i32>,
}

impl Pending {
    pub(crate) fn push(&mut self, partition: i32, record: OwnedRecord) {
        self.records.entry(partition).or_default().push_back(record);
        self.total += 1;
    }

    /// Drops the records of `partition` (they are read again after a seek).
    pub(crate) fn clear(&mut self, partition: i32) {
        if let Some(records) = self.records.remove(&partition) {
            self.total -= records.len();
        }
    }

    /// Puts records back in front of `partition`'s queue.
    pub(crate) fn put_back(&mut self, partition: i32, records: Vec<OwnedRecord>) {
        self.total += records.len();
        let queue = self.records.entry(partition).or_default();
        for record in records.into_iter().rev() {
            queue.push_front(record);
        }
    }

    /// The next batch of a partition with records and no batch running, up to `max_records`,
    /// taking partitions round-robin after `after`.
    pub(crate) fn next_batch(
        &mut self,
        after: &mut i32,
        max_records: usize,
    ) -> Option<(i32, Vec<OwnedRecord>)> {
        let ready = |(partition, queue): (&i32, &VecDeque<OwnedRecord>)| {
            (!queue.is_empty() && !self.running.contains(partition)).then_some(*partition)
        };
        let partition = self
            .records
            .range(after.saturating_add(1)..)
            .find_map(ready)
            .or_else(|| self.records.range(..=*after).find_map(ready))?;
        let queue = self.records.get_mut(&partition)?;
        let take = queue.len().min(max_records);
        let records: Vec<OwnedRecord> = queue.drain(..take).collect();
        if queue.is_empty() {
            self.records.remove(&partition);
        }
        self.total -= records.len();
        *after = partition;
        Some((partition, records))
    }
}

/// The trace side of a batch: a span for the batch, linked to a span per sampled record (a child
/// of the record's context, open until the batch's outputs are handed to the producer); the
/// context each record's outputs carry ([`contrail_common::trace::continued`]). A record is
/// sampled when its producer flagged it so *and* contrail's sampler samples its trace: for
/// records from ingest (which already decided by the same rule) nothing changes; a source writing
/// to the raw topic directly and flagging everything gets the configured share, and the context
/// passed on says not sampled for the rest.
pub(crate) struct TracedBatch {
    pub(crate) batch: tracing::Span,
    pub(crate) contexts: Vec<Option<String>>,
    /// Kept open while the batch is processed and produced.
    _records: Vec<tracing::Span>,
}

impl TracedBatch {
    pub(crate) fn new(partition: i32, records: &[&OwnedRecord], sampler: &trace::Sampler) -> TracedBatch {
        let mut spans = Vec::new();
        let mut links = Vec::new();
        let contexts = records
            .iter()
            .map(|record| {
                let parent = record.trace?;
                let parent = if parent.sampled() {
                    sampler.decide(parent)
                } else {
                    parent
                };
                if !parent.sampled() {
                    return Some(parent.header());
                }
                let span = tracing::info_span!(
                    parent: None,
                    "dedup-state.record",
                    flight.key = %String::from_utf8_lossy(&record.key),
                    messaging.kafka.partition = partition,
                    messaging.kafka.offset = record.offset,
                );
                parent.adopt(&span);
                let context = trace::continued(Some(parent), &span);
                if let Some(own) = context.filter(|own| *own != parent) {
                    links.push(own);
                }
                spans.push(span);
                context.map(|context| context.header())
            })
            .collect();
        let batch = tracing::info_span!(
            parent: None,
            "dedup-state.batch",
            messaging.kafka.partition = partition,
            records = records.len(),
            traced = spans.len(),
            outputs = tracing::field::Empty,
        );
        for link in links {
            link.link_from(&batch);
        }
        TracedBatch {
            batch,
            contexts,
            _records: spans,
        }
    }
}

/// A polled record, copied out of librdkafka's buffer.
pub(crate) struct OwnedRecord {
    pub(crate) offset: i64,
    pub(crate) key: Vec<u8>,
    pub(crate) payload: Vec<u8>,
    /// The record's broker timestamp (create or append time), ms.
    pub(crate) timestamp_ms: Option<i64>,
    /// Its trace context (the `traceparent` header), if it carries one.
    pub(crate) trace: Option<TraceParent>,
}

#[cfg(test)]
impl OwnedRecord {
    /// An empty record at `offset`.
    pub(crate) fn for_test(offset: i64) -> OwnedRecord {
        OwnedRecord {
            offset,
            key: Vec::new(),
            payload: Vec::new(),
            timestamp_ms: None,
            trace: None,
        }
    }
}

impl<M: Message> From<&M> for OwnedRecord {
    fn from(message: &M) -> Self {
        OwnedRecord {
            offset: message.offset(),
            key: message.key().unwrap_or_default().to_vec(),
            payload: message.payload().unwrap_or_default().to_vec(),
            timestamp_ms: message.timestamp().to_millis(),
            trace: TraceParent::of_record(message.headers()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(offset: i64) -> OwnedRecord {
        OwnedRecord::for_test(offset)
    }

    /// A producer that flags every record sampled does not decide for contrail: at a share of 0
    /// no record gets a span and the context passed on says not sampled; at 1 the flag stands.
    #[test]
    fn a_producers_sampled_flag_is_narrowed_by_contrails_sampler() {
        let flagged = TraceParent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let mut traced = record(7);
        traced.trace = flagged;
        let sampler = |ratio| trace::Sampler {
            exporting: true,
            ratio,
        };
        let none = TracedBatch::new(0, &[&traced], &sampler(0.0));
        assert!(none._records.is_empty(), "no span for an unsampled trace");
        assert_eq!(
            none.contexts,
            [Some(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00".to_owned()
            )]
        );
        let every = TracedBatch::new(0, &[&traced], &sampler(1.0));
        assert_eq!(every._records.len(), 1, "a span for the sampled trace");
        assert_eq!(
            every.contexts,
            [Some(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned()
            )],
            "no exporter here: the context goes on unchanged"
        );
    }

    #[derive(Debug, Clone)]
    enum Step {
        Poll(i32),
        Start,
        Finish,
        Gap,
        Accept,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..4i32).prop_map(Step::Poll),
            3 => Just(Step::Start),
            3 => Just(Step::Finish),
            1 => Just(Step::Gap),
            1 => Just(Step::Accept),
        ]
    }

    proptest! {
        /// Whatever the interleaving of polls, batch starts and finishes, gaps (held records
        /// dropped) and accepted gaps (records put back): no partition ever has two batches
        /// running, every partition's records are processed in the order polled, batches stay
        /// within `max_records`, and the held count is exact.
        #[test]
        fn batches_run_one_per_partition_in_offset_order(
            steps in proptest::collection::vec(step(), 1..300),
            max_records in 1usize..5,
            threads in 1usize..4,
        ) {
            let mut pending = Pending::default();
            let mut after = -1;
            let mut next_offset = [0i64; 4];
            // Per partition: the last offset handed to a batch that was processed.
            let mut processed: [Option<i64>; 4] = [None; 4];
            let mut running: Vec<(i32, Vec<OwnedRecord>)> = Vec::new();
            for step in steps {
                match step {
                    Step::Poll(partition) => {
                        pending.push(partition, record(next_offset[partition as usize]));
                        next_offset[partition as usize] += 1;
                    }
                    Step::Start => {
                        if running.len() < threads
                            && let Some((partition, records)) = pending.next_batch(&mut after, max_records)
                        {
                            prop_assert!(!pending.running.contains(&partition), "partition {partition} twice");
                            prop_assert!(!records.is_empty() && records.len() <= max_records);
                            pending.running.insert(partition);
                            running.push((partition, records));
                        }
                    }
                    Step::Finish | Step::Gap | Step::Accept => {
                        if running.is_empty() {
                            continue;
                        }
                        let (partition, records) = running.remove(0);
                        pending.running.remove(&partition);
                        match step {
                            Step::Finish => {
                                for record in &records {
                                    let last = &mut processed[partition as usize];
                                    prop_assert!(
                                        last.is_none_or(|last| record.offset == last + 1),
                                        "partition {partition}: {} after {last:?}", record.offset
                                    );
                                    *last = Some(record.offset);
                                }
                            }
                            Step::Gap => {
                                // Read again from the first record not processed.
                                pending.clear(partition);
                                next_offset[partition as usize] =
                                    processed[partition as usize].map_or(0, |last| last + 1);
                            }
                            _ => pending.put_back(partition, records),
                        }
                    }
                }
                let held: usize = pending.records.values().map(VecDeque::len).sum();
                prop_assert_eq!(held, pending.total);
            }
        }
    }
}
