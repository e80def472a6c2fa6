//! One flight → its operational events.

use chrono::{DateTime, Duration, Utc};
use serde_json::{Map, Value, json};

use crate::flights::{Flight, TimeZones};

/// An operational event as a source system sends it (the JSON ingest format of docs/CONTRACT.md,
/// "Events").
#[derive(Debug, Clone, PartialEq)]
pub struct SourceEvent {
    /// Unique per flight: `{source}-{flight_key}-{TYPE}`.
    pub event_id: String,
    /// Source system: `ssim` (schedules), `aodb` (airport ops), `dcs` (departure control),
    /// `acars` (aircraft OOOI messages), `ops` (operations control).
    pub source: &'static str,
    /// Contract type name, e.g. `OUT`.
    pub event_type: &'static str,
    /// When it happened.
    pub event_time: DateTime<Utc>,
    /// The flight's key.
    pub flight_key: String,
    /// Carrier code.
    pub carrier: String,
    /// Flight number.
    pub number: u32,
    /// Origin airport.
    pub origin: String,
    /// Service date `YYYY-MM-DD`.
    pub service_date: String,
    /// The `data` object.
    pub data: Map<String, Value>,
}

impl SourceEvent {
    /// The event in the JSON ingest format.
    pub fn to_json(&self) -> Value {
        json!({
            "event_id": self.event_id,
            "source": self.source,
            "type": self.event_type,
            "event_time": rfc3339(self.event_time),
            "flight": {"carrier": self.carrier, "number": self.number,
                       "origin": self.origin, "date": self.service_date},
            "data": Value::Object(self.data.clone()),
        })
    }

    /// Event time as UTC microseconds.
    pub fn event_time_us(&self) -> i64 {
        self.event_time.timestamp_micros()
    }
}

fn rfc3339(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// FNV-1a: a stable hash for deterministic choices (gate, delay code) derived from the flight key.
fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn pick<'a>(choices: &[&'a str], hash: u64, salt: u64) -> &'a str {
    let length = u64::try_from(choices.len()).unwrap_or(1).max(1);
    let position = usize::try_from((hash ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15)) % length).unwrap_or(0);
    choices.get(position).copied().unwrap_or("")
}

/// Terminals by New York airport, as they were in 2013.
fn terminals(origin: &str) -> &'static [&'static str] {
    match origin {
        "JFK" => &["1", "2", "4", "5", "7", "8"],
        "LGA" => &["A", "B", "C", "D"],
        _ => &["A", "B", "C"],
    }
}

/// IATA delay codes used for DELAYED events: late aircraft, technical, weather, ATC, crew, ground.
const DELAY_CODES: [&str; 6] = ["93", "41", "71", "81", "63", "31"];

/// The events of one flight, in event-time order (ties broken by event id).
pub fn flight_events(flight: &Flight, time_zones: &TimeZones) -> Vec<SourceEvent> {
    let key = flight.key();
    let hash = stable_hash(&key);
    let service_date = flight.date.format("%Y-%m-%d").to_string();
    let make = |source: &'static str, event_type: &'static str, event_time: DateTime<Utc>, data: Value| {
        SourceEvent {
            event_id: format!("{source}-{key}-{event_type}"),
            source,
            event_type,
            event_time,
            flight_key: key.clone(),
            carrier: flight.carrier.clone(),
            number: flight.number,
            origin: flight.origin.clone(),
            service_date: service_date.clone(),
            data: match data {
                Value::Object(map) => map,
                _ => Map::new(),
            },
        }
    };

    let scheduled_out = flight.scheduled_out;
    let scheduled_in = scheduled_arrival(flight, time_zones);
    let terminal = pick(terminals(&flight.origin), hash, 1);
    // Numbered terminals get a dash (`4-12`), lettered ones none (`B12`), as the airports sign them.
    let separator = if terminal.chars().all(|c| c.is_ascii_digit()) {
        "-"
    } else {
        ""
    };
    let gate = format!("{terminal}{separator}{}", 1 + (hash >> 16) % 40);

    let mut schedule = json!({"scheduled_out": rfc3339(scheduled_out),
                              "scheduled_in": rfc3339(scheduled_in),
                              "destination": flight.destination});
    if let Some(tail) = &flight.tail_number {
        schedule["tail_number"] = json!(tail);
    }
    let mut events = vec![
        make("ssim", "SCHEDULED", scheduled_out - Duration::days(1), schedule),
        make(
            "aodb",
            "GATE_ASSIGNED",
            scheduled_out - Duration::hours(2),
            json!({"gate": gate, "terminal": terminal}),
        ),
    ];

    let Some(departure_delay) = flight.departure_delay_minutes else {
        events.push(make(
            "ops",
            "CANCELLED",
            scheduled_out - Duration::hours(1),
            json!({"reason": "cancelled (BTS on-time data: no departure)"}),
        ));
        return sorted(events);
    };
    if departure_delay >= 15 {
        events.push(make(
            "ops",
            "DELAYED",
            scheduled_out - Duration::minutes(30),
            json!({"delay_minutes": departure_delay, "delay_code": pick(&DELAY_CODES, hash, 2)}),
        ));
    }
    let actual_out = scheduled_out + Duration::minutes(departure_delay);
    events.push(make(
        "dcs",
        "BOARDING",
        actual_out - Duration::minutes(30),
        json!({}),
    ));
    events.push(make("acars", "OUT", actual_out, json!({"gate": gate})));

    let arrival = flight
        .arrival_delay_minutes
        .map(|delay| scheduled_in + Duration::minutes(delay));
    match (arrival, flight.air_time_minutes) {
        (Some(actual_in), Some(air_minutes)) if actual_in > actual_out => {
            let block_minutes = (actual_in - actual_out).num_minutes();
            let taxi_minutes = block_minutes - air_minutes;
            let (actual_off, actual_on) = if taxi_minutes >= 2 {
                let taxi_out = ((taxi_minutes * 6) / 10).clamp(1, taxi_minutes - 1);
                let off = actual_out + Duration::minutes(taxi_out);
                (off, off + Duration::minutes(air_minutes))
            } else {
                // air_time in the data does not fit the block time (time-zone quirks): keep order.
                (
                    actual_out + Duration::minutes(1),
                    actual_in - Duration::minutes(1),
                )
            };
            events.push(make("acars", "OFF", actual_off, json!({})));
            events.push(make("acars", "ON", actual_on, json!({})));
            events.push(make("acars", "IN", actual_in, json!({})));
        }
        _ => {
            // Departed but never arrived at its destination: a diversion in the BTS data.
            let actual_off = actual_out + Duration::minutes(15);
            events.push(make("acars", "OFF", actual_off, json!({})));
            let diverted_at = match flight.air_time_minutes {
                Some(air_minutes) => actual_off + Duration::minutes(air_minutes),
                None => scheduled_in.max(actual_off + Duration::minutes(30)),
            };
            events.push(make("ops", "DIVERTED", diverted_at, json!({})));
        }
    }
    sorted(events)
}

