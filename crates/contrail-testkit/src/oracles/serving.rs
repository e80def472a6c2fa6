//! The serving store's expected documents, computed from the events alone (docs/CONTRACT.md,
//! "Fold" and "Stores") and written out here field by field — not with the stages' fold or
//! document code — and the comparison of what a container holds with an expectation.

use std::collections::{BTreeMap, HashSet};

use contrail_proto::v1::OperationalEvent;

/// Differences between the container and the expectation (empty: they agree).
pub fn compare_documents(
    actual: &BTreeMap<String, serde_json::Value>,
    expected: &BTreeMap<String, serde_json::Value>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (key, document) in expected {
        match actual.get(key) {
            None => problems.push(format!(
                "{key}: missing (expected version {})",
                document["version"]
            )),
            Some(found) if found != document => problems.push(format!(
                "{key}: version {} stored, expected {} (documents differ)",
                found["version"], document["version"]
            )),
            Some(_) => {}
        }
    }
    for key in actual.keys() {
        if !expected.contains_key(key) {
            problems.push(format!("{key}: unexpected document"));
        }
    }
    problems
}

/// The serving documents the contract calls for (docs/CONTRACT.md, "Fold" and "Stores"), computed
/// from the events alone, written out here field by field — not with the stages' fold or document
/// code: per flight, its distinct `(flight_key, event_id)` events folded in (event_time, event_id)
/// order, `version` = their count. Times are instants (compared as such by
/// [`contract_differences`]).
pub fn contract_documents(events: &[OperationalEvent]) -> BTreeMap<String, serde_json::Value> {
    use contrail_proto::v1::EventType;
    use serde_json::{Value, json};
    // A redelivery is the event's first delivery again: keep the first per (flight, id).
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    let mut per_flight: BTreeMap<&str, Vec<&OperationalEvent>> = BTreeMap::new();
    for event in events {
        if seen.insert((event.flight_key.as_str(), event.event_id.as_str())) {
            per_flight
                .entry(event.flight_key.as_str())
                .or_default()
                .push(event);
        }
    }
    let time = |us: Option<i64>| us.map_or(Value::Null, |us| json!(us));
    let mut documents = BTreeMap::new();
    for (key, mut ordered) in per_flight {
        ordered.sort_by(|a, b| (a.event_time_us, &a.event_id).cmp(&(b.event_time_us, &b.event_id)));
        let flight = ordered[0].flight.clone().unwrap_or_default();
        let mut document = json!({
            "id": key, "flightKey": key, "carrier": flight.carrier, "flightNumber": flight.number,
            "origin": flight.origin, "destination": null, "serviceDate": flight.service_date,
            "status": "", "scheduledOut": null, "scheduledIn": null, "estimatedOut": null,
            "estimatedIn": null, "actualOut": null, "actualOff": null, "actualOn": null,
            "actualIn": null, "gate": null, "terminal": null, "tailNumber": null,
            "delayMinutes": null, "delayCodes": [], "divertedTo": null,
            "version": ordered.len(), "lastEventId": "", "lastEventTime": null, "updatedAt": null,
        });
        let mut newest = i64::MIN;
        for event in &ordered {
            let data = event.data.clone().unwrap_or_default();
            let mut set = |field: &str, value: Value| {
                if !value.is_null() {
                    document[field] = value;
                }
            };
            match EventType::try_from(event.r#type).unwrap_or(EventType::Unspecified) {
                EventType::Scheduled => {
                    set("scheduledOut", time(data.scheduled_out_us));
                    set("scheduledIn", time(data.scheduled_in_us));
                    set("destination", json!(data.destination));
                    set("tailNumber", json!(data.tail_number));
                    set("status", json!("SCHEDULED"));
                }
                EventType::Estimated => {
                    set("estimatedOut", time(data.estimated_out_us));
                    set("estimatedIn", time(data.estimated_in_us));
                }
                EventType::GateAssigned => {
                    set("gate", json!(data.gate));
                    set("terminal", json!(data.terminal));
                }
                EventType::Boarding => set("status", json!("BOARDING")),
                EventType::Delayed => {
                    if let Some(minutes) = data.delay_minutes {
                        document["delayMinutes"] = json!(minutes);
                        if let Some(scheduled) = document["scheduledOut"].as_i64() {
                            document["estimatedOut"] = json!(scheduled + i64::from(minutes) * 60_000_000);
                        }
                    }
                    if let Some(code) = data.delay_code
                        && let Some(codes) = document["delayCodes"].as_array_mut()
                    {
                        codes.push(json!(code));
                    }
                }
                EventType::TailAssigned => set("tailNumber", json!(data.tail_number)),
                EventType::Out => {
                    set("actualOut", json!(event.event_time_us));
                    set("gate", json!(data.gate));
                    set("status", json!("DEPARTED"));
                }
                EventType::Off => {
                    set("actualOff", json!(event.event_time_us));
                    set("status", json!("AIRBORNE"));
                }
                EventType::On => {
                    set("actualOn", json!(event.event_time_us));
                    set("status", json!("LANDED"));
                }
                EventType::In => {
                    set("actualIn", json!(event.event_time_us));
                    set("status", json!("ARRIVED"));
                }
                EventType::Cancelled => set("status", json!("CANCELLED")),
                EventType::Diverted => {
                    set("divertedTo", json!(data.diverted_to));
                    set("status", json!("DIVERTED"));
                }
                EventType::Unspecified => {}
            }
            newest = newest.max(event.event_time_us);
            document["lastEventId"] = json!(event.event_id);
            document["lastEventTime"] = json!(event.event_time_us);
            document["updatedAt"] = json!(newest);
        }
        documents.insert(key.to_owned(), document);
    }
    documents
}

/// Differences between stored documents and [`contract_documents`], field by field over the
/// document fields of docs/CONTRACT.md, "Stores" (times compared as instants, whatever their
/// text form).
pub fn contract_differences(
    actual: &BTreeMap<String, serde_json::Value>,
    expected: &BTreeMap<String, serde_json::Value>,
) -> Vec<String> {
    const TIMES: [&str; 10] = [
        "scheduledOut",
        "scheduledIn",
        "estimatedOut",
        "estimatedIn",
        "actualOut",
        "actualOff",
        "actualOn",
        "actualIn",
        "lastEventTime",
        "updatedAt",
    ];
    const OTHERS: [&str; 16] = [
        "id",
        "flightKey",
        "carrier",
        "flightNumber",
        "origin",
        "destination",
        "serviceDate",
        "status",
        "gate",
        "terminal",
        "tailNumber",
        "delayMinutes",
        "delayCodes",
        "divertedTo",
        "version",
        "lastEventId",
    ];
    let instant = |value: &serde_json::Value| {
        value
            .as_str()
            .and_then(|text| chrono::DateTime::parse_from_rfc3339(text).ok())
            .map(|at| at.timestamp_micros())
    };
    let mut problems = Vec::new();
    for (key, want) in expected {
        let Some(got) = actual.get(key) else {
            problems.push(format!("{key}: missing (expected version {})", want["version"]));
            continue;
        };
        for field in OTHERS {
            if got[field] != want[field] {
                problems.push(format!(
                    "{key}.{field}: stored {}, expected {}",
                    got[field], want[field]
                ));
            }
        }
        for field in TIMES {
            if instant(&got[field]) != want[field].as_i64() {
                problems.push(format!(
                    "{key}.{field}: stored {}, expected {} µs",
                    got[field], want[field]
                ));
            }
        }
    }
    for key in actual.keys() {
        if !expected.contains_key(key) {
            problems.push(format!("{key}: unexpected document"));
        }
    }
    problems
}
