//! The processing API, in the spirit of Spark's `transformWithState`: a [`StatefulProcessor`] gets
//! each input record of a key (and each fired timer) with a [`KeyContext`] that offers typed value,
//! list and map state with a per-variable TTL, dedup entries, event-time and processing-time timers,
//! and outputs. [`Shard::process_batch`] runs a micro-batch and commits everything — state, timers,
//! outputs (into the outbox) and the next input offset — in one RocksDB write batch.
//! [`Shard::process_held`] runs one without writing: its changes stay in memory until a commit
//! point ([`Shard::persist`]), and its outputs are not kept (see `shard::held`).
//!
//! Determinism: given the same committed state and the same input records in the same order, a
//! batch makes the same state changes and the same outputs, because event-time timers fire on the
//! shard watermark (max event time − allowed lateness), which depends only on the input. This is
//! what makes reprocessing after a crash regenerate byte-identical outputs.

mod context;

use std::collections::BTreeSet;

use crate::error::StateError;
use crate::keys::{self, cf};
use crate::shard::{OutboxRecord, Overlay, Shard, ShardProgress, TimeDomain, Timer, TimerEntry, TimerSlots};

pub use context::KeyContext;

/// One input record.
#[derive(Debug, Clone, Copy)]
pub struct InputRecord<'a> {
    /// The record key (the state key).
    pub key: &'a [u8],
    /// The record value.
    pub payload: &'a [u8],
    /// Its offset in the shard's input partition.
    pub offset: i64,
    /// Its trace context (opaque to the engine; contrail uses a W3C `traceparent`): every output
    /// emitted while handling this record carries it, also when re-sent from the outbox.
    pub trace: Option<&'a [u8]>,
    /// The broker's timestamp of the record (create or append time), µs; part of the input, so a
    /// processor may use it and stay deterministic.
    pub timestamp_us: Option<i64>,
}

/// User logic over keyed state. Must be deterministic in its inputs (no wall clock, no randomness)
/// for event-time processing to be replay-safe.
pub trait StatefulProcessor {
    /// Handles one input record of `context.key()`.
    fn handle_record(
        &mut self,
        context: &mut KeyContext<'_>,
        record: &InputRecord<'_>,
    ) -> Result<(), StateError>;
    /// Handles a fired timer of `context.key()` (user timers only; TTL timers are the engine's).
    fn handle_timer(&mut self, context: &mut KeyContext<'_>, timer: &Timer) -> Result<(), StateError>;
}

/// Engine settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// The shard watermark is the max event time minus this (µs).
    pub allowed_lateness_us: i64,
}

/// What a committed batch produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchResult {
    /// Outputs, with their outbox sequence numbers, in emission order.
    pub outputs: Vec<(u64, OutboxRecord)>,
    /// Input records processed.
    pub records: usize,
    /// User timers fired.
    pub timers_fired: usize,
    /// Variables or entries evicted by TTL.
    pub evicted: usize,
}

const TTL_TIMER_PREFIX: &str = "__ttl";
const DEDUP_TIMER: &str = "__dedup_ttl";
const NO_EXPIRY: i64 = i64::MAX;

/// Changes of a batch not yet committed.
struct Pending {
    overlay: Overlay,
    timers_added: BTreeSet<TimerEntry>,
    timers_removed: BTreeSet<TimerEntry>,
    /// Latest fire time per (key, domain, name) decided in this batch (`None`: deleted).
    timer_overrides: TimerSlots<Option<i64>>,
    outbox: Vec<OutboxRecord>,
    progress: ShardProgress,
    lateness_us: i64,
    /// Per time domain, the last committed timer the due-timer scan has passed.
    cursors: [Option<TimerEntry>; 2],
    /// The offset of the input record being handled, or of the last one handled in this batch.
    input_offset: Option<i64>,
    /// The trace context of the input record being handled (none while timers fire).
    trace: Option<Vec<u8>>,
}

impl Pending {
    fn new(progress: ShardProgress, lateness_us: i64) -> Pending {
        Pending {
            overlay: Overlay::new(),
            timers_added: BTreeSet::new(),
            timers_removed: BTreeSet::new(),
            timer_overrides: TimerSlots::default(),
            outbox: Vec::new(),
            progress,
            lateness_us,
            cursors: [None, None],
            input_offset: None,
            trace: None,
        }
    }

