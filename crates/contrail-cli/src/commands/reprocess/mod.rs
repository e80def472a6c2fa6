//! `contrail backfill reprocess`: the accepted events of the flights with an event in a time range
//! (each flight whole), from the history (the Delta `events` table) — once delta-archiver has
//! archived the accepted topic up to its current end — produced again — in event-time order, keyed by flight key, as the raw topic
//! holds them — to a topic of their own, for a **fresh** dedup-state deployment to process.
//!
//! Why a fresh state and not the running deployment's (and not merely a new consumer group on the
//! raw topic): the running deployment's state already holds these events — their ids are in its
//! dedup entries (so they would be dropped as duplicates) and its flights' watermarks are past
//! them (so they would be late) — and the raw topic keeps only its retention, while the history
//! keeps every accepted event. Reprocessing is for changed rules or a new processor: a second
//! deployment (its own `state_dir`, checkpoints and consumer group) reads this topic and writes
//! its own output topics, which a second cosmos-writer can serve from another container. Events
//! are produced in (event time, event id) order, so the fresh deployment's watermarks advance as
//! they did for the live feed and nothing is late that was not late then. Running the command
//! twice is harmless: the receiving deployment drops the copies by event id.

use std::collections::BTreeSet;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chrono::{DateTime, NaiveDate, Utc};
use clap::Args;
use contrail_history::Table;
use contrail_history::arrow::array::Array;
use contrail_history::reader::partitions;
use contrail_proto::v1::OperationalEvent;
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use indicatif::{ProgressBar, ProgressStyle};
use prost::Message as _;
use rdkafka::producer::{FutureProducer, FutureRecord};

mod runs;

use runs::{Replayed, Runs, in_replay_order};

/// Options of `contrail backfill reprocess`.
#[derive(Args, Debug)]
pub struct ReprocessArgs {
    /// Delta root of the history (a local path or an `abfss://` URL), e.g. the `delta`
    /// directory of a `contrail up` working directory.
    #[arg(long, value_name = "ROOT")]
    from_delta: String,
    /// Start of the range: events whose event time is at or after it (RFC 3339, e.g.
    /// `2013-06-10T00:00:00Z`, or a date `2013-06-10` = its midnight UTC).
    #[arg(long, value_name = "TIMESTAMP", value_parser = parse_instant)]
    from: DateTime<Utc>,
    /// End of the range (exclusive), same forms. Default: every later event.
    #[arg(long, value_name = "TIMESTAMP", value_parser = parse_instant)]
    to: Option<DateTime<Utc>>,
    /// The topic to produce to (created when missing): the input (`topics.raw`) of the fresh
    /// deployment. Never the live raw topic: its deployment would drop every event as a copy.
    #[arg(long, value_name = "TOPIC")]
    to_topic: String,
    /// Partitions of the topic when it is created.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Port offset of a `contrail up --port-offset N` platform (its broker is the default).
    #[arg(long, default_value_t = 0, env = "CONTRAIL_PORT_OFFSET")]
    port_offset: u16,
    /// Read the history as it is, without first waiting for delta-archiver to archive the
    /// accepted topic up to its current end (for a history whose platform is gone).
    #[arg(long)]
    no_wait_for_archiver: bool,
    /// How long to wait for delta-archiver, in seconds.
    #[arg(long, default_value_t = 300)]
    archiver_timeout_secs: u64,
    /// The accepted topic delta-archiver archives into `events`.
    #[arg(long, default_value = contrail_common::topology::topics::ACCEPTED, env = "CONTRAIL_TOPICS__ACCEPTED")]
    accepted_topic: String,
    #[command(flatten)]
    kafka: crate::args::KafkaArgs,
    /// Where the sorted runs go while the table is put in event-time order (a temporary
    /// directory in it, removed at the end; it needs about the chosen events' size on disk).
    /// Default: the system's temporary directory.
    #[arg(long, value_name = "DIR")]
    spill_dir: Option<std::path::PathBuf>,
    /// No progress bar (the summary is still printed).
    #[arg(long)]
    quiet: bool,
}

/// An RFC 3339 instant, or a date meaning its midnight UTC.
fn parse_instant(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(instant) = DateTime::parse_from_rfc3339(text) {
        return Ok(instant.with_timezone(&Utc));
    }
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .ok()
        .and_then(|date| date.and_hms_opt(0, 0, 0))
        .map(|midnight| midnight.and_utc())
        .ok_or_else(|| {
            format!("{text:?} is neither an RFC 3339 time (2013-06-10T06:00:00Z) nor a date (2013-06-10)")
        })
}

