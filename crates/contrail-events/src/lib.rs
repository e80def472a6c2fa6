//! The operational-event contract of contrail (docs/CONTRACT.md, "Events"): how a source system's
//! JSON record is validated, how a flight is keyed, and how a valid record becomes the protobuf
//! [`OperationalEvent`] that travels on `ops.events.raw`.
//!
//! Everything here is pure and I/O-free so it can be fuzzed and property-tested. Guarantees:
//! - [`validate_record`] never panics, whatever JSON it is given, and reports *every* bad field of a
//!   record (not just the first), each named by its JSON path;
//! - [`split_body`] never panics on arbitrary bytes and splits a request body into records (one
//!   object, a JSON array, or NDJSON) so that one malformed line does not hide the valid ones;
//! - unknown fields are never lost: they are carried in `extra_json` for history;
//! - [`check_plausible_time`] is the one plausible-time rule, applied by ingest and dedup-state.

mod body;
mod fast;
mod plausible;
mod validate;

pub use body::{BodyError, BodyRecord, split_body};
pub use fast::validate_json;
pub use plausible::{
    DAY_US, DAYS_AFTER_SERVICE_DATE, DAYS_BEFORE_SERVICE_DATE, DEFAULT_MAX_CLOCK_SKEW_US,
    check_plausible_time, date_start_us, service_date_of_key,
};
pub use validate::{
    FieldError, Limits, event_type_from_name, event_type_name, flight_key, json_kind, validate_record,
};

pub use contrail_proto::v1::{EventData, EventType, FlightRef, OperationalEvent};

/// Converts UTC microseconds since the epoch to RFC 3339 (`2013-01-01T10:17:00Z`), the inverse of
/// the parsing [`validate_record`] does for `event_time` and the `data` times.
pub fn micros_to_rfc3339(micros: i64) -> String {
    match chrono::DateTime::from_timestamp_micros(micros) {
        Some(time) => time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        None => format!("invalid-timestamp({micros})"),
    }
}
