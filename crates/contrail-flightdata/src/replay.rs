//! Delivering flight events in arrival order, with seeded duplicates, disorder and stragglers.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use chrono::{DateTime, Duration, Utc};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::events::{SourceEvent, flight_events};
use crate::flights::FlightData;

/// How the replayed feed misbehaves. Every choice comes from one ChaCha8 generator seeded with
/// `seed`, so the same configuration always yields the same feed.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayConfig {
    /// Seed of the generator.
    pub seed: u64,
    /// Share of events delivered a second time (same `event_id`), 0.0–1.0.
    pub duplicate_rate: f64,
    /// Each delivery arrives up to this long after its event time, uniformly: bounded disorder.
    pub max_disorder: Duration,
    /// Share of events delivered `straggler_delay` after their event time, 0.0–1.0.
    pub straggler_rate: f64,
    /// How late stragglers arrive. Whether dedup-state then calls them late depends on the flight's
    /// other events (its watermark) and `allowed_lateness`.
    pub straggler_delay: Duration,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig {
            seed: 2013,
            duplicate_rate: 0.10,
            max_disorder: Duration::minutes(10),
            straggler_rate: 0.0,
            straggler_delay: Duration::hours(3),
        }
    }
}

/// One delivery of an event.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The event.
    pub event: SourceEvent,
    /// When the feed delivers it (simulated time).
    pub arrival: DateTime<Utc>,
    /// 0 for the first delivery, 1 for a redelivery.
    pub copy: u32,
    /// Whether this delivery was held back as a straggler.
    pub straggler: bool,
    /// Position in generation order, the tie-breaker for equal arrival times.
    pub sequence: u64,
}

struct Pending(Delivery);

impl Pending {
    fn sort_key(&self) -> (DateTime<Utc>, u64) {
        (self.0.arrival, self.0.sequence)
    }
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.sort_key() == other.sort_key()
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> Ordering {
        self.sort_key().cmp(&other.sort_key())
    }
}

/// Counts of what a replay delivered so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// Flights expanded into events.
    pub flights: u64,
    /// Distinct events.
    pub events: u64,
    /// Deliveries (events plus redeliveries).
    pub deliveries: u64,
    /// Redeliveries.
    pub duplicates: u64,
    /// Deliveries held back as stragglers.
    pub stragglers: u64,
}

/// An iterator of [`Delivery`] in arrival order. Streams: it expands flights in scheduled order
/// and only keeps the deliveries that may still be overtaken (about a day's worth).
pub struct ReplayStream {
    data: FlightData,
    config: ReplayConfig,
    rng: ChaCha8Rng,
    next_flight: usize,
    pending: BinaryHeap<Reverse<Pending>>,
    sequence: u64,
    stats: ReplayStats,
}

/// Every event of a flight happens at or after its scheduled departure minus this (the SCHEDULED
/// message is the earliest, sent a day ahead), so a delivery arriving before
/// `next_flight.scheduled_out - EARLIEST_EVENT_LEAD` cannot be overtaken by a later flight's events.
const EARLIEST_EVENT_LEAD: Duration = Duration::days(1);

impl ReplayStream {
    /// A replay of `data` with the given misbehaviour.
    pub fn new(data: FlightData, config: ReplayConfig) -> ReplayStream {
        ReplayStream {
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            data,
            config,
            next_flight: 0,
            pending: BinaryHeap::new(),
            sequence: 0,
            stats: ReplayStats::default(),
        }
    }

    /// What was delivered so far (complete once the iterator is exhausted).
    pub fn stats(&self) -> ReplayStats {
        self.stats
    }

    /// Number of flights in the replay.
    pub fn flight_count(&self) -> usize {
        self.data.flights.len()
    }

    fn expand_next_flight(&mut self) {
        let Some(flight) = self.data.flights.get(self.next_flight) else {
            return;
        };
        self.next_flight += 1;
        self.stats.flights += 1;
        let disorder_us = self.config.max_disorder.num_microseconds().unwrap_or(0).max(0);
        for event in flight_events(flight, &self.data.time_zones) {
            self.stats.events += 1;
            let straggler = self.rng.random_bool(self.config.straggler_rate.clamp(0.0, 1.0));
            let first_arrival = if straggler {
                event.event_time + self.config.straggler_delay
            } else {
                event.event_time + Duration::microseconds(self.rng.random_range(0..=disorder_us))
            };
            let duplicated = self.rng.random_bool(self.config.duplicate_rate.clamp(0.0, 1.0));
            if duplicated {
                let second_arrival =
                    first_arrival + Duration::microseconds(self.rng.random_range(0..=disorder_us));
                self.push(event.clone(), second_arrival, 1, false);
            }
            self.push(event, first_arrival, 0, straggler);
        }
    }

