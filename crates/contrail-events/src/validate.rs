//! Validation of one JSON record against the event contract (docs/CONTRACT.md, "Events").

use chrono::{DateTime, NaiveDate};
use contrail_proto::v1::{EventData, EventType, FlightRef, OperationalEvent};
use serde_json::{Map, Value};

/// One problem with one field of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the field (`flight.number`); empty for the record as a whole.
    pub field: String,
    /// What is wrong, naming the bad value.
    pub message: String,
}

impl FieldError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            write!(formatter, "{}", self.message)
        } else {
            write!(formatter, "{}: {}", self.field, self.message)
        }
    }
}

/// Size limits of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest `event_id`, in characters.
    pub max_event_id_chars: usize,
    /// Longest `source`, in characters.
    pub max_source_chars: usize,
    /// Longest free-text `data` field (`reason`), in characters.
    pub max_text_chars: usize,
    /// Longest short code (`gate`, `terminal`, `tail_number`, `delay_code`), in characters.
    pub max_code_chars: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_event_id_chars: 128,
            max_source_chars: 64,
            max_text_chars: 512,
            max_code_chars: 16,
        }
    }
}

const EVENT_TYPE_NAMES: [(&str, EventType); 12] = [
    ("SCHEDULED", EventType::Scheduled),
    ("ESTIMATED", EventType::Estimated),
    ("GATE_ASSIGNED", EventType::GateAssigned),
    ("BOARDING", EventType::Boarding),
    ("DELAYED", EventType::Delayed),
    ("OUT", EventType::Out),
    ("OFF", EventType::Off),
    ("ON", EventType::On),
    ("IN", EventType::In),
    ("CANCELLED", EventType::Cancelled),
    ("DIVERTED", EventType::Diverted),
    ("TAIL_ASSIGNED", EventType::TailAssigned),
];

/// The contract name of an event type (`GATE_ASSIGNED`), or `None` for an unknown name.
pub fn event_type_from_name(name: &str) -> Option<EventType> {
    EVENT_TYPE_NAMES
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, event_type)| *event_type)
}

/// The contract name of an event type; `UNSPECIFIED` for the proto default.
pub fn event_type_name(event_type: EventType) -> &'static str {
    EVENT_TYPE_NAMES
        .iter()
        .find(|(_, known)| *known == event_type)
        .map(|(name, _)| *name)
        .unwrap_or("UNSPECIFIED")
}

/// The flight key `{carrier}{number}-{date}-{origin}`, e.g. `UA1545-2013-01-01-EWR`.
pub fn flight_key(carrier: &str, number: u32, service_date: &str, origin: &str) -> String {
    format!("{carrier}{number}-{service_date}-{origin}")
}

const TOP_LEVEL_FIELDS: [&str; 6] = ["event_id", "source", "type", "event_time", "flight", "data"];
const FLIGHT_FIELDS: [&str; 4] = ["carrier", "number", "origin", "date"];

