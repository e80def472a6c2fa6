//! What both outputs of `contrail admin` derive from a response the same way: the summed lag,
//! the state document parsed, a timestamp's text.

use chrono::{DateTime, SecondsFormat};
use contrail_proto::admin::v1 as admin;
use serde_json::Value;

/// Lag summed over the partitions that report one (a negative lag means "not known yet").
pub(super) fn total_lag(status: &admin::StatusResponse) -> i64 {
    status
        .partitions
        .iter()
        .map(|partition| partition.lag.max(0))
        .fold(0_i64, i64::saturating_add)
}

/// The state document as JSON: null when empty, the raw text when it does not parse.
pub(super) fn parse_state(state_json: &str) -> Value {
    if state_json.trim().is_empty() {
        return Value::Null;
    }
    serde_json::from_str(state_json).unwrap_or_else(|_| Value::String(state_json.to_owned()))
}

/// RFC 3339 (UTC) of microseconds since the Unix epoch.
pub(super) fn format_micros(micros: i64) -> String {
    DateTime::from_timestamp_micros(micros).map_or_else(
        || format!("{micros} µs (out of range)"),
        |time| time.to_rfc3339_opts(SecondsFormat::AutoSi, true),
    )
}
