//! The worked example of docs/ENGINE.md ("writing a processor"), compiled and run by CI so the
//! guide cannot drift from the API: a processor that counts each flight's gate changes and, once
//! the flight has been quiet for two hours of event time, emits one summary and forgets the
//! flight.

use contrail_state::{
    EngineConfig, InputRecord, KeyContext, Shard, StateError, StatefulProcessor, TimeDomain, Timer,
};

const MINUTE: i64 = 60_000_000;

/// The state kept per flight: a protobuf message, so stored state can gain fields later.
#[derive(Clone, PartialEq, prost::Message)]
struct GateChanges {
    #[prost(uint32, tag = "1")]
    changes: u32,
    #[prost(string, tag = "2")]
    last_gate: String,
    #[prost(int64, tag = "3")]
    last_event_us: i64,
}

/// Input payload of this example: `"{event minute},{gate}"` (a real processor decodes protobuf).
fn parse(payload: &[u8]) -> Result<(i64, String), StateError> {
    let text = std::str::from_utf8(payload).map_err(|error| StateError::Processor(error.to_string()))?;
    let (minute, gate) = text
        .split_once(',')
        .ok_or_else(|| StateError::Processor(format!("not `minute,gate`: {text:?}")))?;
    let minute: i64 = minute
        .parse()
        .map_err(|_| StateError::Processor(format!("not a minute: {minute:?}")))?;
    Ok((minute * MINUTE, gate.to_owned()))
}

struct GateChangeSummary;

const STATE: &str = "gate-changes";
const QUIET: &str = "quiet";

impl StatefulProcessor for GateChangeSummary {
    fn handle_record(
        &mut self,
        context: &mut KeyContext<'_>,
        record: &InputRecord<'_>,
    ) -> Result<(), StateError> {
        let (event_us, gate) = parse(record.payload)?;
        // Event time drives the shard's watermark, and with it the event-time timers.
        context.observe_event_time(event_us);
        let mut state: GateChanges = context.get(STATE)?.unwrap_or_default();
        if !state.last_gate.is_empty() && state.last_gate != gate {
            state.changes += 1;
        }
        state.last_gate = gate;
        state.last_event_us = state.last_event_us.max(event_us);
        // Kept at most a day after the flight's last event, whatever happens to the timer.
        context.set(STATE, &state, Some(state.last_event_us + 24 * 60 * MINUTE));
        // One timer per name and key: registering again moves it.
        context.register_timer(QUIET, TimeDomain::EventTime, state.last_event_us + 120 * MINUTE);
        Ok(())
    }

    fn handle_timer(&mut self, context: &mut KeyContext<'_>, timer: &Timer) -> Result<(), StateError> {
        if timer.name != QUIET {
            return Ok(());
        }
        let Some(state) = context.get::<GateChanges>(STATE)? else {
            return Ok(());
        };
        let key = context.key().to_vec();
        let summary = format!(
            "{}: {} gate changes, last gate {}",
            String::from_utf8_lossy(&key),
            state.changes,
            state.last_gate
        );
        context.emit("gate-summaries", &key, summary.into_bytes());
        context.clear(STATE);
        Ok(())
    }
}

fn inputs(lines: &[(&'static str, &'static str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    lines
        .iter()
        .map(|(key, payload)| (key.as_bytes().to_vec(), payload.as_bytes().to_vec()))
        .collect()
}

/// Runs `records` through a fresh shard in batches split at `splits`, reopening the shard (as a
/// restarted process would) between batches; the summaries emitted.
fn summaries(records: &[(Vec<u8>, Vec<u8>)], splits: &[usize]) -> Vec<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = EngineConfig {
        allowed_lateness_us: 30 * MINUTE,
    };
    let mut out = Vec::new();
    let mut start = 0;
    for end in splits.iter().copied().chain([records.len()]) {
        let mut shard = Shard::open(&dir.path().join("shard-0"), 0).expect("open");
        let batch: Vec<InputRecord<'_>> = records[start..end]
            .iter()
            .enumerate()
            .map(|(index, (key, payload))| InputRecord {
                key,
                payload,
                offset: (start + index) as i64,
                trace: None,
                timestamp_us: None,
            })
            .collect();
        let result = shard
            .process_batch(&batch, &mut GateChangeSummary, &config, 0)
            .expect("batch commits");
        out.extend(
            result
                .outputs
                .into_iter()
                .map(|(_, output)| String::from_utf8(output.payload).expect("utf-8")),
        );
        start = end;
    }
    out
}

#[test]
fn the_guide_example_summarises_each_flight_once_it_is_quiet_whatever_the_batches() {
    let records = inputs(&[
        ("UA1545-2013-01-01-EWR", "600,C12"),
        ("B6101-2013-01-01-JFK", "605,4-7"),
        ("UA1545-2013-01-01-EWR", "610,C14"),
        ("UA1545-2013-01-01-EWR", "615,C14"),
        ("B6101-2013-01-01-JFK", "620,4-9"),
        ("UA1545-2013-01-01-EWR", "630,C9"),
        // Event time moves on (another flight): the watermark (max − 30 min) passes both flights'
        // last event + 120 min, so both timers fire after this record.
        ("DL2-2013-01-01-LGA", "790,B1"),
    ]);
    let expected = [
        "B6101-2013-01-01-JFK: 1 gate changes, last gate 4-9",
        "UA1545-2013-01-01-EWR: 2 gate changes, last gate C9",
    ];
    assert_eq!(summaries(&records, &[]), expected);
    // The same input in other batches, the shard reopened in between: the same outputs.
    for splits in [&[1, 4][..], &[6], &[2, 3, 5]] {
        assert_eq!(summaries(&records, splits), expected, "split at {splits:?}");
    }
}