/// Validates one record and converts it into an [`OperationalEvent`]; on failure returns every
/// problem found. `ingested_at_us` is stamped on the event. Never panics.
pub fn validate_record(
    record: &Value,
    limits: &Limits,
    ingested_at_us: i64,
) -> Result<OperationalEvent, Vec<FieldError>> {
    let Some(object) = record.as_object() else {
        return Err(vec![FieldError::new(
            "",
            format!("record must be a JSON object, got {}", json_kind(record)),
        )]);
    };
    let mut errors = Vec::new();

    let event_id = required_text(
        object,
        "event_id",
        "event_id",
        limits.max_event_id_chars,
        &mut errors,
    );
    let source = required_text(object, "source", "source", limits.max_source_chars, &mut errors);
    let event_type = match object.get("type") {
        None | Some(Value::Null) => {
            errors.push(FieldError::new("type", "is required"));
            None
        }
        Some(Value::String(name)) => match event_type_from_name(name) {
            Some(event_type) => Some(event_type),
            None => {
                errors.push(FieldError::new(
                    "type",
                    format!(
                        "unknown event type {}: expected one of {}",
                        quoted(name),
                        EVENT_TYPE_NAMES.map(|(known, _)| known).join(", ")
                    ),
                ));
                None
            }
        },
        Some(other) => {
            errors.push(FieldError::new(
                "type",
                format!("must be a string, got {}", json_kind(other)),
            ));
            None
        }
    };
    let event_time_us = match object.get("event_time") {
        None | Some(Value::Null) => {
            errors.push(FieldError::new("event_time", "is required"));
            None
        }
        Some(value) => parse_time(value, "event_time", &mut errors),
    };
    let flight = match object.get("flight") {
        None | Some(Value::Null) => {
            errors.push(FieldError::new("flight", "is required"));
            None
        }
        Some(Value::Object(flight)) => validate_flight(flight, &mut errors),
        Some(other) => {
            errors.push(FieldError::new(
                "flight",
                format!("must be an object, got {}", json_kind(other)),
            ));
            None
        }
    };
    let mut extra = Map::new();
    for (key, value) in object {
        if !TOP_LEVEL_FIELDS.contains(&key.as_str()) {
            extra.insert(key.clone(), value.clone());
        }
    }
    let data = match object.get("data") {
        None | Some(Value::Null) => EventData::default(),
        Some(Value::Object(data)) => {
            let (typed, unknown) = validate_data(data, limits, &mut errors);
            if !unknown.is_empty() {
                extra.insert("data".to_owned(), Value::Object(unknown));
            }
            typed
        }
        Some(other) => {
            errors.push(FieldError::new(
                "data",
                format!("must be an object, got {}", json_kind(other)),
            ));
            EventData::default()
        }
    };

    if !errors.is_empty() {
        return Err(errors);
    }
    let (Some(event_id), Some(source), Some(event_type), Some(event_time_us), Some(flight)) =
        (event_id, source, event_type, event_time_us, flight)
    else {
        // Unreachable: every `None` above pushed an error. Kept total rather than panicking.
        return Err(vec![FieldError::new("", "record is incomplete")]);
    };
    let key = flight_key(
        &flight.carrier,
        flight.number,
        &flight.service_date,
        &flight.origin,
    );
    Ok(OperationalEvent {
        event_id,
        source,
        r#type: event_type as i32,
        event_time_us,
        flight_key: key,
        flight: Some(flight),
        data: Some(data),
        extra_json: if extra.is_empty() {
            String::new()
        } else {
            Value::Object(extra).to_string()
        },
        ingested_at_us,
        input: None,
        late_reason: String::new(),
    })
}

fn validate_flight(flight: &Map<String, Value>, errors: &mut Vec<FieldError>) -> Option<FlightRef> {
    let errors_before = errors.len();
    let carrier = match flight.get("carrier") {
        None | Some(Value::Null) => {
            errors.push(FieldError::new("flight.carrier", "is required"));
            None
        }
        Some(Value::String(code)) if carrier_ok(code) => Some(code.clone()),
        Some(other) => {
            errors.push(FieldError::new(
                "flight.carrier",
                format!(
                    "must be a 2–3 character IATA/ICAO code of upper-case letters and digits, got {}",
                    show(other)
                ),
            ));
            None
        }
    };
    let number = match flight.get("number") {
        None | Some(Value::Null) => {
            errors.push(FieldError::new("flight.number", "is required"));
            None
        }
        Some(value) => match value.as_u64() {
            Some(number @ 1..=9999) => u32::try_from(number).ok(),
            _ => {
                errors.push(FieldError::new(
                    "flight.number",
                    format!("must be an integer from 1 to 9999, got {}", show(value)),
                ));
                None
            }
        },
    };
    let origin = airport_code(flight.get("origin"), "flight.origin", true, errors);
    let service_date = match flight.get("date") {
        None | Some(Value::Null) => {
            errors.push(FieldError::new("flight.date", "is required"));
            None
        }
        Some(Value::String(date)) if parse_service_date(date).is_some() => Some(date.clone()),
        Some(other) => {
            errors.push(FieldError::new(
                "flight.date",
                format!("must be a date YYYY-MM-DD, got {}", show(other)),
            ));
            None
        }
    };
    for key in flight.keys() {
        if !FLIGHT_FIELDS.contains(&key.as_str()) {
            errors.push(FieldError::new(
                format!("flight.{key}"),
                format!("unknown field: flight has only {}", FLIGHT_FIELDS.join(", ")),
            ));
        }
    }
    if errors.len() != errors_before {
        return None;
    }
    Some(FlightRef {
        carrier: carrier?,
        number: number?,
        origin: origin?,
        service_date: service_date?,
    })
}

