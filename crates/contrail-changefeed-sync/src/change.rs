//! A change feed document as a `ServingChange` record (pure).

use contrail_proto::v1::ServingChange;
use prost::Message as _;

/// The `ServingChange` of one change feed document, or why it is not one. A document too large for
/// one message of at most `max_message_bytes` (Cosmos DB documents reach 2 MB) is published
/// without its JSON (`document_omitted`, `document_size`): the change still reaches the topic,
/// and the document is in the serving store.
pub fn serving_change(
    document: &serde_json::Value,
    feed_range: &str,
    max_message_bytes: usize,
) -> Result<ServingChange, String> {
    let id = document
        .get("id")
        .and_then(serde_json::Value::as_str)
        .ok_or("document without id")?;
    let flight_key = document
        .get("flightKey")
        .and_then(serde_json::Value::as_str)
        .unwrap_or(id);
    let mut change = ServingChange {
        id: id.to_owned(),
        flight_key: flight_key.to_owned(),
        lsn: document
            .get("_lsn")
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(0),
        ts: document
            .get("_ts")
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(0),
        document_json: document.to_string(),
        feed_range: feed_range.to_owned(),
        ..ServingChange::default()
    };
    let budget = max_message_bytes
        .saturating_sub(change.flight_key.len() + contrail_common::dead_letter::RECORD_OVERHEAD_BYTES);
    if change.encoded_len() > budget {
        change.document_size = change.document_json.len() as u64;
        change.document_json = String::new();
        change.document_omitted = true;
    }
    Ok(change)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_carry_identity_and_document() {
        let document = serde_json::json!({
            "id": "AA-100-2013-01-01-JFK", "flightKey": "AA-100-2013-01-01-JFK", "version": 3,
            "_lsn": 17, "_ts": 1700000000, "_etag": "\"x\""
        });
        let change = serving_change(&document, "range", 1_000_000).expect("change");
        assert_eq!(change.id, "AA-100-2013-01-01-JFK");
        assert_eq!(change.lsn, 17);
        assert_eq!(change.ts, 1_700_000_000);
        assert!(!change.document_omitted);
        let round: serde_json::Value = serde_json::from_str(&change.document_json).expect("json");
        assert_eq!(round["version"], 3);
        assert!(serving_change(&serde_json::json!({"x": 1}), "r", 1_000_000).is_err());
    }

    /// A document larger than a message (Cosmos DB allows 2 MB) still reaches the topic as a
    /// change, without its JSON and with its size.
    #[test]
    fn a_document_too_large_for_a_message_is_published_without_its_json() {
        let document = serde_json::json!({
            "id": "AA-100-2013-01-01-JFK", "flightKey": "AA-100-2013-01-01-JFK", "version": 3,
            "_lsn": 17, "_ts": 1700000000, "notes": "x".repeat(1_500_000)
        });
        let change = serving_change(&document, "range", 1_000_000).expect("change");
        assert!(change.document_omitted);
        assert!(change.document_json.is_empty());
        assert!(change.document_size > 1_500_000);
        assert_eq!((change.id.as_str(), change.lsn), ("AA-100-2013-01-01-JFK", 17));
        assert!(change.encoded_len() < 1_000_000);
    }
}
