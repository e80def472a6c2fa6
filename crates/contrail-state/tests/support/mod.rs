//! What the engine's test files share: a protobuf running sum, minutes in µs, the engine settings
//! and the `"{minute},{value}"` input payload.

use contrail_state::{
    EngineConfig, InputRecord, KeyContext, StateError, StatefulProcessor, TimeDomain, Timer,
};

/// Per-key running sum, as a protobuf message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sum {
    #[prost(int64, tag = "1")]
    pub total: i64,
    #[prost(uint64, tag = "2")]
    pub count: u64,
}

/// A minute in µs.
pub const MINUTE: i64 = 60_000_000;

/// Ten minutes of allowed lateness.
pub const CONFIG: EngineConfig = EngineConfig {
    allowed_lateness_us: 10 * MINUTE,
};

/// An input payload `"{event_minute},{value}"`: its event time (µs) and value.
pub fn parse(payload: &[u8]) -> (i64, i64) {
    let text = std::str::from_utf8(payload).expect("utf8");
    let (minute, value) = text.split_once(',').expect("comma");
    (
        minute.parse::<i64>().expect("minute") * MINUTE,
        value.parse().expect("value"),
    )
}

/// Input payload: `"{event_minute},{value}"`. Keeps a sum per key (TTL 60 min after the event),
/// dedups by payload, registers an event-time timer 5 minutes after each event, and emits the sum
/// on every record and a `fired` record for each timer.
pub struct Summer;

impl StatefulProcessor for Summer {
    fn handle_record(
        &mut self,
        context: &mut KeyContext<'_>,
        record: &InputRecord<'_>,
    ) -> Result<(), StateError> {
        let (event_time, value) = parse(record.payload);
        context.observe_event_time(event_time);
        if context.dedup_contains(record.payload)? {
            return Ok(());
        }
        context.dedup_insert(record.payload, event_time + 30 * MINUTE);
        let mut sum: Sum = context.get("sum")?.unwrap_or_default();
        sum.total += value;
        sum.count += 1;
        context.set("sum", &sum, Some(event_time + 60 * MINUTE));
        context.register_timer("five-after", TimeDomain::EventTime, event_time + 5 * MINUTE);
        let key = context.key().to_vec();
        context.emit("sums", &key, format!("{}:{}", sum.count, sum.total).into_bytes());
        Ok(())
    }

    fn handle_timer(&mut self, context: &mut KeyContext<'_>, timer: &Timer) -> Result<(), StateError> {
        let key = context.key().to_vec();
        context.emit("fired", &key, timer.fire_at_us.to_string().into_bytes());
        Ok(())
    }
}

/// `inputs` (key, payload) as input records at offsets from `first_offset`.
pub fn batch(inputs: &[(Vec<u8>, Vec<u8>)], first_offset: i64) -> Vec<InputRecord<'_>> {
    inputs
        .iter()
        .enumerate()
        .map(|(n, (key, payload))| InputRecord {
            key,
            payload,
            offset: first_offset + n as i64,
            trace: None,
            timestamp_us: None,
        })
        .collect()
}

/// List and map state with per-entry TTLs: a processor that appends each value to a list (TTL 20
/// min) and keeps the latest value per parity in a map (TTL 40 min).
pub struct Collector;

impl StatefulProcessor for Collector {
    fn handle_record(
        &mut self,
        context: &mut KeyContext<'_>,
        record: &InputRecord<'_>,
    ) -> Result<(), StateError> {
        let (event_time, value) = parse(record.payload);
        context.observe_event_time(event_time);
        let item = Sum {
            total: value,
            count: 1,
        };
        context.list_append("values", &item, Some(event_time + 20 * MINUTE))?;
        let parity: &[u8] = if value % 2 == 0 { b"even" } else { b"odd" };
        context.map_put("latest", parity, &item, Some(event_time + 40 * MINUTE));
        Ok(())
    }

    fn handle_timer(&mut self, _: &mut KeyContext<'_>, _: &Timer) -> Result<(), StateError> {
        Ok(())
    }
}