/// Whether a string field is acceptable: non-empty, at most `max_chars` characters, no control
/// characters. The fast path and the reporting path share this predicate.
pub(crate) fn text_ok(text: &str, max_chars: usize) -> bool {
    !text.is_empty() && text.chars().count() <= max_chars && !text.chars().any(char::is_control)
}

/// A 2–3 character carrier code of upper-case letters and digits.
pub(crate) fn carrier_ok(code: &str) -> bool {
    (2..=3).contains(&code.len())
        && code
            .bytes()
            .all(|byte| byte.is_ascii_uppercase() || byte.is_ascii_digit())
}

/// A 3-letter upper-case IATA airport code.
pub(crate) fn airport_code_ok(code: &str) -> bool {
    code.len() == 3 && code.bytes().all(|byte| byte.is_ascii_uppercase())
}

/// RFC 3339 → UTC microseconds.
pub(crate) fn parse_rfc3339_us(text: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|time| time.timestamp_micros())
}

/// Parses `YYYY-MM-DD` strictly (four-digit year, two-digit month and day, a real date). Written out
/// because chrono's format-string parser showed up in ingest profiles.
pub(crate) fn parse_service_date(text: &str) -> Option<NaiveDate> {
    let bytes = text.as_bytes();
    if bytes.len() != 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<u32> {
        let digits = bytes.get(range)?;
        digits.iter().try_fold(0u32, |value, digit| {
            digit
                .is_ascii_digit()
                .then(|| value * 10 + u32::from(digit - b'0'))
        })
    };
    let year = i32::try_from(number(0..4)?).ok()?;
    NaiveDate::from_ymd_opt(year, number(5..7)?, number(8..10)?)
}

fn validate_data(
    data: &Map<String, Value>,
    limits: &Limits,
    errors: &mut Vec<FieldError>,
) -> (EventData, Map<String, Value>) {
    let mut typed = EventData::default();
    let mut unknown = Map::new();
    for (key, value) in data {
        if value.is_null() {
            continue;
        }
        let path = format!("data.{key}");
        match key.as_str() {
            "scheduled_out" => typed.scheduled_out_us = parse_time(value, &path, errors),
            "scheduled_in" => typed.scheduled_in_us = parse_time(value, &path, errors),
            "estimated_out" => typed.estimated_out_us = parse_time(value, &path, errors),
            "estimated_in" => typed.estimated_in_us = parse_time(value, &path, errors),
            "destination" => typed.destination = airport_code(Some(value), &path, false, errors),
            "diverted_to" => typed.diverted_to = airport_code(Some(value), &path, false, errors),
            "tail_number" => typed.tail_number = text(value, &path, limits.max_code_chars, errors),
            "gate" => typed.gate = text(value, &path, limits.max_code_chars, errors),
            "terminal" => typed.terminal = text(value, &path, limits.max_code_chars, errors),
            "delay_code" => typed.delay_code = text(value, &path, limits.max_code_chars, errors),
            "reason" => typed.reason = text(value, &path, limits.max_text_chars, errors),
            "delay_minutes" => match value.as_i64() {
                Some(minutes @ -1440..=100_000) => typed.delay_minutes = i32::try_from(minutes).ok(),
                _ => errors.push(FieldError::new(
                    path,
                    format!(
                        "must be an integer number of minutes (-1440 to 100000), got {}",
                        show(value)
                    ),
                )),
            },
            _ => {
                unknown.insert(key.clone(), value.clone());
            }
        }
    }
    (typed, unknown)
}

