//! Dead letters that always fit (pure).
//!
//! A record is dead-lettered because something is wrong with it — possibly its size. A dead
//! letter carries the record, so one built naively from a record near the broker's message limit
//! is itself too large: the broker refuses it, and a stage that must not commit past an
//! un-delivered dead letter stalls on that partition forever. [`fit`] bounds every dead letter:
//! the reason and field errors are capped, and when the record would still not fit, `payload`
//! keeps its first bytes with `payload_truncated` set; `payload_size` always tells the record's
//! size. Deterministic, so dedup-state (which regenerates identical outputs after a restart) may
//! use it too.

use contrail_proto::v1::{DeadLetter, SourcePosition};
use prost::Message as _;

/// What a Kafka record costs beyond its key and value (record header, varints, batch share);
/// generous, so that "fits" holds whatever the broker counts.
pub const RECORD_OVERHEAD_BYTES: usize = 512;
/// Longest `reason` kept, in bytes.
pub const MAX_REASON_BYTES: usize = 4_096;
/// Field errors kept (the rest are summarised in the last one).
pub const MAX_FIELD_ERRORS: usize = 64;
/// Longest field error message kept, in bytes.
pub const MAX_FIELD_ERROR_BYTES: usize = 512;

/// Caps `text` to `max` bytes on a character boundary, marking the cut.
fn cap(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut end = max.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
}

/// Makes `letter` fit in one message of at most `max_message_bytes` (at least 64 KB: the capped
/// reason and errors take up to ≈ 40 KB) with a key of `key_len` bytes: sets `payload_size`, caps the reason and errors, and truncates the payload (setting
/// `payload_truncated`) if it must. Returns whether the payload was truncated.
pub fn fit(letter: &mut DeadLetter, key_len: usize, max_message_bytes: usize) -> bool {
    if letter.payload_size == 0 {
        letter.payload_size = letter.payload.len() as u64;
    }
    cap(&mut letter.reason, MAX_REASON_BYTES);
    if letter.errors.len() > MAX_FIELD_ERRORS {
        let dropped = letter.errors.len() - (MAX_FIELD_ERRORS - 1);
        letter.errors.truncate(MAX_FIELD_ERRORS - 1);
        letter.errors.push(contrail_proto::v1::FieldError {
            field: String::new(),
            message: format!("… and {dropped} more errors"),
        });
    }
    for error in &mut letter.errors {
        cap(&mut error.field, MAX_FIELD_ERROR_BYTES);
        cap(&mut error.message, MAX_FIELD_ERROR_BYTES);
    }
    let budget = max_message_bytes.saturating_sub(key_len + RECORD_OVERHEAD_BYTES);
    if letter.encoded_len() <= budget {
        return false;
    }
    // The flag is part of the size; the payload's length prefix only shrinks with the payload,
    // so cutting the excess once is enough.
    letter.payload_truncated = true;
    let excess = letter.encoded_len().saturating_sub(budget);
    let keep = letter.payload.len().saturating_sub(excess);
    letter.payload.truncate(keep);
    true
}

/// A consumed record a stage cannot process.
#[derive(Debug, Clone)]
pub struct Unprocessable<'a> {
    /// Where it was read (becomes the dead letter's `input` and `origin`).
    pub position: SourcePosition,
    /// Its key (the dead letter keeps it, so it stays in its flight's partition).
    pub key: &'a [u8],
    /// Its value as read.
    pub payload: &'a [u8],
    /// What the value should have been, e.g. `application/x-protobuf; contrail.v1.FlightState`.
    pub content_type: String,
}