    fn watermark_us(&self) -> i64 {
        self.progress.max_event_time_us.saturating_sub(self.lateness_us)
    }
}

impl Shard {
    /// Runs `records` through `processor`, firing event-time timers as the watermark passes them and
    /// processing-time timers due at `now_us`, and commits everything in one write batch — the
    /// batch's outputs into the outbox, and whatever earlier batches held ([`Shard::process_held`]).
    /// Refused ([`StateError::NotAcknowledged`], nothing processed) while an output of a held batch
    /// is not acknowledged.
    pub fn process_batch<P: StatefulProcessor>(
        &mut self,
        records: &[InputRecord<'_>],
        processor: &mut P,
        config: &EngineConfig,
        now_us: i64,
    ) -> Result<BatchResult, StateError> {
        let unacknowledged = self.held().unacknowledged;
        if unacknowledged > 0 {
            return Err(StateError::NotAcknowledged(unacknowledged));
        }
        let result = self.process_in_memory(records, processor, config, Some(now_us))?;
        let outbox: Vec<(u64, &OutboxRecord)> = result
            .outputs
            .iter()
            .map(|(sequence, record)| (*sequence, record))
            .collect();
        self.persist_with(&outbox)?;
        Ok(result)
    }

    /// Runs `records` through `processor` like [`Shard::process_batch`], but holds the batch's
    /// changes in memory until the next commit point ([`Shard::persist`]) and writes no outbox:
    /// after a crash the shard reopens at the previous commit point and regenerates these outputs,
    /// byte for byte. Processing-time timers do not fire here (their outputs depend on the clock,
    /// so they are not regenerated): they fire in the next [`Shard::process_batch`].
    pub fn process_held<P: StatefulProcessor>(
        &mut self,
        records: &[InputRecord<'_>],
        processor: &mut P,
        config: &EngineConfig,
    ) -> Result<BatchResult, StateError> {
        self.process_in_memory(records, processor, config, None)
    }

    /// Processes a batch and holds its changes; outputs get their outbox sequence numbers.
    fn process_in_memory<P: StatefulProcessor>(
        &mut self,
        records: &[InputRecord<'_>],
        processor: &mut P,
        config: &EngineConfig,
        now_us: Option<i64>,
    ) -> Result<BatchResult, StateError> {
        self.refuse_if_failed()?;
        let mut pending = Pending::new(self.progress(), config.allowed_lateness_us);
        let mut result = BatchResult {
            outputs: Vec::new(),
            records: 0,
            timers_fired: 0,
            evicted: 0,
        };
        for record in records {
            if record.key.contains(&keys::SEPARATOR) {
                return Err(StateError::InvalidKey(
                    String::from_utf8_lossy(record.key).into_owned(),
                ));
            }
            pending.input_offset = Some(record.offset);
            pending.trace = record.trace.map(<[u8]>::to_vec);
            let mut context = KeyContext {
                shard: self,
                pending: &mut pending,
                key: record.key.to_vec(),
            };
            processor.handle_record(&mut context, record)?;
            pending.trace = None;
            pending.progress.next_offset = Some(record.offset + 1);
            result.records += 1;
            let watermark = pending.watermark_us();
            self.fire_due(
                &mut pending,
                processor,
                TimeDomain::EventTime,
                watermark,
                &mut result,
            )?;
        }
        if let Some(now_us) = now_us {
            self.fire_due(
                &mut pending,
                processor,
                TimeDomain::ProcessingTime,
                now_us,
                &mut result,
            )?;
        }
        let Pending {
            overlay,
            timers_added,
            timers_removed,
            outbox,
            progress,
            ..
        } = pending;
        let sequences = self.hold(
            overlay,
            timers_added,
            timers_removed,
            result.records,
            outbox.len(),
            progress,
        )?;
        result.outputs = sequences.zip(outbox).collect();
        Ok(result)
    }

    /// The earliest due timer of `domain` (committed or added in this batch, not removed).
    ///
    /// Committed timers are scanned from a per-domain cursor: the committed set does not change
    /// during a batch, and every committed timer before the cursor was fired or deleted in this
    /// batch (one re-registered since is in `timers_added`). Without the cursor each call would
    /// rescan every timer fired so far in the batch — quadratic in the timers per batch.
    fn next_due(&self, pending: &mut Pending, domain: TimeDomain, limit_us: i64) -> Option<TimerEntry> {
        use std::ops::Bound::{Excluded, Unbounded};
        let slot = domain as usize;
        let range = match &pending.cursors[slot] {
            Some(cursor) => self
                .timers()
                .by_time()
                .range((Excluded(cursor.clone()), Unbounded)),
            None => self.timers().by_time().range::<TimerEntry, _>(..),
        };
        let mut committed = None;
        let mut skipped = None;
        for timer in range {
            if timer.fire_at_us > limit_us {
                break;
            }
            if timer.domain == domain && !pending.timers_removed.contains(timer) {
                committed = Some(timer);
                break;
            }
            skipped = Some(timer);
        }
        if let Some(skipped) = skipped {
            pending.cursors[slot] = Some(skipped.clone());
        }
        let added = pending
            .timers_added
            .iter()
            .take_while(|timer| timer.fire_at_us <= limit_us)
            .find(|timer| timer.domain == domain);
        match (committed, added) {
            (Some(committed), Some(added)) if added < committed => Some(added.clone()),
            (Some(committed), _) => {
                pending.cursors[slot] = Some(committed.clone());
                Some(committed.clone())
            }
            (None, added) => added.cloned(),
        }
    }

    fn fire_due<P: StatefulProcessor>(
        &self,
        pending: &mut Pending,
        processor: &mut P,
        domain: TimeDomain,
        limit_us: i64,
        result: &mut BatchResult,
    ) -> Result<(), StateError> {
        while let Some(timer) = self.next_due(pending, domain, limit_us) {
            let mut context = KeyContext {
                shard: self,
                pending,
                key: timer.key.to_vec(),
            };
            context.delete_timer(&timer.name, timer.domain);
            if &*timer.name == DEDUP_TIMER {
                let watermark = context.watermark_us();
                let mut remaining_earliest = None;
                for (id, expires_at) in context.dedup_entries()? {
                    if expires_at <= watermark {
                        context.write(cf::DEDUP, keys::joined(&timer.key, &id), None);
                        result.evicted += 1;
                    } else {
                        remaining_earliest =
                            Some(remaining_earliest.map_or(expires_at, |t: i64| t.min(expires_at)));
                    }
                }
                if let Some(next) = remaining_earliest {
                    context.register_timer(DEDUP_TIMER, TimeDomain::EventTime, next);
                }
            } else if let Some(rest) = timer.name.strip_prefix(TTL_TIMER_PREFIX) {
                let Some(storage_key) = ttl_target(&timer.key, rest) else {
                    continue;
                };
                // The entry may have been written since with a later expiry (lazy expiry): evict
                // it only once its stored expiry has passed, else fire again then.
                let stored = context.read(cf::VALUES, &storage_key)?;
                match stored.as_deref().and_then(keys::decode_time) {
                    None => {}
                    Some(expiry) if expiry == NO_EXPIRY => {}
                    Some(expiry) if expiry > context.watermark_us() => {
                        context.register_timer(&timer.name, TimeDomain::EventTime, expiry);
                    }
                    Some(_) => {
                        context.write(cf::VALUES, storage_key, None);
                        result.evicted += 1;
                    }
                }
            } else {
                processor.handle_timer(&mut context, &timer.to_timer())?;
                result.timers_fired += 1;
            }
        }
        Ok(())
    }
}

/// The storage key a TTL timer guards: `/v/{variable}`, `/m/{variable}/{hex key}`,
/// `/l/{list}/{index}`.
fn ttl_target(key: &[u8], what: &str) -> Option<Vec<u8>> {
    if let Some(variable) = what.strip_prefix("/v/") {
        Some(keys::joined(key, variable.as_bytes()))
    } else if let Some(rest) = what.strip_prefix("/m/") {
        let (variable, hex_key) = rest.rsplit_once('/')?;
        let map_key: Vec<u8> = (0..hex_key.len() / 2)
            .filter_map(|index| u8::from_str_radix(hex_key.get(index * 2..index * 2 + 2)?, 16).ok())
            .collect();
        Some(keys::map_entry(key, variable, &map_key))
    } else if let Some(rest) = what.strip_prefix("/l/") {
        let (variable, index) = rest.rsplit_once('/')?;
        let index = index.parse::<i64>().ok()?;
        Some(keys::map_entry(key, variable, &keys::encode_time(index)))
    } else {
        None
    }
}

/// Read-only access to one key's committed state, for admin reads (the analogue of Spark's state
/// data source reader): `inspect` gets a [`KeyContext`] whose reads see committed state only;
/// anything it writes is discarded.
pub fn inspect<R>(
    shard: &Shard,
    key: &[u8],
    allowed_lateness_us: i64,
    inspect: impl FnOnce(&KeyContext<'_>) -> R,
) -> R {
    let mut pending = Pending::new(shard.progress(), allowed_lateness_us);
    let context = KeyContext {
        shard,
        pending: &mut pending,
        key: key.to_vec(),
    };
    inspect(&context)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// Input payload: `event time, expiry` (µs; a negative expiry clears the value). Sets the
    /// key's value `v` (the input offset) with that expiry.
    struct Expiring;

    #[derive(Clone, PartialEq, prost::Message)]
    struct Offset {
        #[prost(int64, tag = "1")]
        offset: i64,
    }

    /// A test payload `event time,rest`: observes the event time; the time and the rest.
    fn observed<'a>(context: &mut KeyContext<'_>, record: &InputRecord<'a>) -> (i64, &'a str) {
        let text = std::str::from_utf8(record.payload).expect("utf8");
        let (time, rest) = text.split_once(',').expect("comma");
        let time = time.parse().expect("time");
        context.observe_event_time(time);
        (time, rest)
    }

    impl StatefulProcessor for Expiring {
        fn handle_record(
            &mut self,
            context: &mut KeyContext<'_>,
            record: &InputRecord<'_>,
        ) -> Result<(), StateError> {
            let (_, expiry) = observed(context, record);
            let expiry: i64 = expiry.parse().expect("expiry");
            if expiry < 0 {
                context.clear("v");
            } else {
                context.set(
                    "v",
                    &Offset {
                        offset: record.offset,
                    },
                    Some(expiry),
                );
            }
            Ok(())
        }

        fn handle_timer(&mut self, _: &mut KeyContext<'_>, _: &Timer) -> Result<(), StateError> {
            Ok(())
        }
    }

    const LATENESS: i64 = 10;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Lazy expiry against a model written apart: after every batch a key's value is readable
        /// — and physically stored — exactly when its last write set it with an expiry after the
        /// watermark; its one TTL timer never fires after that expiry; and a value rewritten with
        /// ever later expiries keeps its timer where it was (no timer write per rewrite).
        #[test]
        fn a_value_lives_until_its_last_expiry_whatever_the_rewrites(
            batches in prop::collection::vec(
                prop::collection::vec((0u8..3, 0i64..100, -20i64..140), 1..12),
                1..8,
            ),
        ) {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut shard = Shard::open(&dir.path().join("s"), 0).expect("open");
            let config = EngineConfig { allowed_lateness_us: LATENESS };
            // The model: the last write per key (expiry, or None: cleared) and the max event time.
            let mut last: BTreeMap<Vec<u8>, Option<i64>> = BTreeMap::new();
            let mut max_time = i64::MIN;
            let mut offset = 0;
            for batch in batches {
                let inputs: Vec<(Vec<u8>, Vec<u8>, i64)> = batch
                    .iter()
                    .map(|(key, time, expiry)| {
                        offset += 1;
                        (vec![b'a' + key], format!("{time},{expiry}").into_bytes(), offset)
                    })
                    .collect();
                let records: Vec<InputRecord<'_>> = inputs
                    .iter()
                    .map(|(key, payload, offset)| InputRecord {
                        key,
                        payload,
                        offset: *offset,
                        trace: None,
                        timestamp_us: None,
                    })
                    .collect();
                shard.process_batch(&records, &mut Expiring, &config, 0).expect("batch");
                for (key, time, expiry) in &batch {
                    max_time = max_time.max(*time);
                    last.insert(vec![b'a' + key], (*expiry >= 0).then_some(*expiry));
                }
                let watermark = max_time - LATENESS;
                for (key, written) in &last {
                    let live = written.is_some_and(|expiry| expiry > watermark);
                    let readable = inspect(&shard, key, LATENESS, |context| {
                        context.get::<Offset>("v").expect("get").is_some()
                    });
                    prop_assert_eq!(readable, live, "key {:?} readable", key);
                    let stored = shard.get(cf::VALUES, &keys::joined(key, b"v")).expect("get").is_some();
                    prop_assert_eq!(stored, live, "key {:?} stored", key);
                    let ttl: Vec<Timer> = inspect(&shard, key, LATENESS, |context| context.timers());
                    prop_assert_eq!(ttl.len(), usize::from(live), "key {:?}: {:?}", key, ttl);
                    if let (Some(timer), Some(expiry)) = (ttl.first(), written) {
                        prop_assert!(timer.fire_at_us <= *expiry && timer.fire_at_us > watermark);
                    }
                }
            }
        }
    }

    /// One record of `key` as a batch through [`Expiring`]; the batch's result.
    fn run(shard: &mut Shard, key: &[u8], payload: &str, offset: i64) -> BatchResult {
        let record = InputRecord {
            key,
            payload: payload.as_bytes(),
            offset,
            trace: None,
            timestamp_us: None,
        };
        let config = EngineConfig {
            allowed_lateness_us: LATENESS,
        };
        shard
            .process_batch(&[record], &mut Expiring, &config, 0)
            .expect("batch")
    }

    /// When the timers of `key` fire.
    fn fire_times(shard: &Shard, key: &[u8]) -> Vec<i64> {
        inspect(shard, key, LATENESS, |context| context.timers())
            .iter()
            .map(|timer| timer.fire_at_us)
            .collect()
    }

    /// Input payload: `event time, map key`. Puts the map entry with an expiry 10 µs after the
    /// event time: one uniquely named TTL timer per map key.
    struct MapEntries;

    impl StatefulProcessor for MapEntries {
        fn handle_record(
            &mut self,
            context: &mut KeyContext<'_>,
            record: &InputRecord<'_>,
        ) -> Result<(), StateError> {
            let (time, map_key) = observed(context, record);
            let value = Offset {
                offset: record.offset,
            };
            context.map_put("m", map_key.as_bytes(), &value, Some(time + 10));
            Ok(())
        }

        fn handle_timer(&mut self, _: &mut KeyContext<'_>, _: &Timer) -> Result<(), StateError> {
            Ok(())
        }
    }

    #[test]
    fn evicted_map_entries_let_their_timer_names_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut shard = Shard::open(&dir.path().join("s"), 0).expect("open");
        let config = EngineConfig {
            allowed_lateness_us: LATENESS,
        };
        let batch = |shard: &mut Shard, payloads: &[String], first_offset: i64| {
            let records: Vec<InputRecord<'_>> = payloads
                .iter()
                .zip(first_offset..)
                .map(|(payload, offset)| InputRecord {
                    key: b"k",
                    payload: payload.as_bytes(),
                    offset,
                    trace: None,
                    timestamp_us: None,
                })
                .collect();
            shard
                .process_batch(&records, &mut MapEntries, &config, 0)
                .expect("batch")
        };
        let puts: Vec<String> = (0..50).map(|i| format!("0,entry{i}")).collect();
        batch(&mut shard, &puts, 0);
        assert_eq!(shard.timers().len(), 50);
        assert_eq!(shard.timers().names_in_use(), 50);
        // Watermark 40 passes every expiry (10): all 50 evicted in one batch, and one new entry.
        let result = batch(&mut shard, &["50,last".to_owned()], 50);
        assert_eq!(result.evicted, 50);
        assert_eq!(shard.timers().len(), 1);
        assert_eq!(shard.timers().names_in_use(), 1, "only the new entry's name");
    }

    #[test]
    fn rewriting_a_value_with_a_later_expiry_leaves_its_timer_in_place() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut shard = Shard::open(&dir.path().join("s"), 0).expect("open");
        run(&mut shard, b"k", "0,100", 0);
        run(&mut shard, b"k", "1,200", 1);
        run(&mut shard, b"k", "2,300", 2);
        assert_eq!(fire_times(&shard, b"k"), vec![100]);
        // Watermark 150 passes the timer, not the value: the timer moves to the value's expiry.
        assert_eq!(run(&mut shard, b"other", "160,-1", 3).evicted, 0);
        assert_eq!(fire_times(&shard, b"k"), vec![300]);
        assert_eq!(run(&mut shard, b"other", "310,-1", 4).evicted, 1);
        assert!(fire_times(&shard, b"k").is_empty());
        assert!(
            shard
                .get(cf::VALUES, &keys::joined(b"k", b"v"))
                .expect("get")
                .is_none()
        );
    }
}
