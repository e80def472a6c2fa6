//! Plausible time (docs/CONTRACT.md, "Plausible time"): a source with a broken clock must not
//! poison anyone else's data. An `event_time` is plausible when it is
//! - no later than the receiving clock + `max_clock_skew` (default 1 h), and
//! - on or after 00:00 UTC of `flight.date` − 400 days (schedules are published up to about a year
//!   ahead), and before 00:00 UTC of `flight.date` + 8 days (a flight's own events end within days
//!   of its date: any time on the 7th day after it is still plausible).
//!
//! ingest applies the rule with its own clock when a record arrives; dedup-state applies it again
//! to every record of the raw topic (sources may write there directly) with its processing clock.
//! Replays of history are unaffected: their times are in the past and near their flights' dates.
//! Pure: the caller supplies the clock.

use chrono::NaiveDate;

use crate::validate::{FieldError, parse_service_date};

/// The default `max_clock_skew`: 1 hour, in µs.
pub const DEFAULT_MAX_CLOCK_SKEW_US: i64 = 3_600_000_000;
/// How far before its flight's date an event may be: 400 days.
pub const DAYS_BEFORE_SERVICE_DATE: i64 = 400;
/// How far after its flight's date an event may be: 7 days (any time on the 7th day after it).
pub const DAYS_AFTER_SERVICE_DATE: i64 = 7;
/// One day in µs.
pub const DAY_US: i64 = 86_400_000_000;

/// 00:00 UTC of `date`, µs since the epoch.
pub fn date_start_us(date: NaiveDate) -> i64 {
    date.and_hms_opt(0, 0, 0)
        .map_or(i64::MIN, |midnight| midnight.and_utc().timestamp_micros())
}

/// The service date written in a flight key `{carrier}{number}-{YYYY-MM-DD}-{origin}`
/// (`UA1545-2013-01-01-EWR` → 2013-01-01); `None` when the key is not of that shape.
pub fn service_date_of_key(flight_key: &str) -> Option<NaiveDate> {
    let (rest, origin) = flight_key.rsplit_once('-')?;
    if origin.is_empty() || rest.len() < 11 || !rest.is_char_boundary(rest.len() - 10) {
        return None;
    }
    let (flight, date) = rest.split_at(rest.len() - 10);
    if !flight.ends_with('-') || flight.len() < 2 {
        return None;
    }
    parse_service_date(date)
}

