//! The history tables (docs/CONTRACT.md, "Stores", and `predictions` of the rotation processor):
//! their names, partition columns and Delta schemas.
//!
//! Every table has typed columns for every field the fold uses, the Kafka position the row was
//! archived from (`kafka_topic`, `kafka_partition`, `kafka_offset`) and the full record as it was
//! on the wire (`record`, protobuf bytes), so nothing is lost even for fields added later.

use deltalake::kernel::{ArrayType, DataType, StructField};

/// One of the history tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// `events`: one row per accepted event (from `ops.events.accepted`).
    Events,
    /// `flight_states`: one row per `(flight_key, version)` (from `ops.flights.curated`).
    FlightStates,
    /// `late_events`: events older than their flight's watermark (from `ops.events.late`).
    LateEvents,
    /// `serving_changes`: one row per `(id, _lsn)` of the Cosmos DB change feed
    /// (from `ops.flights.changes`).
    ServingChanges,
    /// `alerts`: one row per alert raised and per resolution, `(alert_id, state)` (from
    /// `ops.alerts`).
    Alerts,
    /// `predictions`: one row per knock-on delay prediction of a flight, `(flight_key, version)`
    /// (from `ops.flights.predictions`, when delta-archiver is given that topic).
    Predictions,
}

impl Table {
    /// Every table.
    pub const ALL: [Table; 6] = [
        Table::Events,
        Table::FlightStates,
        Table::LateEvents,
        Table::ServingChanges,
        Table::Alerts,
        Table::Predictions,
    ];

    /// The table's directory name under the Delta root.
    pub fn name(self) -> &'static str {
        match self {
            Table::Events => "events",
            Table::FlightStates => "flight_states",
            Table::LateEvents => "late_events",
            Table::ServingChanges => "serving_changes",
            Table::Alerts => "alerts",
            Table::Predictions => "predictions",
        }
    }

    /// The Delta `txn` application id under which delta-archiver records, with every commit,
    /// the last offset of `topic`'s `partition` written to this table
    /// (docs/CONTRACT.md, "History commits").
    pub fn app_id(self, topic: &str, partition: i32) -> String {
        format!("{}-{topic}-{partition}", self.name())
    }

    /// The partition column (a date).
    pub fn partition_column(self) -> &'static str {
        match self {
            Table::ServingChanges => "change_date",
            Table::Alerts => "alert_date",
            Table::Predictions => "prediction_date",
            _ => "service_date",
        }
    }

    /// The protobuf message its records carry.
    pub fn message(self) -> &'static str {
        match self {
            Table::Events | Table::LateEvents => "contrail.v1.OperationalEvent",
            Table::FlightStates => "contrail.v1.FlightState",
            Table::ServingChanges => "contrail.v1.ServingChange",
            Table::Alerts => "contrail.v1.Alert",
            Table::Predictions => "contrail.v1.FlightPrediction",
        }
    }

    /// Every column as `(name, kind, nullable)`, in schema order.
    pub fn columns(self) -> Vec<(&'static str, Kind, bool)> {
        let data: &[&[(&str, Kind, bool)]] = match self {
            Table::Events => &[EVENT_COLUMNS],
            Table::LateEvents => &[EVENT_COLUMNS, LATE_COLUMNS],
            Table::FlightStates => &[STATE_COLUMNS],
            Table::ServingChanges => &[CHANGE_COLUMNS],
            Table::Alerts => &[ALERT_COLUMNS],
            Table::Predictions => &[PREDICTION_COLUMNS],
        };
        data.iter()
            .chain([&POSITION_COLUMNS])
            .flat_map(|columns| columns.iter().copied())
            .collect()
    }

    /// The columns Delta keeps statistics for: the scalar data columns (not the binary record, a
    /// list, or the partition column, whose value is in the log anyway).
    pub fn stats_columns(self) -> Vec<&'static str> {
        let partition = self.partition_column();
        self.columns()
            .iter()
            .filter(|(name, kind, _)| !matches!(kind, Kind::Binary | Kind::StrList) && *name != partition)
            .map(|(name, _, _)| *name)
            .collect()
    }

    /// The Delta schema.
    pub fn delta_columns(self) -> Vec<StructField> {
        self.columns()
            .iter()
            .map(|(name, kind, nullable)| StructField::new(*name, kind.delta_type(), *nullable))
            .collect()
    }
}

/// The type of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// UTF-8 text.
    Str,
    /// 64-bit integer.
    Long,
    /// 32-bit integer.
    Int,
    /// A date (days since 1970-01-01).
    Date,
    /// µs since the epoch, UTC.
    Timestamp,
    /// Bytes.
    Binary,
    /// A list of texts.
    StrList,
}

