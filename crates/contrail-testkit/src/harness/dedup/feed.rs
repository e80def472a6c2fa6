//! Real nycflights13 events for dedup-state's raw topic, and the raw records read back.

use std::time::Duration;

use anyhow::{Context, Result};
use contrail_proto::v1::{OperationalEvent, SourcePosition};
use prost::Message as _;
use rdkafka::message::{Message as _, OwnedMessage};
use rdkafka::producer::Producer as _;

/// Operational events of nycflights13 between two dates (inclusive), in the feed's delivery order
/// with its duplicates, disorder and stragglers, validated exactly as ingest validates them.
pub fn replay_events(
    from: (u32, u32),
    to: (u32, u32),
    config: contrail_flightdata::ReplayConfig,
) -> Vec<OperationalEvent> {
    let data_dir = contrail_flightdata::default_data_dir().expect("the shipped nycflights13 data");
    let from = chrono::NaiveDate::from_ymd_opt(2013, from.0, from.1);
    let to = chrono::NaiveDate::from_ymd_opt(2013, to.0, to.1);
    let data = contrail_flightdata::FlightData::load(&data_dir, from, to).expect("load flights");
    let limits = contrail_events::Limits::default();
    contrail_flightdata::ReplayStream::new(data, config)
        .map(|delivery| {
            contrail_events::validate_record(&delivery.event.to_json(), &limits, 0)
                .expect("the feed is valid")
        })
        .collect()
}

/// Produces `events` to `topic` keyed by flight key and waits for every acknowledgement.
pub fn produce_events(brokers: &str, topic: &str, events: &[OperationalEvent]) -> Result<()> {
    let producer = crate::test_producer(brokers)?;
    for event in events {
        crate::send_waiting(&producer, topic, &event.flight_key, &event.encode_to_vec())?;
    }
    producer.flush(Duration::from_secs(120)).context("flush")?;
    Ok(())
}

/// The replay settings of the restart tests: 15 % duplicates, 10 minutes of disorder, 1 % of
/// events three hours late.
pub fn realistic_feed(seed: u64) -> contrail_flightdata::ReplayConfig {
    contrail_flightdata::ReplayConfig {
        seed,
        duplicate_rate: 0.15,
        max_disorder: chrono::Duration::minutes(10),
        straggler_rate: 0.01,
        straggler_delay: chrono::Duration::hours(3),
    }
}

/// A record of the raw topic, decoded.
#[derive(Debug, Clone)]
pub struct RawRecord {
    /// Where it is.
    pub position: SourcePosition,
    /// The event.
    pub event: OperationalEvent,
    /// The record's timestamp on the broker, µs (`None` when it has none): the receiving clock
    /// of the plausible-time rule.
    pub timestamp_us: Option<i64>,
}

/// Decodes raw-topic messages.
pub fn raw_records(messages: &[OwnedMessage]) -> Vec<RawRecord> {
    let mut records: Vec<RawRecord> = messages
        .iter()
        .map(|message| RawRecord {
            position: SourcePosition {
                topic: message.topic().to_owned(),
                partition: message.partition(),
                offset: message.offset(),
            },
            event: OperationalEvent::decode(message.payload().unwrap_or_default())
                .expect("raw records are events"),
            timestamp_us: message
                .timestamp()
                .to_millis()
                .map(|millis| millis.saturating_mul(1_000)),
        })
        .collect();
    records.sort_by_key(|record| (record.position.partition, record.position.offset));
    records.dedup_by_key(|record| (record.position.partition, record.position.offset));
    records
}