/// Checks the plausible-time rule for an event at `event_time_us` of a flight on `service_date`,
/// received when the receiving clock read `clock_us`. The error names the field (`event_time`),
/// the bad value and the bound it broke.
pub fn check_plausible_time(
    event_time_us: i64,
    service_date: NaiveDate,
    clock_us: i64,
    max_clock_skew_us: i64,
) -> Result<(), FieldError> {
    let time = crate::micros_to_rfc3339(event_time_us);
    let latest = clock_us.saturating_add(max_clock_skew_us);
    if event_time_us > latest {
        return Err(FieldError {
            field: "event_time".to_owned(),
            message: format!(
                "{time} is implausible: later than the receiving clock ({}) + max_clock_skew ({} s); \
                 the source's clock is wrong",
                crate::micros_to_rfc3339(clock_us),
                max_clock_skew_us / 1_000_000
            ),
        });
    }
    let date_start = date_start_us(service_date);
    let earliest = date_start.saturating_sub(DAYS_BEFORE_SERVICE_DATE * DAY_US);
    if event_time_us < earliest {
        return Err(FieldError {
            field: "event_time".to_owned(),
            message: format!(
                "{time} is implausible: more than {DAYS_BEFORE_SERVICE_DATE} days before flight.date {service_date}"
            ),
        });
    }
    let end = date_start.saturating_add((DAYS_AFTER_SERVICE_DATE + 1) * DAY_US);
    if event_time_us >= end {
        return Err(FieldError {
            field: "event_time".to_owned(),
            message: format!(
                "{time} is implausible: more than {DAYS_AFTER_SERVICE_DATE} days after flight.date {service_date}"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn micros(text: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(text)
            .expect("a test time")
            .timestamp_micros()
    }

    fn date(text: &str) -> NaiveDate {
        NaiveDate::parse_from_str(text, "%Y-%m-%d").expect("a test date")
    }

    const CLOCK: &str = "2026-12-04T12:00:00Z";

    fn check(event_time: &str, service_date: &str) -> Result<(), FieldError> {
        check_plausible_time(
            micros(event_time),
            date(service_date),
            micros(CLOCK),
            DEFAULT_MAX_CLOCK_SKEW_US,
        )
    }

    #[test]
    fn the_bounds_by_hand() {
        // The clock bound: 1 h ahead is fine, one second more is not.
        assert_eq!(check("2026-12-04T13:00:00Z", "2026-12-04"), Ok(()));
        let ahead = check("2026-12-04T13:00:01Z", "2026-12-04").expect_err("ahead of the clock");
        assert_eq!(ahead.field, "event_time");
        assert!(ahead.message.contains("2026-12-04T13:00:01Z"), "{ahead}");
        assert!(ahead.message.contains("max_clock_skew (3600 s)"), "{ahead}");
        // 400 days before the date: 2025-10-31 for 2026-12-05 (2026 is not a leap year).
        assert_eq!(check("2025-10-31T00:00:00Z", "2026-12-05"), Ok(()));
        let early = check("2025-10-30T23:59:59Z", "2026-12-05").expect_err("too early");
        assert!(
            early.message.contains("400 days before flight.date 2026-12-05"),
            "{early}"
        );
        // 7 days after the date: the whole 7th day, not the 8th.
        assert_eq!(check("2026-11-27T23:59:59Z", "2026-11-20"), Ok(()));
        let after = check("2026-11-28T00:00:00Z", "2026-11-20").expect_err("too late");
        assert!(
            after.message.contains("7 days after flight.date 2026-11-20"),
            "{after}"
        );
    }

    #[test]
    fn broken_clocks_and_history() {
        assert!(
            check("2099-01-01T00:00:00Z", "2099-01-01").is_err(),
            "a clock in 2099"
        );
        assert!(
            check("1971-01-01T00:00:00Z", "2013-01-01").is_err(),
            "a clock in 1971"
        );
        // A 2013 replay: in the past, near its dates.
        assert_eq!(check("2013-01-01T05:17:00Z", "2013-01-01"), Ok(()));
        // A schedule published 330 days ahead.
        assert_eq!(check("2026-12-04T11:00:00Z", "2027-10-31"), Ok(()));
    }

    #[test]
    fn the_date_of_a_flight_key() {
        assert_eq!(
            service_date_of_key("UA1545-2013-01-01-EWR"),
            Some(date("2013-01-01"))
        );
        assert_eq!(
            service_date_of_key("B61-2027-10-31-JFK"),
            Some(date("2027-10-31"))
        );
        for bad in [
            "",
            "-",
            "UA1545-2013-01-01",
            "2013-01-01-EWR",
            "UA1545-2013-02-30-EWR",
            "UA15452013-01-01-EWR",
            "UA1545-2013-01-01-",
            "ü-2013-01-0ü-EWR",
        ] {
            assert_eq!(service_date_of_key(bad), None, "{bad:?}");
        }
    }

    proptest::proptest! {
        /// Against the rule written out over whole days and a clock: accepted exactly when within
        /// the three bounds.
        #[test]
        fn accepted_exactly_within_the_bounds(
            day_offset in -500i64..20,
            second in 0i64..86_400,
            clock_offset_s in -100_000i64..100_000,
        ) {
            let service_date = date("2020-06-15");
            let date_start = 1_592_179_200_000_000i64; // 2020-06-15T00:00:00Z, by hand
            let event_time = date_start + day_offset * DAY_US + second * 1_000_000;
            let clock = event_time + clock_offset_s * 1_000_000;
            let expected = clock_offset_s >= -3_600 && (-400..=7).contains(&day_offset);
            let verdict = check_plausible_time(event_time, service_date, clock, DEFAULT_MAX_CLOCK_SKEW_US);
            proptest::prop_assert_eq!(verdict.is_ok(), expected, "{:?}", verdict);
        }
    }
}
