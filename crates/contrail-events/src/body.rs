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
            BodyRecord::Parsed { index, .. } | BodyRecord::Malformed { index, .. } => *index,
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

/// Splits a body into records: a JSON array (one record per element), a single JSON value (which may
/// span several lines), or newline-delimited JSON (one record per non-empty line, so one bad line does
/// not hide the others). Never panics.
pub fn split_body(body: &[u8]) -> Result<Vec<BodyRecord>, BodyError> {
    let trimmed = body.trim_ascii();
    let Some(&first_byte) = trimmed.first() else {
        return Err(BodyError::Empty);
    };
    if first_byte == b'[' {
        return Ok(split_array(trimmed));
    }
    // A single (possibly pretty-printed) JSON value.
    if let Ok(value) = serde_json::from_slice::<Value>(trimmed) {
        return Ok(vec![BodyRecord::Parsed {
            index: 0,
            value,
            raw: trimmed.to_vec(),
        }]);
    }
    Ok(split_lines(trimmed))
}

fn split_array(trimmed: &[u8]) -> Vec<BodyRecord> {
    match serde_json::from_slice::<Value>(trimmed) {
        Ok(Value::Array(elements)) => elements
            .into_iter()
            .enumerate()
            .map(|(index, value)| {
                let raw = serde_json::to_vec(&value).unwrap_or_default();
                BodyRecord::Parsed { index, value, raw }
            })
            .collect(),
        Ok(other) => vec![BodyRecord::Parsed {
            index: 0,
            raw: trimmed.to_vec(),
            value: other,
        }],
        Err(error) => vec![BodyRecord::Malformed {
            index: 0,
            raw: trimmed.to_vec(),
            error: format!("invalid JSON array: {error}"),
        }],
    }
}

fn split_lines(trimmed: &[u8]) -> Vec<BodyRecord> {
    trimmed
        .split(|&byte| byte == b'\n')
        .map(|line| line.trim_ascii())
        .filter(|line| !line.is_empty())
        .enumerate()
        .map(|(index, line)| match serde_json::from_slice::<Value>(line) {
            Ok(value) => BodyRecord::Parsed {
                index,
                value,
                raw: line.to_vec(),
            },
            Err(error) => BodyRecord::Malformed {
                index,
                raw: line.to_vec(),
                error: format!("invalid JSON: {error}"),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(records: &[BodyRecord]) -> Vec<&'static str> {
        records
            .iter()
            .map(|record| match record {
                BodyRecord::Parsed { .. } => "ok",
                BodyRecord::Malformed { .. } => "bad",
            })
            .collect()
    }

    #[test]
    fn empty_body_is_an_error() {
        assert_eq!(split_body(b"  \n "), Err(BodyError::Empty));
    }

    #[test]
    fn single_pretty_printed_object_is_one_record() {
        let records = split_body(b"{\n  \"a\": 1,\n  \"b\": 2\n}\n").expect("records");
        assert_eq!(kinds(&records), ["ok"]);
    }

    #[test]
    fn array_gives_one_record_per_element() {
        let records = split_body(b"[{\"a\":1},{\"a\":2},3]").expect("records");
        assert_eq!(kinds(&records), ["ok", "ok", "ok"]);
        assert_eq!(records[2].index(), 2);
    }

    #[test]
    fn broken_array_is_one_malformed_record() {
        let records = split_body(b"[{\"a\":1},").expect("records");
        assert_eq!(kinds(&records), ["bad"]);
    }

    #[test]
    fn ndjson_bad_line_does_not_hide_good_lines() {
        let records = split_body(b"{\"a\":1}\n{oops\n\n{\"a\":3}\n").expect("records");
        assert_eq!(kinds(&records), ["ok", "bad", "ok"]);
        assert_eq!(records[2].index(), 2);
        match &records[1] {
            BodyRecord::Malformed { raw, .. } => assert_eq!(raw, b"{oops"),
            other => panic!("expected malformed, got {other:?}"),
        }
    }
}
