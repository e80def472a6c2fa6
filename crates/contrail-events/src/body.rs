//! Splitting an HTTP request body into records.

use serde_json::Value;

/// One record of a request body, parsed or not.
#[derive(Debug, Clone, PartialEq)]
pub enum BodyRecord {
    /// Well-formed JSON (not yet validated against the contract).
    Parsed {
        /// Position of the record in the request, from 0.
        index: usize,
        /// The parsed value.
        value: Value,
        /// The record's bytes, for the dead-letter topic.
        raw: Vec<u8>,
    },
    /// One record's bytes, not parsed yet: validate with [`validate_json`](crate::validate_json), which
    /// also reports bytes that are not JSON.
    Raw {
        /// Position of the record in the request, from 0.
        index: usize,
        /// The record's bytes: a zero-copy slice of the request body.
        raw: bytes::Bytes,
    },
    /// Bytes that are not JSON.
    Malformed {
        /// Position of the record in the request, from 0.
        index: usize,
        /// The bytes as received.
        raw: Vec<u8>,
        /// What the JSON parser said.
        error: String,
    },
}

impl BodyRecord {
    /// Position of the record in its request.
    pub fn index(&self) -> usize {
        match self {
            BodyRecord::Parsed { index, .. }
            | BodyRecord::Raw { index, .. }
            | BodyRecord::Malformed { index, .. } => *index,
        }
    }

    /// The record's size in bytes as received.
    pub fn raw_len(&self) -> usize {
        match self {
            BodyRecord::Parsed { raw, .. } | BodyRecord::Malformed { raw, .. } => raw.len(),
            BodyRecord::Raw { raw, .. } => raw.len(),
        }
    }
}

/// A body that holds no record at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Nothing but whitespace.
    #[error("request body is empty: send one JSON object, a JSON array of objects, or NDJSON")]
    Empty,
}

/// Splits a body into records without building JSON trees: a JSON array (one record per element), a
/// single JSON value (which may span several lines), or newline-delimited JSON (one record per
/// non-empty line, so one bad line does not hide the others; bad lines are reported when validated).
/// Never panics.
pub fn split_body(body: &bytes::Bytes) -> Result<Vec<BodyRecord>, BodyError> {
    let trimmed = body.trim_ascii();
    let Some(&first_byte) = trimmed.first() else {
        return Err(BodyError::Empty);
    };
    if first_byte == b'[' {
        return Ok(split_array(body, trimmed));
    }
    // A single (possibly pretty-printed) JSON value: checked without building it.
    if serde_json::from_slice::<serde::de::IgnoredAny>(trimmed).is_ok() {
        return Ok(vec![BodyRecord::Raw {
            index: 0,
            raw: body.slice_ref(trimmed),
        }]);
    }
    Ok(trimmed
        .split(|&byte| byte == b'\n')
        .map(|line| line.trim_ascii())
        .filter(|line| !line.is_empty())
        .enumerate()
        .map(|(index, line)| BodyRecord::Raw {
            index,
            raw: body.slice_ref(line),
        })
        .collect())
}

fn split_array(body: &bytes::Bytes, trimmed: &[u8]) -> Vec<BodyRecord> {
    match serde_json::from_slice::<Vec<&serde_json::value::RawValue>>(trimmed) {
        Ok(elements) => elements
            .into_iter()
            .enumerate()
            .map(|(index, element)| BodyRecord::Raw {
                index,
                raw: body.slice_ref(element.get().as_bytes()),
            })
            .collect(),
        Err(error) => vec![BodyRecord::Malformed {
            index: 0,
            raw: trimmed.to_vec(),
            error: format!("invalid JSON array: {error}"),
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(records: &[BodyRecord]) -> Vec<&'static str> {
        records
            .iter()
            .map(|record| match record {
                BodyRecord::Parsed { .. } | BodyRecord::Raw { .. } => "ok",
                BodyRecord::Malformed { .. } => "bad",
            })
            .collect()
    }

    #[test]
    fn empty_body_is_an_error() {
        assert_eq!(
            split_body(&bytes::Bytes::from_static(b"  \n ")),
            Err(BodyError::Empty)
        );
    }

    #[test]
    fn single_pretty_printed_object_is_one_record() {
        let records =
            split_body(&bytes::Bytes::from_static(b"{\n  \"a\": 1,\n  \"b\": 2\n}\n")).expect("records");
        assert_eq!(kinds(&records), ["ok"]);
    }

    #[test]
    fn array_gives_one_record_per_element() {
        let records = split_body(&bytes::Bytes::from_static(b"[{\"a\":1},{\"a\":2},3]")).expect("records");
        assert_eq!(kinds(&records), ["ok", "ok", "ok"]);
        assert_eq!(records[2].index(), 2);
    }

    #[test]
    fn broken_array_is_one_malformed_record() {
        let records = split_body(&bytes::Bytes::from_static(b"[{\"a\":1},")).expect("records");
        assert_eq!(kinds(&records), ["bad"]);
    }

    #[test]
    fn ndjson_bad_line_does_not_hide_good_lines() {
        let records =
            split_body(&bytes::Bytes::from_static(b"{\"a\":1}\n{oops\n\n{\"a\":3}\n")).expect("records");
        assert_eq!(records.len(), 3);
        assert_eq!(records[2].index(), 2);
        match &records[1] {
            BodyRecord::Raw { raw, .. } => {
                assert_eq!(&raw[..], b"{oops");
                let errors = crate::validate_json(raw, &crate::Limits::default(), 0).expect_err("not JSON");
                assert!(errors[0].message.starts_with("invalid JSON"), "{errors:?}");
            }
            other => panic!("expected a raw record, got {other:?}"),
        }
    }

    #[test]
    fn array_elements_keep_their_bytes() {
        let records =
            split_body(&bytes::Bytes::from_static(b"[ {\"a\": 1} , {\"b\":\"x\"} ]")).expect("records");
        match &records[1] {
            BodyRecord::Raw { raw, .. } => assert_eq!(&raw[..], b"{\"b\":\"x\"}"),
            other => panic!("expected a raw record, got {other:?}"),
        }
    }
}
