//! How a Kafka record becomes a row of its history table (the tables' contract is
//! `contrail_history::tables`); [`columns`] turns rows into Arrow record batches.

mod columns;

pub use columns::record_batch;

use std::sync::Arc;

use chrono::{DateTime, NaiveDate};
use contrail_proto::v1::{
    Alert, FlightPrediction, FlightState, OperationalEvent, ServingChange, SourcePosition,
};
use prost::Message as _;

use contrail_history::tables::Table;

use crate::applied::{Origin, short_source};

/// Decodes a Kafka record of `table`'s topic into a row, or says why it cannot be archived
/// (→ dead letter).
pub fn decode(table: Table, position: KafkaPosition, payload: &[u8]) -> Result<Row, String> {
    match table {
        Table::Events | Table::LateEvents => {
            let event = OperationalEvent::decode(payload)
                .map_err(|error| format!("not a {}: {error}", table.message()))?;
            if event.event_id.is_empty() {
                return Err("OperationalEvent without event_id".to_owned());
            }
            let flight = event.flight.clone().unwrap_or_default();
            let date = parse_date(&flight.service_date)
                .map_err(|error| format!("event {:?}: flight.service_date {error}", event.event_id))?;
            let origin = input_origin(event.input.as_ref()).ok_or_else(|| {
                format!(
                    "event {:?} of {:?} carries no input position (dedup-state sets one): it cannot be archived exactly once",
                    event.event_id, event.flight_key
                )
            })?;
            let body = match table {
                Table::LateEvents => Body::Late(Box::new(event)),
                _ => Body::Event(Box::new(event)),
            };
            Ok(Row {
                origin,
                date,
                position,
                record: payload.to_vec(),
                body,
            })
        }
        Table::FlightStates => {
            let state = FlightState::decode(payload)
                .map_err(|error| format!("not a {}: {error}", table.message()))?;
            if state.flight_key.is_empty() || state.version == 0 {
                return Err(format!(
                    "FlightState without flight_key or version ({:?}, {})",
                    state.flight_key, state.version
                ));
            }
            let date = parse_date(&state.service_date)
                .map_err(|error| format!("flight state {}: service_date {error}", state.flight_key))?;
            let origin = input_origin(state.input.as_ref()).ok_or_else(|| {
                format!(
                    "flight state {} version {} carries no input position (dedup-state sets one): it cannot be archived exactly once",
                    state.flight_key, state.version
                )
            })?;
            Ok(Row {
                origin,
                date,
                position,
                record: payload.to_vec(),
                body: Body::State(Box::new(state)),
            })
        }
        Table::ServingChanges => {
            let change = ServingChange::decode(payload)
                .map_err(|error| format!("not a {}: {error}", table.message()))?;
            if change.id.is_empty() {
                return Err("ServingChange without id".to_owned());
            }
            let date = DateTime::from_timestamp(change.ts, 0)
                .map(|time| days_since_epoch(time.date_naive()))
                .ok_or_else(|| format!("change {:?}: ts {} out of range", change.id, change.ts))?;
            let version = serde_json::from_str::<serde_json::Value>(&change.document_json)
                .ok()
                .and_then(|document| document.get("version").and_then(|v| v.as_i64()));
            if change.lsn <= 0 {
                return Err(format!(
                    "change of {:?} without _lsn ({}): it cannot be archived exactly once",
                    change.id, change.lsn
                ));
            }
            // `_lsn` grows within a feed range, which changefeed-sync reads in order.
            let origin = Origin {
                source: short_source("feed-range", &change.feed_range),
                position: change.lsn,
            };
            Ok(Row {
                origin,
                date,
                position,
                record: payload.to_vec(),
                body: Body::Change(Box::new(change), version),
            })
        }
        Table::Alerts => {
            let alert =
                Alert::decode(payload).map_err(|error| format!("not a {}: {error}", table.message()))?;
            if alert.alert_id.is_empty() {
                return Err("Alert without alert_id".to_owned());
            }
            let date = DateTime::from_timestamp_micros(alert.fired_at_us)
                .map(|time| days_since_epoch(time.date_naive()))
                .ok_or_else(|| {
                    format!(
                        "alert {:?}: fired_at_us {} out of range",
                        alert.alert_id, alert.fired_at_us
                    )
                })?;
            let origin = alert_origin(&alert)?;
            Ok(Row {
                origin,
                date,
                position,
                record: payload.to_vec(),
                body: Body::Alert(Box::new(alert)),
            })
        }
        Table::Predictions => {
            let prediction = FlightPrediction::decode(payload)
                .map_err(|error| format!("not a {}: {error}", table.message()))?;
            if prediction.flight_key.is_empty()
                || prediction.version == 0
                || i64::try_from(prediction.version).is_err()
            {
                return Err(format!(
                    "FlightPrediction without flight_key or version ({:?}, {})",
                    prediction.flight_key, prediction.version
                ));
            }
            let date = DateTime::from_timestamp_micros(prediction.scheduled_out_us)
                .map(|time| days_since_epoch(time.date_naive()))
                .ok_or_else(|| {
                    format!(
                        "prediction of {:?}: scheduled_out_us {} out of range",
                        prediction.flight_key, prediction.scheduled_out_us
                    )
                })?;
            // Several predictions may follow one input record: placed like alerts.
            let input = prediction.input.as_ref();
            let origin = placed_origin(
                input,
                input.map_or(-1, |input| input.offset),
                prediction.emitted_index,
            )
            .ok_or_else(|| {
                format!(
                    "prediction {} version {} carries no input position and index (the rotation processor sets both): it cannot be archived exactly once",
                    prediction.flight_key, prediction.version
                )
            })?;
            Ok(Row {
                origin,
                date,
                position,
                record: payload.to_vec(),
                body: Body::Prediction(Box::new(prediction)),
            })
        }
    }
}