    fn push(&mut self, event: SourceEvent, arrival: DateTime<Utc>, copy: u32, straggler: bool) {
        self.sequence += 1;
        self.pending.push(Reverse(Pending(Delivery {
            event,
            arrival,
            copy,
            straggler,
            sequence: self.sequence,
        })));
    }

    fn horizon(&self) -> Option<DateTime<Utc>> {
        self.data
            .flights
            .get(self.next_flight)
            .map(|flight| flight.scheduled_out - EARLIEST_EVENT_LEAD)
    }
}

impl Iterator for ReplayStream {
    type Item = Delivery;

    fn next(&mut self) -> Option<Delivery> {
        loop {
            let ready = match (self.pending.peek(), self.horizon()) {
                (Some(Reverse(top)), Some(horizon)) => top.0.arrival < horizon,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return None,
            };
            if ready {
                let Reverse(Pending(delivery)) = self.pending.pop()?;
                self.stats.deliveries += 1;
                if delivery.copy > 0 {
                    self.stats.duplicates += 1;
                }
                if delivery.straggler {
                    self.stats.stragglers += 1;
                }
                return Some(delivery);
            }
            self.expand_next_flight();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flights::{TimeZones, parse_flights};

    fn sample_data() -> FlightData {
        let csv = "year,month,day,dep_time,sched_dep_time,dep_delay,arr_time,sched_arr_time,arr_delay,carrier,flight,tailnum,origin,dest,air_time,distance,hour,minute,time_hour
2013,1,1,517,515,2,830,819,11,UA,1545,N14228,EWR,IAH,227,1400,5,15,2013-01-01T10:00:00Z
2013,1,1,533,529,4,850,830,20,UA,1714,N24211,LGA,IAH,227,1416,5,29,2013-01-01T10:00:00Z
2013,1,1,542,540,2,923,850,33,AA,1141,N619AA,JFK,MIA,160,1089,5,40,2013-01-01T10:00:00Z
2013,1,2,NA,1630,NA,NA,1815,NA,EV,4308,N18120,EWR,RDU,NA,416,16,30,2013-01-02T21:00:00Z
2013,1,3,1525,1340,105,NA,1554,NA,EV,4294,N13988,EWR,ORF,NA,284,13,40,2013-01-03T18:00:00Z
";
        FlightData {
            flights: parse_flights(csv.as_bytes(), None, None).expect("parse"),
            time_zones: TimeZones::default(),
        }
    }

    fn collect(config: ReplayConfig) -> Vec<Delivery> {
        ReplayStream::new(sample_data(), config).collect()
    }

    #[test]
    fn same_seed_same_feed_other_seed_other_feed() {
        let config = ReplayConfig {
            duplicate_rate: 0.5,
            ..ReplayConfig::default()
        };
        let first = collect(config.clone());
        assert_eq!(first, collect(config.clone()));
        let other = collect(ReplayConfig { seed: 7, ..config });
        assert_ne!(first, other);
    }

    #[test]
    fn arrivals_are_non_decreasing_and_every_event_is_delivered() {
        let config = ReplayConfig {
            duplicate_rate: 0.3,
            straggler_rate: 0.2,
            max_disorder: Duration::hours(2),
            ..ReplayConfig::default()
        };
        let mut stream = ReplayStream::new(sample_data(), config);
        let deliveries: Vec<Delivery> = stream.by_ref().collect();
        for pair in deliveries.windows(2) {
            assert!(pair[0].arrival <= pair[1].arrival);
        }
        let stats = stream.stats();
        let originals = deliveries.iter().filter(|d| d.copy == 0).count();
        assert_eq!(u64::try_from(originals).expect("fits"), stats.events);
        assert_eq!(stats.deliveries, stats.events + stats.duplicates);
        let mut ids: Vec<&str> = deliveries
            .iter()
            .filter(|d| d.copy == 0)
            .map(|d| d.event.event_id.as_str())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(
            u64::try_from(ids.len()).expect("fits"),
            stats.events,
            "event ids are unique"
        );
    }

    #[test]
    fn no_disorder_no_duplicates_gives_event_time_order() {
        let config = ReplayConfig {
            duplicate_rate: 0.0,
            max_disorder: Duration::zero(),
            ..ReplayConfig::default()
        };
        let deliveries = collect(config);
        assert_eq!(deliveries.len(), 7 * 3 + 3 + 7);
        for pair in deliveries.windows(2) {
            assert!(pair[0].event.event_time <= pair[1].event.event_time);
        }
    }
}
