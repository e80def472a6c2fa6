//! A recorded feed read from a file: `contrail replay --input FILE`.
//!
//! NDJSON (one event per line, blank lines skipped) or one JSON array of events, optionally
//! gzip-compressed (recognised by its magic bytes, whatever the file name); `-` reads stdin. The
//! events are posted as they are, in the file's order: ingest validates them, so an event it
//! refuses is counted as rejected and lands in its dead-letter topic, never dropped here. What
//! cannot be an event at all (not JSON, not a JSON object) stops the replay before anything is
//! posted, naming the line.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result, bail};
use contrail_events::json_kind;
use serde_json::Value;

/// A feed read from a file: its events in order, and how many flights they are about.
pub struct Feed {
    /// The events (the ingest format, docs/CONTRACT.md, "Events").
    pub events: Vec<Value>,
    /// Distinct flights among them.
    pub flights: usize,
}

/// (flight key, event id) of an event in the ingest format (docs/CONTRACT.md, "Events").
pub fn identity(event: &serde_json::Value) -> (String, String) {
    let flight = &event["flight"];
    let key = format!(
        "{}{}-{}-{}",
        flight["carrier"].as_str().unwrap_or_default(),
        flight["number"].as_u64().unwrap_or_default(),
        flight["date"].as_str().unwrap_or_default(),
        flight["origin"].as_str().unwrap_or_default()
    );
    (key, event["event_id"].as_str().unwrap_or_default().to_owned())
}

/// Reads the feed at `path` off the async runtime's threads.
pub async fn load(path: &Path) -> Result<Feed> {
    let path = path.to_owned();
    let events = tokio::task::spawn_blocking(move || read_feed(&path))
        .await
        .context("reading the feed")??;
    let flights: std::collections::HashSet<String> = events.iter().map(|event| identity(event).0).collect();
    Ok(Feed {
        flights: flights.len(),
        events,
    })
}

/// The events of the feed at `path` (`-`: stdin), in order.
pub fn read_feed(path: &Path) -> Result<Vec<Value>> {
    let (name, mut bytes) = if path == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut bytes)
            .context("reading the feed from stdin")?;
        ("stdin".to_owned(), bytes)
    } else {
        let bytes = std::fs::read(path).with_context(|| format!("reading the feed {}", path.display()))?;
        (path.display().to_string(), bytes)
    };
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut inflated = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes.as_slice())
            .read_to_end(&mut inflated)
            .with_context(|| format!("{name}: starts like gzip but does not decompress"))?;
        bytes = inflated;
    }
    parse_feed(&bytes, &name)
}

/// The events of a feed's (decompressed) bytes; errors name `name` and the line. Pure.
pub fn parse_feed(bytes: &[u8], name: &str) -> Result<Vec<Value>> {
    let text = std::str::from_utf8(bytes).map_err(|error| {
        let line = 1 + bytes[..error.valid_up_to()]
            .iter()
            .filter(|b| **b == b'\n')
            .count();
        anyhow::anyhow!("{name} line {line}: not UTF-8 text (a feed is NDJSON or a JSON array)")
    })?;
    let trimmed = text.trim_start_matches('\u{feff}').trim_start();
    let events: Vec<Value> = if trimmed.starts_with('[') {
        // Lines before the array, for the error's line number.
        let skipped = text[..text.len() - trimmed.len()].matches('\n').count();
        let values: Vec<Value> = serde_json::from_str(trimmed).map_err(|error| {
            anyhow::anyhow!(
                "{name} line {}: not a JSON array of events: {error}",
                error.line() + skipped
            )
        })?;
        for (index, value) in values.iter().enumerate() {
            if !value.is_object() {
                bail!(
                    "{name}: element {index} of the array is {}, not an event (a JSON object)",
                    json_kind(value)
                );
            }
        }
        values
    } else {
        let mut values = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim_start_matches('\u{feff}').trim();
            if line.is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(line)
                .map_err(|error| anyhow::anyhow!("{name} line {}: not JSON: {error}", index + 1))?;
            if !value.is_object() {
                bail!(
                    "{name} line {}: {} is not an event (a JSON object per line)",
                    index + 1,
                    json_kind(&value)
                );
            }
            values.push(value);
        }
        values
    };
    if events.is_empty() {
        bail!("{name}: no events in it");
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn error_of(bytes: &[u8]) -> String {
        format!("{:#}", parse_feed(bytes, "feed.ndjson").expect_err("refused"))
    }

    #[test]
    fn ndjson_and_arrays_keep_the_file_order() {
        let ndjson = b"{\"event_id\":\"b\"}\n\n  {\"event_id\":\"a\"}\r\n{\"event_id\":\"c\"}";
        let ids = |events: Vec<Value>| -> Vec<String> {
            events
                .iter()
                .map(|event| event["event_id"].as_str().unwrap_or_default().to_owned())
                .collect()
        };
        assert_eq!(ids(parse_feed(ndjson, "f").expect("ndjson")), ["b", "a", "c"]);
        let array = b"\n [ {\"event_id\":\"b\"}, {\"event_id\":\"a\"} ]\n";
        assert_eq!(ids(parse_feed(array, "f").expect("array")), ["b", "a"]);
    }

    #[test]
    fn what_cannot_be_an_event_is_refused_naming_the_line() {
        let message = error_of(b"{\"event_id\":\"a\"}\n{\"event_id\": \n");
        assert!(message.contains("feed.ndjson line 2: not JSON"), "{message}");
        let message = error_of(b"{\"event_id\":\"a\"}\n\n[1]\n");
        assert!(message.contains("line 3: an array is not an event"), "{message}");
        let message = error_of(b"[{\"event_id\":\"a\"}, 7]");
        assert!(
            message.contains("element 1 of the array is a number"),
            "{message}"
        );
        let message = error_of(b"\n\n[{\"event_id\":\"a\"},\n{]");
        assert!(
            message.contains("feed.ndjson line 4: not a JSON array of events"),
            "{message}"
        );
        let message = error_of(b"\n \n");
        assert!(message.contains("no events in it"), "{message}");
        let message = error_of(b"{\"a\":1}\n\xff\xfe\n");
        assert!(message.contains("line 2: not UTF-8"), "{message}");
    }

    #[test]
    fn a_gzip_file_is_recognised_by_its_bytes() {
        let dir = std::env::temp_dir().join(format!("contrail-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("feed.json");
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder
            .write_all(b"{\"event_id\":\"x\"}\n{\"event_id\":\"y\"}\n")
            .expect("compress");
        std::fs::write(&path, encoder.finish().expect("finish")).expect("write");
        let events = read_feed(&path).expect("gzip feed");
        assert_eq!(events.len(), 2);
        std::fs::write(&path, [0x1f, 0x8b, 0, 1, 2]).expect("write");
        let message = format!("{:#}", read_feed(&path).expect_err("broken gzip"));
        assert!(message.contains("does not decompress"), "{message}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