fn sorted(mut events: Vec<SourceEvent>) -> Vec<SourceEvent> {
    events.sort_by(|a, b| (a.event_time, &a.event_id).cmp(&(b.event_time, &b.event_id)));
    events
}

/// Scheduled arrival in UTC: the local arrival clock time at the destination on the departure date,
/// moved a day forward until it is after the scheduled departure (overnight flights).
fn scheduled_arrival(flight: &Flight, time_zones: &TimeZones) -> DateTime<Utc> {
    let mut arrival = time_zones.to_utc(
        &flight.destination,
        flight.date.and_time(flight.scheduled_arrival_local),
    );
    while arrival <= flight.scheduled_out {
        arrival += Duration::days(1);
    }
    arrival
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flights::parse_flights;

    fn first_flights() -> Vec<Flight> {
        let csv = "year,month,day,dep_time,sched_dep_time,dep_delay,arr_time,sched_arr_time,arr_delay,carrier,flight,tailnum,origin,dest,air_time,distance,hour,minute,time_hour
2013,1,1,517,515,2,830,819,11,UA,1545,N14228,EWR,IAH,227,1400,5,15,2013-01-01T10:00:00Z
2013,1,1,NA,1630,NA,NA,1815,NA,EV,4308,N18120,EWR,RDU,NA,416,16,30,2013-01-01T21:00:00Z
2013,1,1,1525,1340,105,NA,1554,NA,EV,4294,N13988,EWR,ORF,NA,284,13,40,2013-01-01T18:00:00Z
";
        parse_flights(csv.as_bytes(), None, None).expect("parse")
    }

    #[test]
    fn an_arrived_flight_has_the_oooi_events_in_order() {
        let flights = first_flights();
        let zones = TimeZones::default().with_zone("IAH", chrono_tz::America::Chicago);
        let events = flight_events(&flights[0], &zones);
        let kinds: Vec<&str> = events.iter().map(|e| e.event_type).collect();
        assert_eq!(
            kinds,
            ["SCHEDULED", "GATE_ASSIGNED", "BOARDING", "OUT", "OFF", "ON", "IN"]
        );
        let out = &events[3];
        assert_eq!(out.event_time.to_rfc3339(), "2013-01-01T10:17:00+00:00");
        assert_eq!(out.event_id, "acars-UA1545-2013-01-01-EWR-OUT");
        // IAH is on Central time: scheduled 08:19 CST = 14:19Z, plus the 11 min arrival delay.
        assert_eq!(events[6].event_time.to_rfc3339(), "2013-01-01T14:30:00+00:00");
        assert_eq!(events[0].data["scheduled_in"], "2013-01-01T14:19:00Z");
        let on_minus_off = (events[5].event_time - events[4].event_time).num_minutes();
        assert_eq!(on_minus_off, 227, "air time is taken from the data");
    }

    #[test]
    fn cancelled_and_diverted_flights() {
        let flights = first_flights();
        let cancelled: Vec<&str> = flight_events(&flights[1], &TimeZones::default())
            .iter()
            .map(|e| e.event_type)
            .collect();
        assert_eq!(cancelled, ["SCHEDULED", "GATE_ASSIGNED", "CANCELLED"]);
        let diverted: Vec<&str> = flight_events(&flights[2], &TimeZones::default())
            .iter()
            .map(|e| e.event_type)
            .collect();
        assert_eq!(
            diverted,
            [
                "SCHEDULED",
                "GATE_ASSIGNED",
                "DELAYED",
                "BOARDING",
                "OUT",
                "OFF",
                "DIVERTED"
            ]
        );
    }

    #[test]
    fn generated_events_pass_the_contract() {
        for flight in first_flights() {
            for event in flight_events(&flight, &TimeZones::default()) {
                let validated = contrail_events::validate_record(
                    &event.to_json(),
                    &contrail_events::Limits::default(),
                    0,
                );
                let validated = validated.unwrap_or_else(|errors| panic!("{errors:?}"));
                assert_eq!(validated.flight_key, event.flight_key);
                assert_eq!(validated.event_time_us, event.event_time_us());
            }
        }
    }
}