impl Unprocessable<'_> {
    /// The encoded dead letter of this record from `stage` with `reason`, fitted to one message of
    /// at most `max_message_bytes` ([`fit`]). `rejected_at_us` is 0 where outputs must be
    /// deterministic (dedup-state).
    pub fn dead_letter(
        &self,
        stage: &str,
        reason: String,
        rejected_at_us: i64,
        max_message_bytes: usize,
    ) -> Vec<u8> {
        let mut letter = DeadLetter {
            stage: stage.to_owned(),
            reason,
            payload: self.payload.to_vec(),
            content_type: self.content_type.clone(),
            origin: self.position.topic.clone(),
            rejected_at_us,
            input: Some(self.position.clone()),
            ..DeadLetter::default()
        };
        fit(&mut letter, self.key.len(), max_message_bytes);
        letter.encode_to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use contrail_proto::v1::FieldError;
    use proptest::prelude::*;

    #[test]
    fn an_unprocessable_record_becomes_a_fitted_dead_letter_with_its_position() {
        let payload = vec![7u8; 300_000];
        let record = Unprocessable {
            position: SourcePosition {
                topic: "ops.flights.curated".to_owned(),
                partition: 3,
                offset: 41,
            },
            key: b"UA1545-2013-01-01-EWR",
            payload: &payload,
            content_type: "application/x-protobuf; contrail.v1.FlightState".to_owned(),
        };
        let encoded = record.dead_letter("cosmos-writer", "not a FlightState".to_owned(), 0, 100_000);
        assert!(encoded.len() + record.key.len() + RECORD_OVERHEAD_BYTES <= 100_000);
        let letter = DeadLetter::decode(encoded.as_slice()).expect("decodes");
        assert_eq!(letter.stage, "cosmos-writer");
        assert_eq!(letter.origin, "ops.flights.curated");
        assert_eq!(letter.input.as_ref().map(|input| input.offset), Some(41));
        assert_eq!(letter.payload_size, 300_000);
        assert!(letter.payload_truncated);
        assert!(letter.payload.iter().all(|&byte| byte == 7));
    }

    #[test]
    fn a_record_near_the_limit_is_truncated_and_says_so() {
        let mut letter = DeadLetter {
            stage: "ingest".to_owned(),
            reason: "record 3 is 1048576 bytes; limits.max_record_bytes = 524288".to_owned(),
            payload: vec![b'x'; 1_048_576],
            ..DeadLetter::default()
        };
        assert!(fit(&mut letter, 30, 1_000_000));
        assert!(letter.payload_truncated);
        assert_eq!(letter.payload_size, 1_048_576);
        assert!(letter.encoded_len() + 30 + RECORD_OVERHEAD_BYTES <= 1_000_000);
        assert!(letter.payload.len() > 990_000, "keeps as much as fits");
        let mut small = DeadLetter {
            payload: b"{\"bad\":".to_vec(),
            ..DeadLetter::default()
        };
        assert!(!fit(&mut small, 10, 1_000_000));
        assert_eq!(small.payload_size, 7);
        assert!(!small.payload_truncated);
    }

    proptest! {
        /// Whatever the record, reason and errors: the dead letter fits, `payload_size` is the
        /// record's size, a kept payload is the record's prefix, and one that fitted is unchanged.
        #[test]
        fn every_dead_letter_fits(
            payload_len in 0usize..400_000,
            reason_len in 0usize..10_000,
            errors in 0usize..200,
            key_len in 0usize..2_000,
            max in 64_000usize..1_100_000,
        ) {
            let payload: Vec<u8> = (0..payload_len).map(|n| (n % 251) as u8).collect();
            let mut letter = DeadLetter {
                reason: "é".repeat(reason_len / 2),
                errors: (0..errors)
                    .map(|n| FieldError { field: format!("f{n}"), message: "m".repeat(n * 7) })
                    .collect(),
                payload: payload.clone(),
                ..DeadLetter::default()
            };
            let truncated = fit(&mut letter, key_len, max);
            prop_assert!(letter.encoded_len() + key_len + RECORD_OVERHEAD_BYTES <= max);
            prop_assert_eq!(letter.payload_size, payload_len as u64);
            prop_assert!(payload.starts_with(&letter.payload));
            prop_assert_eq!(truncated, letter.payload_truncated);
            prop_assert_eq!(!truncated, letter.payload == payload);
            prop_assert!(letter.errors.len() <= MAX_FIELD_ERRORS);
        }
    }
}