fn required_text(
    object: &Map<String, Value>,
    key: &str,
    path: &str,
    max_chars: usize,
    errors: &mut Vec<FieldError>,
) -> Option<String> {
    match object.get(key) {
        None | Some(Value::Null) => {
            errors.push(FieldError::new(path, "is required"));
            None
        }
        Some(value) => text(value, path, max_chars, errors),
    }
}

fn text(value: &Value, path: &str, max_chars: usize, errors: &mut Vec<FieldError>) -> Option<String> {
    let Value::String(text) = value else {
        errors.push(FieldError::new(
            path,
            format!("must be a string, got {}", json_kind(value)),
        ));
        return None;
    };
    let length = text.chars().count();
    if length == 0 {
        errors.push(FieldError::new(path, "must not be empty"));
        return None;
    }
    if length > max_chars {
        errors.push(FieldError::new(
            path,
            format!("is too long: {length} characters, at most {max_chars} allowed"),
        ));
        return None;
    }
    if text.chars().any(char::is_control) {
        errors.push(FieldError::new(path, "must not contain control characters"));
        return None;
    }
    Some(text.clone())
}

fn airport_code(
    value: Option<&Value>,
    path: &str,
    required: bool,
    errors: &mut Vec<FieldError>,
) -> Option<String> {
    match value {
        None | Some(Value::Null) => {
            if required {
                errors.push(FieldError::new(path, "is required"));
            }
            None
        }
        Some(Value::String(code)) if airport_code_ok(code) => Some(code.clone()),
        Some(other) => {
            errors.push(FieldError::new(
                path,
                format!(
                    "must be a 3-letter upper-case IATA airport code, got {}",
                    show(other)
                ),
            ));
            None
        }
    }
}

fn parse_time(value: &Value, path: &str, errors: &mut Vec<FieldError>) -> Option<i64> {
    let Value::String(text) = value else {
        errors.push(FieldError::new(
            path,
            format!("must be an RFC 3339 timestamp string, got {}", json_kind(value)),
        ));
        return None;
    };
    match DateTime::parse_from_rfc3339(text) {
        Ok(time) => Some(time.timestamp_micros()),
        Err(error) => {
            errors.push(FieldError::new(
                path,
                format!("invalid RFC 3339 timestamp {}: {error}", quoted(text)),
            ));
            None
        }
    }
}

/// What kind of JSON value `value` is, for error messages ("a string", "an array", …).
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A bad value as shown in an error: short values verbatim, long ones cut.
fn show(value: &Value) -> String {
    match value {
        Value::String(text) => quoted(text),
        Value::Number(number) => number.to_string(),
        other => json_kind(other).to_owned(),
    }
}