/// Alerts emitted after one input record at most (see [`alert_origin`]).
pub const ALERTS_PER_INPUT_RECORD: i64 = 1 << 20;

/// The origin of an alert: its raw partition, and its place there — dedup-state emits alerts (from
/// timers, not one per input record) in increasing `(emitted_after_offset, emitted_index)`,
/// packed into one position.
fn alert_origin(alert: &Alert) -> Result<Origin, String> {
    placed_origin(
        alert.input.as_ref(),
        alert.emitted_after_offset,
        alert.emitted_index,
    )
    .ok_or_else(|| {
        format!(
            "alert {:?} carries no input position and place (emitted after offset {}, index {}; \
             dedup-state sets both): it cannot be archived exactly once",
            alert.alert_id, alert.emitted_after_offset, alert.emitted_index
        )
    })
}

/// The origin of an output placed in its input as the `index`-th emitted after (or while)
/// processing the record at `offset` of `input`'s partition: the two packed into one position.
fn placed_origin(input: Option<&SourcePosition>, offset: i64, index: u32) -> Option<Origin> {
    let input = input.filter(|input| !input.topic.is_empty())?;
    let index = i64::from(index);
    let position = (index < ALERTS_PER_INPUT_RECORD && offset >= 0)
        .then(|| offset.checked_mul(ALERTS_PER_INPUT_RECORD))
        .flatten()?;
    Some(Origin {
        source: format!("{}:{}", input.topic, input.partition),
        position: position + index,
    })
}

/// Where a record was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaPosition {
    /// Topic.
    pub topic: Arc<str>,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// A decoded record, ready to be a row of its table.
#[derive(Debug, Clone)]
pub struct Row {
    /// Where it comes from and its place there: what makes a copy recognisable (see
    /// [`crate::applied`]).
    pub origin: Origin,
    /// The partition date, days since 1970-01-01.
    pub date: i32,
    /// The Kafka position.
    pub position: KafkaPosition,
    /// The record as it was on the wire.
    pub record: Vec<u8>,
    body: Body,
}

#[derive(Debug, Clone)]
enum Body {
    Event(Box<OperationalEvent>),
    Late(Box<OperationalEvent>),
    State(Box<FlightState>),
    Change(Box<ServingChange>, Option<i64>),
    Alert(Box<Alert>),
    Prediction(Box<FlightPrediction>),
}

/// The origin of a dedup-state output: the raw-topic partition and offset of the input record
/// that produced it (each input record yields at most one record per output topic).
fn input_origin(input: Option<&SourcePosition>) -> Option<Origin> {
    let input = input?;
    if input.topic.is_empty() || input.offset < 0 {
        return None;
    }
    Some(Origin {
        source: format!("{}:{}", input.topic, input.partition),
        position: input.offset,
    })
}