/// Every event of each flight that has an event in `range` (event time, µs): a flight is
/// reprocessed whole — without its earlier events (its schedule, say) the fresh deployment would
/// build other states and versions than the history holds. Applied to one partition at a time:
/// the table is partitioned by service date, which all of a flight's events share.
fn whole_flights(events: Vec<Replayed>, range: std::ops::Range<i64>) -> Vec<Replayed> {
    let flights: BTreeSet<String> = events
        .iter()
        .filter(|event| range.contains(&event.time_us))
        .map(|event| event.key.clone())
        .collect();
    events
        .into_iter()
        .filter(|event| flights.contains(&event.key))
        .collect()
}

/// The events of one partition's files; an undecodable row is an error naming the date (the
/// history is damaged; nothing has been produced yet, the read comes first).
fn decode_partition(files: &[contrail_history::reader::FileRows], date: &str) -> Result<Vec<Replayed>> {
    let mut events = Vec::new();
    let mut undecodable = 0usize;
    for batch in files.iter().flat_map(|file| &file.batches) {
        let records = crate::stores::records(batch, "events")?;
        for row in 0..records.len() {
            let decoded = (!records.is_null(row))
                .then(|| OperationalEvent::decode(records.value(row)).ok())
                .flatten();
            let Some(event) = decoded else {
                undecodable += 1;
                continue;
            };
            events.push(Replayed {
                time_us: event.event_time_us,
                key: event.flight_key,
                id: event.event_id,
                payload: records.value(row).to_vec(),
            });
        }
    }
    if undecodable > 0 {
        bail!(
            "{undecodable} rows of the events table (service date {date}) hold no decodable event: the history is damaged, nothing was produced"
        );
    }
    Ok(events)
}