fn quoted(text: &str) -> String {
    const MAX_SHOWN: usize = 64;
    if text.chars().count() <= MAX_SHOWN {
        format!("{text:?}")
    } else {
        let prefix: String = text.chars().take(MAX_SHOWN).collect();
        format!("{prefix:?}… ({} characters)", text.chars().count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn valid() -> Value {
        json!({"event_id":"aodb-7f3a","source":"aodb","type":"OUT","event_time":"2013-01-01T10:17:00Z",
               "flight":{"carrier":"UA","number":1545,"origin":"EWR","date":"2013-01-01"},
               "data":{"gate":"C71","tail_number":"N14228"}})
    }

    fn errors_of(record: Value) -> Vec<FieldError> {
        validate_record(&record, &Limits::default(), 0).expect_err("should be rejected")
    }

    #[test]
    fn the_contract_example_is_valid() {
        let event = validate_record(&valid(), &Limits::default(), 7).expect("valid");
        assert_eq!(event.flight_key, "UA1545-2013-01-01-EWR");
        assert_eq!(event.r#type, EventType::Out as i32);
        assert_eq!(event.event_time_us, 1_357_035_420_000_000);
        let data = event.data.expect("data");
        assert_eq!(data.gate.as_deref(), Some("C71"));
        assert_eq!(data.tail_number.as_deref(), Some("N14228"));
        assert_eq!(event.extra_json, "");
        assert_eq!(event.ingested_at_us, 7);
    }

    #[test]
    fn unknown_fields_are_kept_in_extra_json() {
        let mut record = valid();
        record["priority"] = json!("high");
        record["data"]["belt"] = json!(4);
        let event = validate_record(&record, &Limits::default(), 0).expect("valid");
        let extra: Value = serde_json::from_str(&event.extra_json).expect("json");
        assert_eq!(extra, json!({"priority":"high","data":{"belt":4}}));
    }

    #[test]
    fn every_bad_field_is_reported_by_path() {
        let record = json!({"event_id":"","source":7,"type":"LANDED","event_time":"2013-13-01T00:00Z",
                            "flight":{"carrier":"ua","number":0,"origin":"NEWARK","date":"2013-02-30"},
                            "data":{"delay_minutes":"ten"}});
        let fields: Vec<String> = errors_of(record).into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "event_id",
                "source",
                "type",
                "event_time",
                "flight.carrier",
                "flight.number",
                "flight.origin",
                "flight.date",
                "data.delay_minutes"
            ]
        );
    }

    #[test]
    fn errors_name_the_bad_value() {
        let mut record = valid();
        record["event_time"] = json!("2013-13-01T00:00:00Z");
        let errors = errors_of(record);
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].message.contains("\"2013-13-01T00:00:00Z\""),
            "{}",
            errors[0].message
        );
    }

    #[test]
    fn missing_required_fields() {
        let errors = errors_of(json!({}));
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["event_id", "source", "type", "event_time", "flight"]);
        assert!(errors.iter().all(|e| e.message == "is required"));
    }

    #[test]
    fn oversized_event_id_is_rejected() {
        let mut record = valid();
        record["event_id"] = json!("x".repeat(129));
        let errors = errors_of(record);
        assert_eq!(errors[0].field, "event_id");
        assert!(errors[0].message.contains("129 characters"));
        let mut record = valid();
        record["event_id"] = json!("x".repeat(128));
        assert!(validate_record(&record, &Limits::default(), 0).is_ok());
    }

    #[test]
    fn non_object_record_is_rejected() {
        let errors = errors_of(json!([1, 2]));
        assert_eq!(errors[0].message, "record must be a JSON object, got an array");
    }

    #[test]
    fn unknown_flight_field_is_an_error() {
        let mut record = valid();
        record["flight"]["gate"] = json!("A1");
        assert_eq!(errors_of(record)[0].field, "flight.gate");
    }

    #[test]
    fn event_time_with_offset_is_stored_as_utc() {
        let mut record = valid();
        record["event_time"] = json!("2013-01-01T05:17:00-05:00");
        let event = validate_record(&record, &Limits::default(), 0).expect("valid");
        assert_eq!(event.event_time_us, 1_357_035_420_000_000);
    }

    #[test]
    fn service_dates_are_strict() {
        assert!(parse_service_date("2013-01-01").is_some());
        assert!(parse_service_date("2012-02-29").is_some());
        for bad in [
            "2013-02-29",
            "2013-1-01",
            "2013/01/01",
            "20130101xx",
            "2013-13-01",
            "+013-01-01",
            "2013-01-0a",
            "",
        ] {
            assert!(parse_service_date(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn type_names_round_trip() {
        for (name, event_type) in EVENT_TYPE_NAMES {
            assert_eq!(event_type_from_name(name), Some(event_type));
            assert_eq!(event_type_name(event_type), name);
        }
        assert_eq!(event_type_from_name("out"), None);
    }
}
