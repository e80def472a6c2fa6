//! The outbox: outputs kept in the shard until the broker acknowledges them, their encoding and
//! their removal.

use rocksdb::{IteratorMode, WriteBatch};

use super::Shard;
use crate::error::StateError;
use crate::keys::cf;

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

impl Shard {
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

    /// Applies the broker's acknowledgements: an output of a held batch is counted (a commit
    /// point waits for all of them, [`Shard::persist`]); one in the outbox is removed (one small
    /// write batch: a range deletion per run of consecutive sequence numbers — acknowledgements
    /// mostly arrive in order — so a batch of outputs costs one entry, not one per output).
    pub fn acknowledge(&mut self, sequences: &[u64]) -> Result<(), StateError> {
        let first_held = self.held.first_sequence;
        let held = sequences
            .iter()
            .filter(|sequence| **sequence >= first_held)
            .count();
        self.held.acknowledged += held as u64;
        if held == sequences.len() {
            return Ok(());
        }
        let stored: Vec<u64> = sequences
            .iter()
            .copied()
            .filter(|sequence| *sequence < first_held)
            .collect();
        let mut batch = WriteBatch::default();
        let outbox = self.handle(cf::OUTBOX)?;
        for run in consecutive_runs(&stored) {
            if run.end - run.start == 1 {
                batch.delete_cf(outbox, run.start.to_be_bytes());
            } else {
                batch.delete_range_cf(outbox, run.start.to_be_bytes(), run.end.to_be_bytes());
            }
        }
        self.db.write(batch).map_err(|error| self.storage_error(error))
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
pub(super) fn encode_outbox_record(record: &OutboxRecord, bytes: &mut Vec<u8>) {
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

pub(super) fn decode_sequence(bytes: &[u8]) -> Result<u64, StateError> {
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
    use crate::shard::Overlay;
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
        let sequences: Vec<u64> = shard
            .hold(Overlay::new(), [], [], 0, outbox.len(), progress)
            .expect("hold")
            .collect();
        let with_sequences: Vec<(u64, &OutboxRecord)> = sequences.iter().copied().zip(&outbox).collect();
        shard.persist_with(&with_sequences).expect("persist");
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
}
