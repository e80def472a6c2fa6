//! The fast path of validation: records that follow the contract exactly (no unknown fields, every
//! value of the right JSON type) are deserialized into borrowed, typed structs — no `Value` tree, no
//! allocation per key. Anything else, and any record that fails a check, goes through the `Value`
//! path of [`validate_record`](crate::validate_record), which reports every problem. The two paths
//! are equal on every input (property-tested in `tests/decoders_never_panic.rs`).

use std::borrow::Cow;

use contrail_proto::v1::{EventData, FlightRef, OperationalEvent};
use serde::Deserialize;

use crate::validate::{
    FieldError, Limits, airport_code_ok, carrier_ok, event_type_from_name, flight_key, parse_rfc3339_us,
    parse_service_date, text_ok, validate_record,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FastRecord<'a> {
    #[serde(borrow)]
    event_id: Cow<'a, str>,
    #[serde(borrow)]
    source: Cow<'a, str>,
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    event_time: Cow<'a, str>,
    #[serde(borrow)]
    flight: FastFlight<'a>,
    #[serde(borrow, default)]
    data: Option<FastData<'a>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FastFlight<'a> {
    #[serde(borrow)]
    carrier: Cow<'a, str>,
    number: u64,
    #[serde(borrow)]
    origin: Cow<'a, str>,
    #[serde(borrow)]
    date: Cow<'a, str>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FastData<'a> {
    #[serde(borrow, default)]
    scheduled_out: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    scheduled_in: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    estimated_out: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    estimated_in: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    destination: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    diverted_to: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tail_number: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    gate: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    terminal: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    delay_code: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reason: Option<Cow<'a, str>>,
    #[serde(default)]
    delay_minutes: Option<i64>,
}

/// Validates one record given as JSON bytes. Equal to parsing the bytes into a `Value` and calling
/// [`validate_record`]; bytes that are not JSON give one record-level error `invalid JSON: …`.
pub fn validate_json(
    raw: &[u8],
    limits: &Limits,
    ingested_at_us: i64,
) -> Result<OperationalEvent, Vec<FieldError>> {
    // serde's derived struct visitors also accept JSON arrays (`"flight": ["UA", 1545, …]`), which the
    // contract rejects. Contract records contain no arrays, so the fast path only takes bytes
    // without `[`; anything else (including strings with a bracket) takes the reporting path.
    let may_take_fast_path = raw.trim_ascii_start().first() == Some(&b'{') && !raw.contains(&b'[');
    if may_take_fast_path
        && let Ok(record) = serde_json::from_slice::<FastRecord<'_>>(raw)
        && let Some(event) = fast_event(&record, limits, ingested_at_us)
    {
        return Ok(event);
    }
    match serde_json::from_slice::<serde_json::Value>(raw) {
        Ok(value) => validate_record(&value, limits, ingested_at_us),
        Err(error) => Err(vec![FieldError {
            field: String::new(),
            message: format!("invalid JSON: {error}"),
        }]),
    }
}

/// The event if every check passes; `None` sends the record to the reporting path.
fn fast_event(record: &FastRecord<'_>, limits: &Limits, ingested_at_us: i64) -> Option<OperationalEvent> {
    let short_text = |value: &Option<Cow<'_, str>>| -> Option<Option<String>> {
        match value {
            None => Some(None),
            Some(text) if text_ok(text, limits.max_code_chars) => Some(Some(text.to_string())),
            Some(_) => None,
        }
    };
    let airport = |value: &Option<Cow<'_, str>>| -> Option<Option<String>> {
        match value {
            None => Some(None),
            Some(code) if airport_code_ok(code) => Some(Some(code.to_string())),
            Some(_) => None,
        }
    };
    let time = |value: &Option<Cow<'_, str>>| -> Option<Option<i64>> {
        match value {
            None => Some(None),
            Some(text) => parse_rfc3339_us(text).map(Some),
        }
    };
    if !text_ok(&record.event_id, limits.max_event_id_chars)
        || !text_ok(&record.source, limits.max_source_chars)
    {
        return None;
    }
    let event_type = event_type_from_name(&record.kind)?;
    let event_time_us = parse_rfc3339_us(&record.event_time)?;
    let flight = &record.flight;
    let number = u32::try_from(flight.number)
        .ok()
        .filter(|number| (1..=9999).contains(number))?;
    if !carrier_ok(&flight.carrier) || !airport_code_ok(&flight.origin) {
        return None;
    }
    parse_service_date(&flight.date)?;

    let default_data = FastData::default();
    let fields = record.data.as_ref().unwrap_or(&default_data);
    let delay_minutes = match fields.delay_minutes {
        None => None,
        Some(minutes @ -1440..=100_000) => Some(i32::try_from(minutes).ok()?),
        Some(_) => return None,
    };
    let reason = match &fields.reason {
        None => None,
        Some(text) if text_ok(text, limits.max_text_chars) => Some(text.to_string()),
        Some(_) => return None,
    };
    let data = EventData {
        scheduled_out_us: time(&fields.scheduled_out)?,
        scheduled_in_us: time(&fields.scheduled_in)?,
        destination: airport(&fields.destination)?,
        tail_number: short_text(&fields.tail_number)?,
        estimated_out_us: time(&fields.estimated_out)?,
        estimated_in_us: time(&fields.estimated_in)?,
        gate: short_text(&fields.gate)?,
        terminal: short_text(&fields.terminal)?,
        delay_minutes,
        delay_code: short_text(&fields.delay_code)?,
        reason,
        diverted_to: airport(&fields.diverted_to)?,
    };
    let flight_ref = FlightRef {
        carrier: flight.carrier.to_string(),
        number,
        origin: flight.origin.to_string(),
        service_date: flight.date.to_string(),
    };
    Some(OperationalEvent {
        event_id: record.event_id.to_string(),
        source: record.source.to_string(),
        r#type: event_type as i32,
        event_time_us,
        flight_key: flight_key(
            &flight_ref.carrier,
            number,
            &flight_ref.service_date,
            &flight_ref.origin,
        ),
        flight: Some(flight_ref),
        data: Some(data),
        extra_json: String::new(),
        ingested_at_us,
        input: None,
        late_reason: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"{"event_id":"aodb-7f3a","source":"aodb","type":"DELAYED","event_time":"2013-01-01T10:17:00Z",
        "flight":{"carrier":"UA","number":1545,"origin":"EWR","date":"2013-01-01"},
        "data":{"gate":"C71","delay_minutes":25,"delay_code":"93","scheduled_out":"2013-01-01T10:15:00Z"}}"#;

    #[test]
    fn a_contract_record_takes_the_fast_path_and_matches_the_reporting_path() {
        let record: FastRecord<'_> = serde_json::from_str(EXAMPLE).expect("typed parse");
        let fast = fast_event(&record, &Limits::default(), 5).expect("fast path accepts it");
        let value: serde_json::Value = serde_json::from_str(EXAMPLE).expect("json");
        assert_eq!(Ok(fast), validate_record(&value, &Limits::default(), 5));
    }

    #[test]
    fn records_with_unknown_fields_or_arrays_are_left_to_the_reporting_path() {
        assert!(serde_json::from_str::<FastRecord<'_>>(&EXAMPLE.replace("\"gate\"", "\"belt\"")).is_err());
        let as_array = EXAMPLE.replace(
            r#"{"carrier":"UA","number":1545,"origin":"EWR","date":"2013-01-01"}"#,
            r#"["UA",1545,"EWR","2013-01-01"]"#,
        );
        let errors = validate_json(as_array.as_bytes(), &Limits::default(), 0).expect_err("flight as array");
        assert_eq!(errors[0].field, "flight");
    }
}
