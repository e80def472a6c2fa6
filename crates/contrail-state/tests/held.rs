//! Held batches (`Shard::process_held`, `Shard::persist`): state kept in memory between commit
//! points, no outbox. Against the per-batch commit (`Shard::process_batch`) on the same input:
//! the same outputs and the same state, whatever the commit points; a crash between commit points
//! (the shard dropped unpersisted) reopens at the last commit point and regenerates the lost
//! batches' outputs byte for byte.

use contrail_state::{InputRecord, KeyContext, Shard, StateError, StatefulProcessor, TimeDomain, Timer};
use proptest::prelude::*;

mod support;
use support::{CONFIG, Collector, Sum, Summer, batch};

/// [`Summer`], then for each record it counts [`Collector`] (a list and a map with TTLs per entry),
/// emitting how many entries each holds.
struct Mixed;

impl StatefulProcessor for Mixed {
    fn handle_record(
        &mut self,
        context: &mut KeyContext<'_>,
        record: &InputRecord<'_>,
    ) -> Result<(), StateError> {
        let before = context.get::<Sum>("sum")?.map_or(0, |sum| sum.count);
        Summer.handle_record(context, record)?;
        if context.get::<Sum>("sum")?.map_or(0, |sum| sum.count) == before {
            return Ok(()); // a duplicate
        }
        Collector.handle_record(context, record)?;
        let listed = context.list::<Sum>("values")?.len();
        let mapped = context.map_entries::<Sum>("latest")?.len();
        let key = context.key().to_vec();
        context.emit("lists", &key, format!("{listed}:{mapped}").into_bytes());
        Ok(())
    }

    fn handle_timer(&mut self, context: &mut KeyContext<'_>, timer: &Timer) -> Result<(), StateError> {
        Summer.handle_timer(context, timer)
    }
}

/// One output as compared: topic, key, payload.
type Output = (String, Vec<u8>, Vec<u8>);

fn outputs(result: contrail_state::BatchResult) -> Vec<Output> {
    result
        .outputs
        .into_iter()
        .map(|(_, record)| (record.topic, record.key, record.payload))
        .collect()
}

/// Everything a key's state shows: its sum, list, map and timers.
type KeyState = (Option<Sum>, Vec<Sum>, Vec<(Vec<u8>, Sum)>, Vec<Timer>);

fn state_of(shard: &Shard, key: &[u8]) -> KeyState {
    contrail_state::inspect(shard, key, CONFIG.allowed_lateness_us, |context| {
        (
            context.get("sum").expect("sum"),
            context.list("values").expect("list"),
            context.map_entries("latest").expect("map"),
            context.timers(),
        )
    })
}

const KEYS: [&str; 4] = ["a", "b", "c", "d"];