/// Runs `contrail backfill reprocess`.
pub async fn run(args: ReprocessArgs) -> Result<()> {
    let started = Instant::now();
    let kafka = args.kafka.config(args.port_offset);
    let live = contrail_common::topology::topics::RAW;
    if args.to_topic == live {
        bail!(
            "--to-topic {live}: the live deployment would drop every event as a copy (their ids are in its state); produce to a topic of the fresh deployment's, e.g. ops.events.reprocess"
        );
    }
    let (from_us, to_us) = (
        args.from.timestamp_micros(),
        args.to.map_or(i64::MAX, |to| to.timestamp_micros()),
    );
    if to_us <= from_us {
        bail!(
            "--to {} is not after --from {}",
            args.to.map(|t| t.to_rfc3339()).unwrap_or_default(),
            args.from.to_rfc3339()
        );
    }

    if !args.no_wait_for_archiver {
        crate::stores::archived::wait_for_archiver(crate::stores::archived::ArchiverWait {
            kafka: kafka.clone(),
            delta_root: &args.from_delta,
            table: Table::Events,
            topic: &args.accepted_topic,
            timeout_secs: args.archiver_timeout_secs,
            quiet: args.quiet,
        })
        .await?;
    }
    let Some(partitions) = partitions(&args.from_delta, &HashMap::new(), Table::Events)
        .await
        .with_context(|| format!("reading events under {}", args.from_delta))?
    else {
        bail!(
            "there is no events table under {:?} (is it the Delta root delta-archiver writes to?)",
            args.from_delta
        );
    };
    let spill_dir = args.spill_dir.clone().unwrap_or_else(std::env::temp_dir);
    let mut runs = Runs::new(&spill_dir).with_context(|| {
        format!(
            "creating a directory for sorted runs under {}",
            spill_dir.display()
        )
    })?;
    let dates: Vec<String> = partitions.dates().map(str::to_owned).collect();
    let reading = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(dates.len() as u64)
    };
    reading.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} service dates read {msg} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut flights = 0usize;
    for date in &dates {
        let files = partitions
            .read(date, &["record"])
            .await
            .with_context(|| format!("reading events of service date {date} under {}", args.from_delta))?;
        let events = decode_partition(&files, date)?;
        let chosen = in_replay_order(whole_flights(events, from_us..to_us));
        flights += chosen
            .iter()
            .map(|event| &event.key)
            .collect::<BTreeSet<_>>()
            .len();
        runs.add(&chosen)
            .with_context(|| format!("writing sorted events under {}", spill_dir.display()))?;
        reading.inc(1);
        reading.set_message(format!("{} events chosen", runs.events()));
    }
    reading.finish_and_clear();
    let total = runs.events();
    tracing::info!(
        partitions = dates.len(),
        files = partitions.file_count(),
        events = total,
        spilled_bytes = runs.bytes(),
        "events chosen and sorted"
    );
    drop(partitions);

    contrail_common::kafka::create_topics(
        &kafka,
        "contrail-backfill",
        &[args.to_topic.as_str()],
        args.partitions,
    )
    .await
    .with_context(|| format!("creating {}", args.to_topic))?;
    let producer: FutureProducer = kafka
        .producer_config("contrail-backfill")?
        .create()
        .context("creating the producer")?;
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total)
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} events produced {per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    // Sends in order, at most this many awaiting their acknowledgement (the idempotent producer
    // keeps each partition's order).
    const IN_FLIGHT: usize = 10_000;
    let mut pending = FuturesUnordered::new();
    let mut failed = 0usize;
    let mut first_error = None;
    let mut merged = runs
        .merged()
        .with_context(|| format!("merging sorted events under {}", spill_dir.display()))?;
    while let Some(event) = merged
        .next_event()
        .with_context(|| format!("reading sorted events under {}", spill_dir.display()))?
    {
        if pending.len() >= IN_FLIGHT
            && let Some(result) = pending.next().await
        {
            note(result, &mut failed, &mut first_error, &bar);
        }
        let (producer, topic) = (&producer, args.to_topic.as_str());
        pending.push(async move {
            producer
                .send(
                    FutureRecord::to(topic)
                        .key(event.key.as_str())
                        .payload(event.payload.as_slice()),
                    Duration::from_secs(300),
                )
                .await
        });
    }
    while let Some(result) = pending.next().await {
        note(result, &mut failed, &mut first_error, &bar);
    }
    bar.finish_and_clear();
    if let Some(error) = first_error {
        bail!(
            "{failed} of {total} events were not acknowledged by the broker (first: {error}); run the command again — the receiving deployment drops the copies by event id"
        );
    }
    println!(
        "{total} accepted events of {flights} flights with an event in {} … {} (each flight whole) produced to {} in {:.1} s, in event-time order",
        args.from.to_rfc3339(),
        args.to.map_or_else(|| "the end".to_owned(), |to| to.to_rfc3339()),
        args.to_topic,
        started.elapsed().as_secs_f64()
    );
    println!(
        "next: a fresh dedup-state deployment reads it (CONTRAIL_TOPICS__RAW={}, its own CONTRAIL_GROUP__ID, CONTRAIL_STATE_DIR and CONTRAIL_CHECKPOINT_URL, and its own output topics)",
        args.to_topic
    );
    Ok(())
}

type Sent = Result<
    rdkafka::producer::future_producer::Delivery,
    (rdkafka::error::KafkaError, rdkafka::message::OwnedMessage),
>;

fn note(result: Sent, failed: &mut usize, first_error: &mut Option<String>, bar: &ProgressBar) {
    match result {
        Ok(_) => bar.inc(1),
        Err((error, _)) => {
            *failed += 1;
            first_error.get_or_insert_with(|| error.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_are_rfc_3339_or_a_dates_midnight() {
        assert_eq!(
            parse_instant("2013-06-10").expect("a date"),
            parse_instant("2013-06-10T00:00:00Z").expect("an instant")
        );
        assert_eq!(
            parse_instant("2013-06-10T02:00:00+02:00")
                .expect("an offset")
                .timestamp(),
            parse_instant("2013-06-10").expect("a date").timestamp()
        );
        let error = parse_instant("10.6.2013").expect_err("neither");
        assert!(error.contains("10.6.2013"), "{error}");
    }

    #[test]
    fn a_flight_with_an_event_in_the_range_goes_out_whole() {
        let event = |time_us: i64, key: &str| Replayed {
            time_us,
            key: key.to_owned(),
            id: format!("{key}{time_us}"),
            payload: vec![],
        };
        let chosen = whole_flights(
            vec![event(5, "A"), event(15, "A"), event(6, "B"), event(25, "C")],
            10..20,
        );
        let times: Vec<(i64, &str)> = chosen
            .iter()
            .map(|event| (event.time_us, event.key.as_str()))
            .collect();
        assert_eq!(times, [(5, "A"), (15, "A")]);
    }
}
