//! Property tests of the decoders: no input, however hostile, makes them panic, and valid records
//! survive the JSON → protobuf → bytes → protobuf round trip unchanged.

use contrail_events::{BodyRecord, Limits, OperationalEvent, split_body, validate_json, validate_record};
use proptest::prelude::*;
use prost::Message;
use serde_json::{Value, json};

/// Arbitrary JSON values, nested a few levels.
fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,40}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("event_id".to_owned()),
                    Just("source".to_owned()),
                    Just("type".to_owned()),
                    Just("event_time".to_owned()),
                    Just("flight".to_owned()),
                    Just("data".to_owned()),
                    Just("number".to_owned()),
                    Just("delay_minutes".to_owned()),
                    "[a-z_]{1,12}",
                ],
                inner,
                0..8
            )
            .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// The documented equivalence: `validate_json(bytes)` equals parsing `bytes` into a `Value` and
/// calling `validate_record` on it.
fn assert_paths_agree(value: &Value) -> Result<(), TestCaseError> {
    let bytes = serde_json::to_vec(value).expect("serialize");
    let reparsed: Value = serde_json::from_slice(&bytes).expect("reparse");
    prop_assert_eq!(
        validate_json(&bytes, &Limits::default(), 9),
        validate_record(&reparsed, &Limits::default(), 9)
    );
    Ok(())
}

/// Records that follow the contract, to check that validation accepts them.
fn valid_record() -> impl Strategy<Value = Value> {
    (
        "[a-z0-9-]{1,128}",
        "[a-z]{1,64}",
        prop::sample::select(vec![
            "SCHEDULED",
            "GATE_ASSIGNED",
            "OUT",
            "OFF",
            "ON",
            "IN",
            "DELAYED",
        ]),
        0i64..4_000_000_000,
        "[A-Z0-9]{2,3}",
        1u32..=9999,
        "[A-Z]{3}",
        -100i64..2000,
    )
        .prop_map(
            |(event_id, source, kind, seconds, carrier, number, origin, delay)| {
                let time = chrono::DateTime::from_timestamp(seconds, 0).expect("in range");
                json!({"event_id": event_id, "source": source, "type": kind,
                   "event_time": time.to_rfc3339(),
                   "flight": {"carrier": carrier, "number": number, "origin": origin,
                              "date": time.format("%Y-%m-%d").to_string()},
                   "data": {"delay_minutes": delay, "gate": "B12", "extra_field": [1, 2]}})
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn split_body_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = split_body(&bytes::Bytes::from(bytes));
    }

    #[test]
    fn split_body_never_panics_on_text_lines(lines in prop::collection::vec(".{0,60}", 0..8)) {
        let body = lines.join("\n");
        if let Ok(records) = split_body(&bytes::Bytes::from(body.clone())) {
            for (position, record) in records.iter().enumerate() {
                prop_assert_eq!(record.index(), position);
            }
        }
    }

    #[test]
    fn validate_never_panics(value in arbitrary_json()) {
        let _ = validate_record(&value, &Limits::default(), 0);
    }

    #[test]
    fn validate_never_panics_on_near_valid_records(mut record in valid_record(), junk in arbitrary_json(),
                                                    field in prop::sample::select(vec!["event_id", "type", "event_time", "flight", "data", "source"])) {
        record[field] = junk;
        let _ = validate_record(&record, &Limits::default(), 0);
    }

    #[test]
    fn validate_json_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = validate_json(&bytes, &Limits::default(), 0);
    }

    /// The fast path and the reporting path agree on every record, valid or not.
    #[test]
    fn fast_path_equals_reporting_path(value in arbitrary_json()) {
        assert_paths_agree(&value)?;
    }

    #[test]
    fn fast_path_equals_reporting_path_near_valid(mut record in valid_record(), junk in arbitrary_json(),
                                                  field in prop::sample::select(vec!["event_id", "type", "event_time", "flight", "data", "source"]),
                                                  drop_extra in any::<bool>()) {
        if drop_extra {
            // Without the unknown data field the record takes the fast path.
            record["data"].as_object_mut().map(|data| data.remove("extra_field"));
            assert_paths_agree(&record)?;
        }
        record[field] = junk;
        assert_paths_agree(&record)?;
    }

    #[test]
    fn protobuf_decoder_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = OperationalEvent::decode(bytes.as_slice());
        let _ = contrail_proto::v1::FlightState::decode(bytes.as_slice());
        let _ = contrail_proto::v1::DeadLetter::decode(bytes.as_slice());
    }

    #[test]
    fn valid_records_round_trip_through_protobuf(record in valid_record()) {
        let event = validate_record(&record, &Limits::default(), 42)
            .map_err(|errors| TestCaseError::fail(format!("{errors:?}")))?;
        let decoded = OperationalEvent::decode(event.encode_to_vec().as_slice())
            .map_err(|error| TestCaseError::fail(error.to_string()))?;
        prop_assert_eq!(&decoded, &event);
        prop_assert!(event.extra_json.contains("extra_field"));
        // The same record, sent as NDJSON twice, yields two parsed records.
        let line = serde_json::to_string(&record).expect("serialize");
        let body = format!("{line}\n{line}\n");
        let records = split_body(&bytes::Bytes::from(body.clone())).expect("not empty");
        prop_assert_eq!(records.len(), 2);
        for record in &records {
            let BodyRecord::Raw { raw, .. } = record else {
                return Err(TestCaseError::fail(format!("expected raw records, got {record:?}")));
            };
            let fast = validate_json(raw, &Limits::default(), 42);
            prop_assert_eq!(fast.as_ref(), Ok(&event));
        }
    }
}