impl Kind {
    /// Its Delta type.
    pub fn delta_type(self) -> DataType {
        match self {
            Kind::Str => DataType::STRING,
            Kind::Long => DataType::LONG,
            Kind::Int => DataType::INTEGER,
            Kind::Date => DataType::DATE,
            Kind::Timestamp => DataType::TIMESTAMP,
            Kind::Binary => DataType::BINARY,
            Kind::StrList => DataType::Array(Box::new(ArrayType::new(DataType::STRING, true))),
        }
    }
}

use Kind::{Binary, Date, Int, Long, Str, StrList, Timestamp};

/// Where every row was read from and the record as it was on the wire: the last columns of every
/// table.
const POSITION_COLUMNS: &[(&str, Kind, bool)] = &[
    ("kafka_topic", Str, false),
    ("kafka_partition", Int, false),
    ("kafka_offset", Long, false),
    ("record", Binary, false),
];

/// What `late_events` adds to the event columns: why the event was not applied.
const LATE_COLUMNS: &[(&str, Kind, bool)] = &[("late_reason", Str, true)];

const EVENT_COLUMNS: &[(&str, Kind, bool)] = &[
    ("event_id", Str, false),
    ("source", Str, true),
    ("type", Str, true),
    ("event_time", Timestamp, true),
    ("flight_key", Str, true),
    ("carrier", Str, true),
    ("flight_number", Int, true),
    ("origin", Str, true),
    ("service_date", Date, false),
    ("scheduled_out", Timestamp, true),
    ("scheduled_in", Timestamp, true),
    ("destination", Str, true),
    ("tail_number", Str, true),
    ("estimated_out", Timestamp, true),
    ("estimated_in", Timestamp, true),
    ("gate", Str, true),
    ("terminal", Str, true),
    ("delay_minutes", Int, true),
    ("delay_code", Str, true),
    ("reason", Str, true),
    ("diverted_to", Str, true),
    ("extra_json", Str, true),
    ("ingested_at", Timestamp, true),
    ("input_partition", Int, true),
    ("input_offset", Long, true),
];

const STATE_COLUMNS: &[(&str, Kind, bool)] = &[
    ("flight_key", Str, false),
    ("version", Long, false),
    ("carrier", Str, true),
    ("flight_number", Int, true),
    ("origin", Str, true),
    ("service_date", Date, false),
    ("destination", Str, true),
    ("status", Str, true),
    ("scheduled_out", Timestamp, true),
    ("scheduled_in", Timestamp, true),
    ("estimated_out", Timestamp, true),
    ("estimated_in", Timestamp, true),
    ("actual_out", Timestamp, true),
    ("actual_off", Timestamp, true),
    ("actual_on", Timestamp, true),
    ("actual_in", Timestamp, true),
    ("gate", Str, true),
    ("terminal", Str, true),
    ("tail_number", Str, true),
    ("delay_minutes", Int, true),
    ("delay_codes", StrList, true),
    ("diverted_to", Str, true),
    ("last_event_id", Str, true),
    ("last_event_time", Timestamp, true),
    ("updated_at", Timestamp, true),
    ("input_partition", Int, true),
    ("input_offset", Long, true),
];

const CHANGE_COLUMNS: &[(&str, Kind, bool)] = &[
    ("id", Str, false),
    ("lsn", Long, false),
    ("flight_key", Str, true),
    ("version", Long, true),
    ("change_time", Timestamp, true),
    ("change_date", Date, false),
    ("feed_range", Str, true),
    ("document_json", Str, true),
];

const ALERT_COLUMNS: &[(&str, Kind, bool)] = &[
    ("alert_id", Str, false),
    ("kind", Str, true),
    // `FIRING` or `RESOLVED`.
    ("state", Str, false),
    ("flight_key", Str, true),
    ("fired_at", Timestamp, true),
    // The UTC date of `fired_at`, shared by an alert and its resolution.
    ("alert_date", Date, false),
    ("resolved_at", Timestamp, true),
    // `DEPARTED` or `CANCELLED`.
    ("resolution", Str, true),
    ("message", Str, true),
    ("input_partition", Int, true),
    ("input_offset", Long, true),
    ("emitted_after_offset", Long, true),
    ("emitted_index", Int, true),
];

const PREDICTION_COLUMNS: &[(&str, Kind, bool)] = &[
    ("flight_key", Str, false),
    ("version", Long, false),
    ("tail_number", Str, true),
    ("scheduled_out", Timestamp, true),
    // The UTC date of `scheduled_out`.
    ("prediction_date", Date, false),
    ("predicted_out", Timestamp, true),
    ("predicted_in", Timestamp, true),
    // The inbound flight whose arrival sets `predicted_out`; null when the flight's own times do.
    ("knock_on_from", Str, true),
    ("delay_minutes", Int, true),
    // `KNOCK_ON_DELAY` (an alert is raised), `KNOCK_ON` (delayed by the inbound, below the alert
    // threshold), `OWN_TIMES`, or `CANCELLED` (the flight's last prediction).
    ("outcome", Str, false),
    ("input_partition", Int, true),
    ("input_offset", Long, true),
    ("emitted_index", Int, true),
];
