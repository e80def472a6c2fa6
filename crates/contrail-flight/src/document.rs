//! The serving document of a flight (DESIGN §5): `FlightState` in camelCase JSON with `id` = flight
//! key. Times are RFC 3339 UTC strings with microseconds (`2013-01-01T05:15:00.000000Z`); absent
//! values are `null`, so a document always has every field.

use chrono::{DateTime, SecondsFormat};
use contrail_proto::v1::FlightState;
use serde_json::{Value, json};

/// µs since the Unix epoch → RFC 3339 UTC; `null` when absent or out of range.
pub fn time(us: Option<i64>) -> Value {
    us.and_then(DateTime::from_timestamp_micros)
        .map_or(Value::Null, |at| {
            Value::String(at.to_rfc3339_opts(SecondsFormat::Micros, true))
        })
}

/// The document's fields in the contract's order (DESIGN §5).
pub const FIELDS: [&str; 26] = [
    "id",
    "flightKey",
    "carrier",
    "flightNumber",
    "origin",
    "destination",
    "serviceDate",
    "status",
    "scheduledOut",
    "scheduledIn",
    "estimatedOut",
    "estimatedIn",
    "actualOut",
    "actualOff",
    "actualOn",
    "actualIn",
    "gate",
    "terminal",
    "tailNumber",
    "delayMinutes",
    "delayCodes",
    "divertedTo",
    "version",
    "lastEventId",
    "lastEventTime",
    "updatedAt",
];

/// The document of `state`.
pub fn flight_document(state: &FlightState) -> Value {
    json!({
        "id": state.flight_key,
        "flightKey": state.flight_key,
        "carrier": state.carrier,
        "flightNumber": state.flight_number,
        "origin": state.origin,
        "destination": state.destination,
        "serviceDate": state.service_date,
        "status": state.status,
        "scheduledOut": time(state.scheduled_out_us),
        "scheduledIn": time(state.scheduled_in_us),
        "estimatedOut": time(state.estimated_out_us),
        "estimatedIn": time(state.estimated_in_us),
        "actualOut": time(state.actual_out_us),
        "actualOff": time(state.actual_off_us),
        "actualOn": time(state.actual_on_us),
        "actualIn": time(state.actual_in_us),
        "gate": state.gate,
        "terminal": state.terminal,
        "tailNumber": state.tail_number,
        "delayMinutes": state.delay_minutes,
        "delayCodes": state.delay_codes,
        "divertedTo": state.diverted_to,
        "version": state.version,
        "lastEventId": state.last_event_id,
        "lastEventTime": time(Some(state.last_event_time_us)),
        "updatedAt": time(Some(state.updated_at_us)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_contract_field_is_present_in_camel_case() {
        let state = FlightState {
            flight_key: "UA1545-2013-01-01-EWR".to_owned(),
            carrier: "UA".to_owned(),
            flight_number: 1545,
            scheduled_out_us: Some(1_357_017_300_000_000),
            version: 3,
            ..FlightState::default()
        };
        let document = flight_document(&state);
        let expected = FIELDS;
        let object = document.as_object().expect("object");
        assert_eq!(object.len(), expected.len());
        for field in expected {
            assert!(object.contains_key(field), "{field} missing");
        }
        assert_eq!(document["id"], "UA1545-2013-01-01-EWR");
        assert_eq!(document["scheduledOut"], "2013-01-01T05:15:00.000000Z");
        assert_eq!(document["actualOut"], Value::Null);
        assert_eq!(document["version"], 3);
    }
}
