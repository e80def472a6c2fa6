//! How rows become Arrow record batches: one typed column builder per table column, filled
//! with each row's cells in the table's column order, cast to the writer's schema.

use std::sync::Arc;

use contrail_proto::v1::{
    Alert, AlertState, EventType, FlightPrediction, FlightState, OperationalEvent, ServingChange,
};
use deltalake::arrow::array::{
    ArrayRef, BinaryBuilder, Date32Builder, Int32Builder, Int64Builder, ListBuilder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use deltalake::arrow::datatypes::Schema as ArrowSchema;
use deltalake::arrow::record_batch::RecordBatch;

use contrail_history::tables::{Kind, Table};

use super::{Body, Row};

/// A column's values, in the order rows are appended.
enum Column {
    Str(StringBuilder),
    Long(Int64Builder),
    Int(Int32Builder),
    Date(Date32Builder),
    Timestamp(TimestampMicrosecondBuilder),
    Binary(BinaryBuilder),
    StrList(ListBuilder<StringBuilder>),
}

impl Column {
    fn new(kind: Kind, capacity: usize) -> Column {
        match kind {
            Kind::Str => Column::Str(StringBuilder::with_capacity(capacity, capacity * 16)),
            Kind::Long => Column::Long(Int64Builder::with_capacity(capacity)),
            Kind::Int => Column::Int(Int32Builder::with_capacity(capacity)),
            Kind::Date => Column::Date(Date32Builder::with_capacity(capacity)),
            Kind::Timestamp => {
                Column::Timestamp(TimestampMicrosecondBuilder::with_capacity(capacity).with_timezone("UTC"))
            }
            Kind::Binary => Column::Binary(BinaryBuilder::with_capacity(capacity, capacity * 128)),
            Kind::StrList => Column::StrList(ListBuilder::new(StringBuilder::new())),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Column::Str(b) => Arc::new(b.finish()),
            Column::Long(b) => Arc::new(b.finish()),
            Column::Int(b) => Arc::new(b.finish()),
            Column::Date(b) => Arc::new(b.finish()),
            Column::Timestamp(b) => Arc::new(b.finish()),
            Column::Binary(b) => Arc::new(b.finish()),
            Column::StrList(b) => Arc::new(b.finish()),
        }
    }
}

/// A value of one cell.
enum Cell<'a> {
    Str(Option<&'a str>),
    Long(Option<i64>),
    Int(Option<i32>),
    Date(i32),
    Timestamp(Option<i64>),
    Binary(&'a [u8]),
    StrList(&'a [String]),
}

fn push(column: &mut Column, cell: Cell<'_>) -> Result<(), String> {
    match (column, cell) {
        (Column::Str(b), Cell::Str(v)) => b.append_option(v),
        (Column::Long(b), Cell::Long(v)) => b.append_option(v),
        (Column::Int(b), Cell::Int(v)) => b.append_option(v),
        (Column::Date(b), Cell::Date(v)) => b.append_value(v),
        (Column::Timestamp(b), Cell::Timestamp(v)) => b.append_option(v),
        (Column::Binary(b), Cell::Binary(v)) => b.append_value(v),
        (Column::StrList(b), Cell::StrList(values)) => {
            for value in values {
                b.values().append_value(value);
            }
            b.append(true);
        }
        _ => return Err("cell kind does not match its column".to_owned()),
    }
    Ok(())
}

fn non_empty(text: &str) -> Option<&str> {
    if text.is_empty() { None } else { Some(text) }
}

fn event_cells<'a>(row: &'a Row, event: &'a OperationalEvent) -> Vec<Cell<'a>> {
    let flight = event.flight.as_ref();
    let data = event.data.as_ref();
    let input = event.input.as_ref();
    let type_name = EventType::try_from(event.r#type)
        .map(contrail_events::event_type_name)
        .ok();
    vec![
        Cell::Str(Some(&event.event_id)),
        Cell::Str(non_empty(&event.source)),
        Cell::Str(type_name),
        Cell::Timestamp(Some(event.event_time_us)),
        Cell::Str(non_empty(&event.flight_key)),
        Cell::Str(flight.map(|f| f.carrier.as_str())),
        Cell::Int(flight.map(|f| f.number as i32)),
        Cell::Str(flight.map(|f| f.origin.as_str())),
        Cell::Date(row.date),
        Cell::Timestamp(data.and_then(|d| d.scheduled_out_us)),
        Cell::Timestamp(data.and_then(|d| d.scheduled_in_us)),
        Cell::Str(data.and_then(|d| d.destination.as_deref())),
        Cell::Str(data.and_then(|d| d.tail_number.as_deref())),
        Cell::Timestamp(data.and_then(|d| d.estimated_out_us)),
        Cell::Timestamp(data.and_then(|d| d.estimated_in_us)),
        Cell::Str(data.and_then(|d| d.gate.as_deref())),
        Cell::Str(data.and_then(|d| d.terminal.as_deref())),
        Cell::Int(data.and_then(|d| d.delay_minutes)),
        Cell::Str(data.and_then(|d| d.delay_code.as_deref())),
        Cell::Str(data.and_then(|d| d.reason.as_deref())),
        Cell::Str(data.and_then(|d| d.diverted_to.as_deref())),
        Cell::Str(non_empty(&event.extra_json)),
        Cell::Timestamp((event.ingested_at_us != 0).then_some(event.ingested_at_us)),
        Cell::Int(input.map(|i| i.partition)),
        Cell::Long(input.map(|i| i.offset)),
    ]
}

fn state_cells<'a>(row: &'a Row, state: &'a FlightState) -> Vec<Cell<'a>> {
    let input = state.input.as_ref();
    vec![
        Cell::Str(Some(&state.flight_key)),
        Cell::Long(Some(state.version as i64)),
        Cell::Str(non_empty(&state.carrier)),
        Cell::Int(Some(state.flight_number as i32)),
        Cell::Str(non_empty(&state.origin)),
        Cell::Date(row.date),
        Cell::Str(state.destination.as_deref()),
        Cell::Str(non_empty(&state.status)),
        Cell::Timestamp(state.scheduled_out_us),
        Cell::Timestamp(state.scheduled_in_us),
        Cell::Timestamp(state.estimated_out_us),
        Cell::Timestamp(state.estimated_in_us),
        Cell::Timestamp(state.actual_out_us),
        Cell::Timestamp(state.actual_off_us),
        Cell::Timestamp(state.actual_on_us),
        Cell::Timestamp(state.actual_in_us),
        Cell::Str(state.gate.as_deref()),
        Cell::Str(state.terminal.as_deref()),
        Cell::Str(state.tail_number.as_deref()),
        Cell::Int(state.delay_minutes),
        Cell::StrList(&state.delay_codes),
        Cell::Str(state.diverted_to.as_deref()),
        Cell::Str(non_empty(&state.last_event_id)),
        Cell::Timestamp(Some(state.last_event_time_us)),
        Cell::Timestamp((state.updated_at_us != 0).then_some(state.updated_at_us)),
        Cell::Int(input.map(|i| i.partition)),
        Cell::Long(input.map(|i| i.offset)),
    ]
}

fn change_cells<'a>(row: &'a Row, change: &'a ServingChange, version: Option<i64>) -> Vec<Cell<'a>> {
    vec![
        Cell::Str(Some(&change.id)),
        Cell::Long(Some(change.lsn)),
        Cell::Str(non_empty(&change.flight_key)),
        Cell::Long(version),
        Cell::Timestamp(change.ts.checked_mul(1_000_000)),
        Cell::Date(row.date),
        Cell::Str(non_empty(&change.feed_range)),
        Cell::Str(Some(&change.document_json)),
    ]
}

fn alert_cells<'a>(row: &'a Row, alert: &'a Alert) -> Vec<Cell<'a>> {
    let resolved = alert.state() == AlertState::Resolved;
    let input = alert.input.as_ref();
    vec![
        Cell::Str(Some(&alert.alert_id)),
        Cell::Str(non_empty(&alert.kind)),
        Cell::Str(Some(if resolved { "RESOLVED" } else { "FIRING" })),
        Cell::Str(non_empty(&alert.flight_key)),
        Cell::Timestamp(Some(alert.fired_at_us)),
        Cell::Date(row.date),
        Cell::Timestamp(resolved.then_some(alert.resolved_at_us)),
        Cell::Str(non_empty(&alert.resolution)),
        Cell::Str(non_empty(&alert.message)),
        Cell::Int(input.map(|i| i.partition)),
        Cell::Long(input.map(|i| i.offset)),
        Cell::Long(Some(alert.emitted_after_offset)),
        Cell::Int(Some(alert.emitted_index as i32)),
    ]
}

fn prediction_cells<'a>(row: &'a Row, prediction: &'a FlightPrediction) -> Vec<Cell<'a>> {
    let input = prediction.input.as_ref();
    let outcome = if prediction.cancelled {
        "CANCELLED"
    } else if prediction.knock_on_alert {
        "KNOCK_ON_DELAY"
    } else if !prediction.knock_on_from.is_empty() {
        "KNOCK_ON"
    } else {
        "OWN_TIMES"
    };
    vec![
        Cell::Str(Some(&prediction.flight_key)),
        Cell::Long(i64::try_from(prediction.version).ok()),
        Cell::Str(non_empty(&prediction.tail_number)),
        Cell::Timestamp(Some(prediction.scheduled_out_us)),
        Cell::Date(row.date),
        Cell::Timestamp(Some(prediction.predicted_out_us)),
        Cell::Timestamp(prediction.predicted_in_us),
        Cell::Str(non_empty(&prediction.knock_on_from)),
        Cell::Int(Some(prediction.delay_minutes)),
        Cell::Str(Some(outcome)),
        Cell::Int(input.map(|i| i.partition)),
        Cell::Long(input.map(|i| i.offset)),
        Cell::Int(i32::try_from(prediction.emitted_index).ok()),
    ]
}

impl Row {
    fn cells(&self) -> Vec<Cell<'_>> {
        let mut cells = match &self.body {
            Body::Event(event) => event_cells(self, event),
            Body::Late(event) => {
                let mut cells = event_cells(self, event);
                cells.push(Cell::Str(non_empty(&event.late_reason)));
                cells
            }
            Body::State(state) => state_cells(self, state),
            Body::Change(change, version) => change_cells(self, change, *version),
            Body::Alert(alert) => alert_cells(self, alert),
            Body::Prediction(prediction) => prediction_cells(self, prediction),
        };
        cells.extend([
            Cell::Str(Some(&self.position.topic)),
            Cell::Int(Some(self.position.partition)),
            Cell::Long(Some(self.position.offset)),
            Cell::Binary(&self.record),
        ]);
        cells
    }

    /// Approximate bytes the row holds (for the `batch.max_bytes` threshold).
    pub fn weight(&self) -> usize {
        self.record.len() * 2 + self.origin.source.len() + 64
    }
}

/// Builds one record batch of `table` from `rows`, typed as `schema` (the writer's Arrow schema,
/// partition column included).
pub fn record_batch(table: Table, schema: Arc<ArrowSchema>, rows: &[&Row]) -> Result<RecordBatch, String> {
    let kinds = table.columns();
    let mut columns: Vec<Column> = kinds
        .iter()
        .map(|(_, kind, _)| Column::new(*kind, rows.len()))
        .collect();
    for row in rows {
        let cells = row.cells();
        if cells.len() != columns.len() {
            return Err(format!(
                "{}: a row has {} cells for {} columns",
                table.name(),
                cells.len(),
                columns.len()
            ));
        }
        for (column, cell) in columns.iter_mut().zip(cells) {
            push(column, cell)?;
        }
    }
    let mut arrays = Vec::with_capacity(columns.len());
    for ((name, _, _), column) in kinds.iter().zip(columns.iter_mut()) {
        let array = column.finish();
        let field = schema
            .field_with_name(name)
            .map_err(|error| format!("{}: column {name}: {error}", table.name()))?;
        let array = if array.data_type() == field.data_type() {
            array
        } else {
            deltalake::arrow::compute::cast(&array, field.data_type())
                .map_err(|error| format!("{}: column {name}: {error}", table.name()))?
        };
        arrays.push(array);
    }
    // Order the arrays as the schema orders its fields.
    let mut ordered = Vec::with_capacity(arrays.len());
    for field in schema.fields() {
        let index = kinds
            .iter()
            .position(|(name, _, _)| name == field.name())
            .ok_or_else(|| format!("{}: unexpected column {}", table.name(), field.name()))?;
        ordered.push(arrays[index].clone());
    }
    RecordBatch::try_new(schema, ordered).map_err(|error| format!("{}: {error}", table.name()))
}
