//! The serving document of a flight (docs/CONTRACT.md, "Stores"): `FlightState` in camelCase JSON
//! with `id` = flight key. Times are RFC 3339 UTC strings with microseconds
//! (`2013-01-01T05:15:00.000000Z`); absent values are `null`, so a document always has every field.

use chrono::{DateTime, SecondsFormat};
use contrail_proto::v1::{FlightPrediction, FlightState};
use serde_json::{Value, json};

/// µs since the Unix epoch → RFC 3339 UTC; `null` when absent or out of range.
pub fn time(us: Option<i64>) -> Value {
    us.and_then(DateTime::from_timestamp_micros)
        .map_or(Value::Null, |at| {
            Value::String(at.to_rfc3339_opts(SecondsFormat::Micros, true))
        })
}

/// The document's fields in the contract's order (docs/CONTRACT.md, "Stores").
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

/// The fields the rotation processor's predictions add to a flight's document: a second writer
/// owns them, under its own version guard (`predictionVersion`), and the flight state's writer
/// carries them over when it replaces the document — so neither overwrites the other's newer
/// data.
pub const PREDICTION_FIELDS: [&str; 6] = [
    "predictedOut",
    "predictedIn",
    "knockOnFrom",
    "knockOnDelayMinutes",
    "predictionCancelled",
    "predictionVersion",
];

/// The field guarding the prediction fields (the version of the prediction they hold).
pub const PREDICTION_GUARD: &str = "predictionVersion";

/// The prediction fields of a flight's document from `prediction` (`knockOnFrom` is `null` when
/// the flight's own times set its departure).
pub fn prediction_fields(prediction: &FlightPrediction) -> serde_json::Map<String, Value> {
    let knock_on_from = if prediction.knock_on_from.is_empty() {
        Value::Null
    } else {
        Value::String(prediction.knock_on_from.clone())
    };
    let fields = json!({
        "predictedOut": time(Some(prediction.predicted_out_us)),
        "predictedIn": time(prediction.predicted_in_us),
        "knockOnFrom": knock_on_from,
        "knockOnDelayMinutes": prediction.delay_minutes,
        "predictionCancelled": prediction.cancelled,
        "predictionVersion": prediction.version,
    });
    match fields {
        Value::Object(fields) => fields,
        _ => serde_json::Map::new(),
    }
}

/// The prediction fields `document` holds (none when no prediction was written to it).
pub fn prediction_of(document: &Value) -> serde_json::Map<String, Value> {
    PREDICTION_FIELDS
        .iter()
        .filter_map(|field| Some(((*field).to_owned(), document.get(*field)?.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prediction_fields_are_the_listed_ones_and_read_back() {
        let prediction = FlightPrediction {
            flight_key: "UA1545-2013-01-01-EWR".to_owned(),
            predicted_out_us: 1_357_027_200_000_000,
            knock_on_from: "UA1000-2013-01-01-ORD".to_owned(),
            delay_minutes: 25,
            version: 7 << 32 | 2,
            ..FlightPrediction::default()
        };
        let fields = prediction_fields(&prediction);
        let mut keys: Vec<&str> = fields.keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut listed = PREDICTION_FIELDS.to_vec();
        listed.sort_unstable();
        assert_eq!(keys, listed);
        assert_eq!(fields["predictedOut"], "2013-01-01T08:00:00.000000Z");
        assert_eq!(fields["predictedIn"], Value::Null);
        let mut document = flight_document(&FlightState::default());
        assert!(prediction_of(&document).is_empty());
        if let Value::Object(map) = &mut document {
            map.extend(fields.clone());
        }
        assert_eq!(prediction_of(&document), fields);
        assert_eq!(prediction_of(&document)["predictionVersion"], 7u64 << 32 | 2);
    }

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