fn parse_date(text: &str) -> Result<i32, String> {
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .map(days_since_epoch)
        .map_err(|error| format!("{text:?} is not a YYYY-MM-DD date: {error}"))
}

fn days_since_epoch(date: NaiveDate) -> i32 {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default();
    (date - epoch).num_days() as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use contrail_history::tables::Kind;
    use contrail_proto::v1::{AlertState, EventData, EventType, FlightRef};
    use deltalake::arrow::array::{Array, AsArray};
    use deltalake::arrow::datatypes::Schema as ArrowSchema;
    use deltalake::arrow::datatypes::{DataType as ArrowType, Field, TimeUnit};

    fn position(offset: i64) -> KafkaPosition {
        KafkaPosition {
            topic: Arc::from("ops.events.accepted"),
            partition: 2,
            offset,
        }
    }

    fn event() -> OperationalEvent {
        OperationalEvent {
            event_id: "aodb-1".to_owned(),
            source: "aodb".to_owned(),
            r#type: EventType::Out as i32,
            event_time_us: 1_357_035_420_000_000,
            flight: Some(FlightRef {
                carrier: "UA".to_owned(),
                number: 1545,
                origin: "EWR".to_owned(),
                service_date: "2013-01-01".to_owned(),
            }),
            flight_key: "UA1545-2013-01-01-EWR".to_owned(),
            data: Some(EventData {
                gate: Some("C71".to_owned()),
                ..EventData::default()
            }),
            input: Some(SourcePosition {
                topic: "ops.events.raw".to_owned(),
                partition: 1,
                offset: 99,
            }),
            ..OperationalEvent::default()
        }
    }

    fn arrow_schema(table: Table) -> Arc<ArrowSchema> {
        let fields: Vec<Field> = table
            .columns()
            .iter()
            .map(|(name, kind, nullable)| {
                let data_type = match kind {
                    Kind::Str => ArrowType::Utf8,
                    Kind::Long => ArrowType::Int64,
                    Kind::Int => ArrowType::Int32,
                    Kind::Date => ArrowType::Date32,
                    Kind::Timestamp => ArrowType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                    Kind::Binary => ArrowType::Binary,
                    Kind::StrList => ArrowType::List(Arc::new(Field::new("element", ArrowType::Utf8, true))),
                };
                Field::new(*name, data_type, *nullable)
            })
            .collect();
        Arc::new(ArrowSchema::new(fields))
    }

    #[test]
    fn an_event_becomes_a_typed_row() {
        let payload = event().encode_to_vec();
        let row = decode(Table::Events, position(7), &payload).expect("decodes");
        assert_eq!(
            row.origin,
            Origin {
                source: "ops.events.raw:1".to_owned(),
                position: 99
            },
            "the raw position of the input record that produced it"
        );
        assert_eq!(row.date, 15706, "2013-01-01 is day 15706");
        let batch = record_batch(Table::Events, arrow_schema(Table::Events), &[&row]).expect("batch");
        assert_eq!(batch.num_rows(), 1);
        let column = |name: &str| batch.column_by_name(name).expect(name).clone();
        assert_eq!(column("type").as_string::<i32>().value(0), "OUT");
        assert_eq!(column("gate").as_string::<i32>().value(0), "C71");
        assert!(column("terminal").is_null(0));
        assert_eq!(
            column("kafka_offset")
                .as_primitive::<deltalake::arrow::datatypes::Int64Type>()
                .value(0),
            7
        );
        assert_eq!(column("record").as_binary::<i32>().value(0), payload.as_slice());
    }

    #[test]
    fn a_late_event_comes_from_its_raw_position_and_keeps_its_reason() {
        let mut late = event();
        late.late_reason = "expired".to_owned();
        let payload = late.encode_to_vec();
        let row = decode(Table::LateEvents, position(1), &payload).expect("decodes");
        assert_eq!(row.origin.source, "ops.events.raw:1");
        assert_eq!(row.origin.position, 99);
        let batch = record_batch(Table::LateEvents, arrow_schema(Table::LateEvents), &[&row]).expect("batch");
        let reason = batch.column_by_name("late_reason").expect("late_reason").clone();
        assert_eq!(reason.as_string::<i32>().value(0), "expired");
        let events = Table::Events.delta_columns();
        assert!(
            events.iter().all(|field| field.name() != "late_reason"),
            "only late_events has the column"
        );
    }

    #[test]
    fn states_come_from_their_input_and_changes_from_their_feed_range_and_lsn() {
        let mut state = FlightState {
            flight_key: "UA1545-2013-01-01-EWR".to_owned(),
            service_date: "2013-01-01".to_owned(),
            version: 3,
            delay_codes: vec!["93".to_owned(), "81".to_owned()],
            ..FlightState::default()
        };
        let error =
            decode(Table::FlightStates, position(0), &state.encode_to_vec()).expect_err("no input position");
        assert!(error.contains("carries no input position"), "{error}");
        state.input = Some(SourcePosition {
            topic: "ops.events.raw".to_owned(),
            partition: 2,
            offset: 17,
        });
        let row = decode(Table::FlightStates, position(0), &state.encode_to_vec()).expect("state");
        assert_eq!(row.origin.source, "ops.events.raw:2");
        assert_eq!(row.origin.position, 17);
        let batch =
            record_batch(Table::FlightStates, arrow_schema(Table::FlightStates), &[&row]).expect("batch");
        let codes = batch
            .column_by_name("delay_codes")
            .expect("codes")
            .as_list::<i32>()
            .value(0);
        assert_eq!(codes.as_string::<i32>().value(1), "81");

        let change = ServingChange {
            id: "UA1545-2013-01-01-EWR".to_owned(),
            flight_key: "UA1545-2013-01-01-EWR".to_owned(),
            lsn: 42,
            ts: 1_357_000_000,
            document_json: r#"{"id":"UA1545-2013-01-01-EWR","version":3}"#.to_owned(),
            feed_range: "0".to_owned(),
            ..ServingChange::default()
        };
        let row = decode(Table::ServingChanges, position(0), &change.encode_to_vec()).expect("change");
        assert_eq!(row.origin.position, 42);
        assert_eq!(row.origin.source, short_source("feed-range", "0"));
        let batch = record_batch(
            Table::ServingChanges,
            arrow_schema(Table::ServingChanges),
            &[&row],
        )
        .expect("batch");
        let version = batch.column_by_name("version").expect("version");
        assert_eq!(
            version
                .as_primitive::<deltalake::arrow::datatypes::Int64Type>()
                .value(0),
            3
        );
    }

    #[test]
    fn alerts_come_from_their_raw_partition_ordered_by_where_they_were_emitted() {
        let raised = Alert {
            alert_id: "UA1545-2013-01-01-EWR/DEPARTURE_OVERDUE".to_owned(),
            kind: "DEPARTURE_OVERDUE".to_owned(),
            flight_key: "UA1545-2013-01-01-EWR".to_owned(),
            fired_at_us: 1_357_050_600_000_000,
            input: Some(SourcePosition {
                topic: "ops.events.raw".to_owned(),
                partition: 3,
                offset: 10,
            }),
            emitted_after_offset: 12,
            emitted_index: 1,
            ..Alert::default()
        };
        let resolved = Alert {
            state: AlertState::Resolved as i32,
            resolved_at_us: 1_357_051_000_000_000,
            resolution: "DEPARTED".to_owned(),
            emitted_after_offset: 13,
            emitted_index: 0,
            ..raised.clone()
        };
        let first = decode(Table::Alerts, position(0), &raised.encode_to_vec()).expect("raised");
        let second = decode(Table::Alerts, position(1), &resolved.encode_to_vec()).expect("resolved");
        assert_eq!(first.origin.source, "ops.events.raw:3");
        assert_eq!(first.origin.position, 12 * ALERTS_PER_INPUT_RECORD + 1);
        assert!(
            second.origin.position > first.origin.position,
            "emitted later, placed later"
        );
        let batch =
            record_batch(Table::Alerts, arrow_schema(Table::Alerts), &[&first, &second]).expect("batch");
        let states = batch.column_by_name("state").expect("state").clone();
        assert_eq!(states.as_string::<i32>().value(0), "FIRING");
        assert_eq!(states.as_string::<i32>().value(1), "RESOLVED");
        let resolved_at = batch.column_by_name("resolved_at").expect("resolved_at").clone();
        assert!(resolved_at.is_null(0), "a raised alert is not resolved");
        assert!(!resolved_at.is_null(1));
        let unplaced = Alert {
            emitted_after_offset: -1,
            ..raised.clone()
        };
        let error = decode(Table::Alerts, position(2), &unplaced.encode_to_vec()).expect_err("no place");
        assert!(error.contains("cannot be archived exactly once"), "{error}");
        let overfull = Alert {
            emitted_index: ALERTS_PER_INPUT_RECORD as u32,
            ..raised
        };
        assert!(decode(Table::Alerts, position(3), &overfull.encode_to_vec()).is_err());
    }

    #[test]
    fn predictions_come_from_their_by_tail_record_placed_by_index_and_say_their_outcome() {
        let first = FlightPrediction {
            flight_key: "UA1545-2013-01-01-EWR".to_owned(),
            tail_number: "N14228".to_owned(),
            scheduled_out_us: 1_357_050_600_000_000,
            predicted_out_us: 1_357_052_400_000_000,
            predicted_in_us: Some(1_357_063_000_000_000),
            knock_on_from: "UA1000-2013-01-01-EWR".to_owned(),
            delay_minutes: 30,
            version: 2,
            input: Some(SourcePosition {
                topic: "ops.flights.by-tail".to_owned(),
                partition: 1,
                offset: 40,
            }),
            emitted_index: 3,
            knock_on_alert: true,
            cancelled: false,
            alert_raised_version: 0,
        };
        let cancelled = FlightPrediction {
            version: 3,
            knock_on_alert: false,
            cancelled: true,
            input: Some(SourcePosition {
                offset: 41,
                ..first.input.clone().expect("input")
            }),
            emitted_index: 0,
            ..first.clone()
        };
        let row = decode(Table::Predictions, position(0), &first.encode_to_vec()).expect("prediction");
        let last = decode(Table::Predictions, position(1), &cancelled.encode_to_vec()).expect("cancelled");
        assert_eq!(row.origin.source, "ops.flights.by-tail:1");
        assert_eq!(row.origin.position, 40 * ALERTS_PER_INPUT_RECORD + 3);
        assert!(last.origin.position > row.origin.position);
        let batch = record_batch(
            Table::Predictions,
            arrow_schema(Table::Predictions),
            &[&row, &last],
        )
        .expect("batch");
        let outcome = batch.column_by_name("outcome").expect("outcome").clone();
        assert_eq!(outcome.as_string::<i32>().value(0), "KNOCK_ON_DELAY");
        assert_eq!(outcome.as_string::<i32>().value(1), "CANCELLED");
        let cause = batch
            .column_by_name("knock_on_from")
            .expect("knock_on_from")
            .clone();
        assert_eq!(cause.as_string::<i32>().value(0), "UA1000-2013-01-01-EWR");
        let unplaced = FlightPrediction {
            input: None,
            ..first.clone()
        };
        let error = decode(Table::Predictions, position(2), &unplaced.encode_to_vec()).expect_err("no input");
        assert!(error.contains("cannot be archived exactly once"), "{error}");
        let unversioned = FlightPrediction { version: 0, ..first };
        assert!(decode(Table::Predictions, position(3), &unversioned.encode_to_vec()).is_err());
    }

    #[test]
    fn bad_records_say_why() {
        let error = decode(Table::Events, position(0), b"\xff\xff\xff").expect_err("garbage");
        assert!(error.contains("not a contrail.v1.OperationalEvent"), "{error}");
        let mut bad_date = event();
        if let Some(flight) = bad_date.flight.as_mut() {
            flight.service_date = "2013-13-45".to_owned();
        }
        let error = decode(Table::Events, position(0), &bad_date.encode_to_vec()).expect_err("bad date");
        assert!(error.contains("2013-13-45"), "{error}");
        let error = decode(
            Table::FlightStates,
            position(0),
            &FlightState::default().encode_to_vec(),
        )
        .expect_err("empty state");
        assert!(error.contains("without flight_key"), "{error}");
    }

    proptest::proptest! {
        /// No input makes a decoder panic; whatever decodes builds a batch.
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            for table in Table::ALL {
                if let Ok(row) = decode(table, position(0), &bytes) {
                    let batch = record_batch(table, arrow_schema(table), &[&row]);
                    proptest::prop_assert!(batch.is_ok(), "{:?}", batch.err());
                }
            }
        }
    }
}