/// Batches of the input by `cuts`: (first index, end index).
fn windows(len: usize, cuts: Vec<usize>) -> Vec<(usize, usize)> {
    let mut boundaries: Vec<usize> = cuts.into_iter().filter(|cut| *cut < len).collect();
    boundaries.extend([0, len]);
    boundaries.sort_unstable();
    boundaries.dedup();
    boundaries.windows(2).map(|pair| (pair[0], pair[1])).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn held_batches_equal_per_batch_commits_and_a_crash_regenerates_the_same_outputs(
        inputs in prop::collection::vec((0usize..4, 0i64..120, 1i64..9), 1..60),
        cuts in prop::collection::vec(0usize..60, 0..10),
        persist_after in prop::collection::vec(any::<bool>(), 12),
        crash_after in prop::option::of(0usize..12),
    ) {
        let all: Vec<(Vec<u8>, Vec<u8>)> = inputs
            .iter()
            .map(|(key, minute, value)| (KEYS[*key].as_bytes().to_vec(), format!("{minute},{value}").into_bytes()))
            .collect();
        let windows = windows(all.len(), cuts);
        let dir = tempfile::tempdir().expect("tempdir");

        // Per-batch commits.
        let mut committed = Shard::open(&dir.path().join("committed"), 0).expect("open");
        let mut expected = Vec::new();
        for (start, end) in &windows {
            let result = committed
                .process_batch(&batch(&all[*start..*end], *start as i64), &mut Mixed, &CONFIG, 0)
                .expect("batch");
            expected.extend(outputs(result));
        }

        // Held batches, persisted where `persist_after` says; at `crash_after`, dropped unpersisted.
        let path = dir.path().join("held");
        let mut held = Shard::open(&path, 0).expect("open");
        // Per input offset, the outputs the held run emitted when it first processed it.
        let mut emitted: Vec<Vec<Output>> = vec![Vec::new(); all.len()];
        let mut crashed = false;
        let mut processed_until = 0;
        let mut index = 0;
        while index < windows.len() {
            let (start, end) = windows[index];
            let result = held
                .process_held(&batch(&all[start..end], start as i64), &mut Mixed, &CONFIG)
                .expect("held batch");
            prop_assert!(held.outbox().expect("outbox").is_empty(), "a held batch writes no outbox");
            let sequences: Vec<u64> = result.outputs.iter().map(|(sequence, _)| *sequence).collect();
            let produced = outputs(result);
            if end > processed_until {
                // Outputs of a batch belong to its last record for this comparison.
                emitted[end - 1] = produced;
                processed_until = end;
            } else {
                // Regenerated after the crash: byte for byte what was emitted first.
                let first: Vec<Output> = emitted[start..end].iter().flatten().cloned().collect();
                prop_assert_eq!(&produced, &first, "batch {}..{} regenerated", start, end);
            }
            if persist_after[index % persist_after.len()] {
                if let Some((last, rest)) = sequences.split_last() {
                    held.acknowledge(rest).expect("acknowledge");
                    let refused = held.persist();
                    prop_assert!(
                        matches!(refused, Err(StateError::NotAcknowledged(1))),
                        "a commit point waits for every held output: {:?}", refused
                    );
                    held.acknowledge(&[*last]).expect("acknowledge");
                }
                held.persist().expect("persist");
                prop_assert_eq!(held.held().batches, 0);
                prop_assert_eq!(held.persisted_progress(), held.progress());
            }
            else {
                held.acknowledge(&sequences).expect("acknowledge");
            }
            if !crashed && crash_after == Some(index) {
                crashed = true;
                let resume = held.persisted_progress().next_offset;
                drop(held);
                held = Shard::open(&path, 0).expect("reopen");
                prop_assert_eq!(held.progress().next_offset, resume, "reopened at the last commit point");
                // Resume at the window holding the persisted offset (commit points are at window ends).
                let next = resume.unwrap_or(0) as usize;
                index = windows.iter().position(|(start, _)| *start == next).unwrap_or(windows.len());
                continue;
            }
            index += 1;
        }
        held.persist().expect("persist");
        let first_emission: Vec<Output> = emitted.into_iter().flatten().collect();
        prop_assert_eq!(&first_emission, &expected, "outputs equal the per-batch commits'");
        for key in KEYS {
            prop_assert_eq!(state_of(&held, key.as_bytes()), state_of(&committed, key.as_bytes()));
        }
        prop_assert_eq!(held.progress(), committed.progress());
        drop(held);
        let reopened = Shard::open(&path, 0).expect("reopen");
        for key in KEYS {
            prop_assert_eq!(state_of(&reopened, key.as_bytes()), state_of(&committed, key.as_bytes()), "after a reopen");
        }
        prop_assert_eq!(reopened.progress(), committed.progress());
    }
}

/// Counts processing-time timer firings.
struct Clocked;

impl StatefulProcessor for Clocked {
    fn handle_record(
        &mut self,
        context: &mut KeyContext<'_>,
        record: &InputRecord<'_>,
    ) -> Result<(), StateError> {
        context.observe_event_time(0);
        context.register_timer("poll", TimeDomain::ProcessingTime, record.offset * 10);
        Ok(())
    }

    fn handle_timer(&mut self, context: &mut KeyContext<'_>, timer: &Timer) -> Result<(), StateError> {
        let key = context.key().to_vec();
        context.emit("polled", &key, timer.fire_at_us.to_string().into_bytes());
        Ok(())
    }
}

#[test]
fn processing_time_timers_wait_for_a_committed_batch_and_its_outbox() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut shard = Shard::open(&dir.path().join("s"), 0).expect("open");
    let inputs = vec![(b"k".to_vec(), b"x".to_vec())];
    let result = shard
        .process_held(&batch(&inputs, 1), &mut Clocked, &CONFIG)
        .expect("held");
    assert_eq!(
        result.timers_fired, 0,
        "a held batch fires no processing-time timer"
    );
    assert_eq!(shard.held().records, 1);
    let result = shard
        .process_batch(&[], &mut Clocked, &CONFIG, 1_000)
        .expect("batch");
    assert_eq!(result.timers_fired, 1);
    assert_eq!(
        shard.held().batches,
        0,
        "the committed batch persisted what was held"
    );
    assert_eq!(
        shard.outbox().expect("outbox").len(),
        1,
        "its output is in the outbox"
    );
    drop(shard);
    let shard = Shard::open(&dir.path().join("s"), 0).expect("reopen");
    assert_eq!(shard.progress().next_offset, Some(2));
    assert_eq!(shard.outbox().expect("outbox").len(), 1);
}
