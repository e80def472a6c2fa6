//! The engine on real RocksDB shards: atomic commits, reopen, determinism across batch boundaries,
//! timers in event-time order, TTL eviction, dedup expiry, and checkpoint → restore.

use std::path::Path;

use contrail_state::checkpoints::CheckpointStore;
use contrail_state::protocol::{self, LocalShard, Manifest, RestorePlan};
use contrail_state::{InputRecord, Shard, StatefulProcessor};
use proptest::prelude::*;

mod support;
use support::{CONFIG, Collector, MINUTE, Sum, Summer, batch};

fn records(inputs: &[(&str, String)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    inputs
        .iter()
        .map(|(key, payload)| (key.as_bytes().to_vec(), payload.clone().into_bytes()))
        .collect()
}

/// Runs `inputs` (offsets from `first_offset`) through `processor` as one batch.
fn run_with<P: StatefulProcessor>(
    shard: &mut Shard,
    inputs: &[(Vec<u8>, Vec<u8>)],
    first_offset: i64,
    processor: &mut P,
) -> contrail_state::BatchResult {
    shard
        .process_batch(&batch(inputs, first_offset), processor, &CONFIG, 0)
        .expect("batch")
}

fn run(shard: &mut Shard, inputs: &[(Vec<u8>, Vec<u8>)], first_offset: i64) -> Vec<(String, String, String)> {
    run_with(shard, inputs, first_offset, &mut Summer)
        .outputs
        .into_iter()
        .map(|(_, record)| {
            (
                record.topic,
                String::from_utf8(record.key).expect("utf8"),
                String::from_utf8(record.payload).expect("utf8"),
            )
        })
        .collect()
}

fn sum_of(shard: &Shard, key: &str) -> Option<Sum> {
    contrail_state::inspect(shard, key.as_bytes(), CONFIG.allowed_lateness_us, |context| {
        context.get("sum")
    })
    .expect("read")
}

#[test]
fn a_batch_commits_state_outbox_and_offset_together_and_survives_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("shard-0");
    {
        let mut shard = Shard::open(&path, 0).expect("open");
        assert_eq!(shard.progress().next_offset, None);
        let outputs = run(
            &mut shard,
            &records(&[("a", "0,5".into()), ("b", "1,7".into()), ("a", "2,1".into())]),
            40,
        );
        assert_eq!(outputs.len(), 3);
        assert_eq!(outputs[2], ("sums".into(), "a".into(), "2:6".into()));
    }
    let mut shard = Shard::open(&path, 0).expect("reopen");
    assert_eq!(
        shard.progress().next_offset,
        Some(43),
        "the offset after the last record"
    );
    assert_eq!(sum_of(&shard, "a"), Some(Sum { total: 6, count: 2 }));
    let outbox = shard.outbox().expect("outbox");
    assert_eq!(outbox.len(), 3, "unacknowledged outputs survive");
    shard.acknowledge(&[outbox[0].0, outbox[1].0]).expect("ack");
    assert_eq!(shard.outbox().expect("outbox").len(), 1);
}

/// An output as (topic, key, trace context).
type Emitted<'a> = (&'a str, &'a [u8], Option<&'a [u8]>);

/// An output carries the trace context of the record it was emitted for — also when it is read
/// back from the outbox after a reopen (the re-send after a crash) — and a timer's output carries
/// none (no record caused it).
#[test]
fn outputs_carry_their_records_trace_context_through_the_outbox() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("shard-0");
    let traced = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".as_slice();
    {
        let mut shard = Shard::open(&path, 0).expect("open");
        let batch = [
            InputRecord {
                key: b"a",
                payload: b"0,5",
                offset: 0,
                trace: Some(traced),
                timestamp_us: None,
            },
            InputRecord {
                key: b"b",
                payload: b"20,1",
                offset: 1,
                trace: None,
                timestamp_us: None,
            },
        ];
        let result = shard
            .process_batch(&batch, &mut Summer, &CONFIG, 0)
            .expect("batch");
        let by_topic: Vec<Emitted<'_>> = result
            .outputs
            .iter()
            .map(|(_, record)| {
                (
                    record.topic.as_str(),
                    record.key.as_slice(),
                    record.trace.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            by_topic,
            [
                ("sums", b"a".as_slice(), Some(traced)),
                ("sums", b"b".as_slice(), None),
                // a's five-minute timer fires when b moves the watermark past it.
                ("fired", b"a".as_slice(), None),
            ]
        );
    }
    let shard = Shard::open(&path, 0).expect("reopen");
    let outbox = shard.outbox().expect("outbox");
    assert_eq!(outbox.len(), 3, "nothing acknowledged yet");
    assert_eq!(outbox[0].1.trace.as_deref(), Some(traced));
    assert_eq!(
        shard
            .outbox_record(outbox[0].0)
            .expect("read")
            .and_then(|record| record.trace),
        Some(traced.to_vec())
    );
    assert!(outbox[1..].iter().all(|(_, record)| record.trace.is_none()));
}

#[test]
fn timers_fire_in_event_time_order_when_the_watermark_passes_and_ttl_evicts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut shard = Shard::open(&dir.path().join("s"), 0).expect("open");
    run(
        &mut shard,
        &records(&[("a", "0,1".into()), ("b", "2,1".into())]),
        0,
    );
    // Watermark = 14 - 10 = 4 min: nothing due yet (timers at 5 and 7).
    let outputs = run(&mut shard, &records(&[("c", "14,1".into())]), 2);
    assert!(outputs.iter().all(|(topic, _, _)| topic == "sums"), "{outputs:?}");
    // Watermark = 18 - 10 = 8: both fire, a's (5 min) before b's (7 min).
    let outputs = run(&mut shard, &records(&[("c", "18,1".into())]), 3);
    let fired: Vec<(String, String)> = outputs
        .iter()
        .filter(|o| o.0 == "fired")
        .map(|o| (o.1.clone(), o.2.clone()))
        .collect();
    assert_eq!(
        fired,
        [
            ("a".into(), (5 * MINUTE).to_string()),
            ("b".into(), (7 * MINUTE).to_string())
        ]
    );
    assert_eq!(sum_of(&shard, "a"), Some(Sum { total: 1, count: 1 }));
    // a's sum expires 60 min after its event: watermark 71 > 60 evicts it.
    run(&mut shard, &records(&[("c", "81,1".into())]), 4);
    assert_eq!(sum_of(&shard, "a"), None, "evicted by TTL");
    assert!(sum_of(&shard, "c").is_some());
}

/// Opening a large shard is mostly loading its timers; an open given up meanwhile (the shard's
/// assignment was revoked) stops there, writes nothing, and a later open has every timer.
#[test]
fn an_open_given_up_while_its_timers_load_writes_nothing_and_a_later_open_fires_every_timer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s");
    let never_opened = dir.path().join("never");
    assert!(
        Shard::open_unless(&never_opened, 0, None, &|| true)
            .expect("open")
            .is_none()
            && !never_opened.exists(),
        "given up before it starts: no directory made"
    );
    let keys = 3 * contrail_state::GIVE_UP_EVERY + 7;
    {
        let mut shard = Shard::open(&path, 0).expect("open");
        let inputs: Vec<(String, String)> = (0..keys).map(|n| (format!("k{n}"), "0,1".to_owned())).collect();
        let inputs: Vec<(&str, String)> = inputs
            .iter()
            .map(|(key, payload)| (key.as_str(), payload.clone()))
            .collect();
        run(&mut shard, &records(&inputs), 0);
    }
    let asked = std::cell::Cell::new(0);
    let opened = Shard::open_unless(&path, 0, None, &|| {
        asked.set(asked.get() + 1);
        asked.get() == 3
    })
    .expect("open");
    assert!(opened.is_none(), "given up at the third question");
    assert_eq!(
        asked.get(),
        3,
        "asked before the open and every GIVE_UP_EVERY timers"
    );

    let mut shard = Shard::open_unless(&path, 0, None, &|| false)
        .expect("open")
        .expect("not given up");
    assert_eq!(shard.progress().next_offset, Some(keys as i64));
    // Watermark 100 - 10 min passes every key's timer (5 min): each fires once.
    let outputs = run(&mut shard, &records(&[("late", "100,1".into())]), keys as i64);
    let mut fired: Vec<String> = outputs
        .into_iter()
        .filter(|(topic, _, _)| topic == "fired")
        .map(|(_, key, _)| key)
        .collect();
    assert_eq!(
        fired.len(),
        keys,
        "one timer fired per key after the given-up open"
    );
    fired.sort_unstable();
    fired.dedup();
    assert_eq!(fired.len(), keys, "every key's timer fired, none twice");
}

#[test]
fn dedup_entries_expire_after_their_ttl() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut shard = Shard::open(&dir.path().join("s"), 0).expect("open");
    let outputs = run(
        &mut shard,
        &records(&[("a", "0,5".into()), ("a", "0,5".into())]),
        0,
    );
    assert_eq!(
        outputs.iter().filter(|o| o.0 == "sums").count(),
        1,
        "the duplicate was dropped"
    );
    // Dedup entry lives until 30 min; the watermark (100 - 10) passes it and a new "0,5" counts
    // again (the sum itself expired too).
    run(&mut shard, &records(&[("z", "100,1".into())]), 2);
    let outputs = run(&mut shard, &records(&[("a", "0,5".into())]), 3);
    assert_eq!(outputs.iter().filter(|o| o.0 == "sums").count(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Reprocessing the same input with different batch boundaries — what happens after a crash —
    /// yields the same outputs in the same order and the same state. The split run also closes
    /// and reopens its shard at every boundary, so the in-memory timer indexes rebuilt on open must
    /// know every committed timer (a timer moved after a reopen fires once, at its new time).
    #[test]
    fn outputs_do_not_depend_on_batch_boundaries(
        inputs in prop::collection::vec((0usize..4, 0i64..120, 1i64..9), 1..40),
        cuts in prop::collection::vec(0usize..40, 0..6),
    ) {
        let keys = ["a", "b", "c", "d"];
        let all: Vec<(Vec<u8>, Vec<u8>)> = inputs
            .iter()
            .map(|(key, minute, value)| (keys[*key].as_bytes().to_vec(), format!("{minute},{value}").into_bytes()))
            .collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut whole = Shard::open(&dir.path().join("whole"), 0).expect("open");
        let expected = run(&mut whole, &all, 0);
        let mut split = Shard::open(&dir.path().join("split"), 0).expect("open");
        let mut boundaries: Vec<usize> = cuts.into_iter().filter(|cut| *cut < all.len()).collect();
        boundaries.push(0);
        boundaries.push(all.len());
        boundaries.sort_unstable();
        boundaries.dedup();
        let mut outputs = Vec::new();
        for window in boundaries.windows(2) {
            outputs.extend(run(&mut split, &all[window[0]..window[1]], window[0] as i64));
            drop(split);
            split = Shard::open(&dir.path().join("split"), 0).expect("reopen");
        }
        prop_assert_eq!(outputs, expected);
        for key in keys {
            prop_assert_eq!(sum_of(&split, key), sum_of(&whole, key));
        }
        prop_assert_eq!(split.progress(), whole.progress());
    }
}

fn contents(shard: &Shard) -> Vec<(String, Option<Sum>)> {
    ["a", "b", "c"]
        .iter()
        .map(|key| (key.to_string(), sum_of(shard, key)))
        .collect()
}

#[tokio::test]
async fn a_checkpoint_restores_a_lost_shard_with_its_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = CheckpointStore::local(&dir.path().join("checkpoints")).expect("store");
    let shard_path = dir.path().join("state/shard-3");
    let mut shard = Shard::open(&shard_path, 3).expect("open");
    run(
        &mut shard,
        &records(&[("a", "0,5".into()), ("b", "1,7".into()), ("c", "2,1".into())]),
        100,
    );
    let local_checkpoint = dir.path().join("tmp-checkpoint");
    shard.checkpoint(&local_checkpoint).expect("checkpoint");
    let next_offset = shard.progress().next_offset.expect("offset");
    let entry = store
        .upload_shard(1, 3, next_offset, &local_checkpoint)
        .await
        .expect("upload");
    let manifest = Manifest {
        epoch: 1,
        partitions: [3].into(),
        shards: [(3, entry)].into(),
        created_at_us: 0,
    };
    store.write_manifest(&manifest).await.expect("manifest");
    // An incomplete epoch must be refused.
    let incomplete = Manifest {
        epoch: 2,
        partitions: [3, 4].into(),
        ..manifest.clone()
    };
    assert!(store.write_manifest(&incomplete).await.is_err());
    let before = contents(&shard);
    // Later changes are not in the checkpoint.
    run(&mut shard, &records(&[("a", "3,100".into())]), 103);
    drop(shard);

    // The pod is gone: its volume with it.
    std::fs::remove_dir_all(&shard_path).expect("delete shard");
    let manifests = store.manifests().await.expect("manifests");
    let local = if Path::new(&shard_path).exists() {
        LocalShard::Present { next_offset: None }
    } else {
        LocalShard::Missing
    };
    let plan = protocol::restore_plan(local, &manifests, 3);
    let RestorePlan::Restore { epoch, checkpoint } = plan else {
        panic!("expected a restore, got {plan:?}")
    };
    assert_eq!(epoch, 1);
    store
        .download_shard(&checkpoint, &shard_path)
        .await
        .expect("download");
    let restored = Shard::open(&shard_path, 3).expect("open restored");
    assert_eq!(
        restored.progress().next_offset,
        Some(103),
        "resume right after the checkpointed batch"
    );
    assert_eq!(contents(&restored), before);

    // Garbage collection keeps the newest complete epoch.
    assert_eq!(store.epochs().await.expect("epochs"), [1].into());
    let complete = manifests.iter().map(|m| m.epoch).collect();
    assert!(protocol::garbage(&store.epochs().await.expect("epochs"), &complete, 1).is_empty());
    // Deleting an epoch removes it from the listing (no empty directory left behind).
    store.delete_epoch(1).await.expect("delete");
    assert!(store.epochs().await.expect("epochs").is_empty());
    assert!(store.manifests().await.expect("manifests").is_empty());
}

fn collect(shard: &mut Shard, inputs: &[(&str, String)], first_offset: i64) {
    run_with(shard, &records(inputs), first_offset, &mut Collector);
}

fn list_and_map(shard: &Shard, key: &str) -> (Vec<i64>, Vec<(String, i64)>) {
    contrail_state::inspect(shard, key.as_bytes(), CONFIG.allowed_lateness_us, |context| {
        let list: Vec<Sum> = context.list("values").expect("list");
        let map: Vec<(Vec<u8>, Sum)> = context.map_entries("latest").expect("map");
        (
            list.iter().map(|item| item.total).collect(),
            map.into_iter()
                .map(|(key, item)| (String::from_utf8(key).expect("utf8"), item.total))
                .collect(),
        )
    })
}

#[test]
fn list_and_map_state_keep_order_and_expire_per_entry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s");
    let mut shard = Shard::open(&path, 0).expect("open");
    collect(
        &mut shard,
        &[("a", "0,1".into()), ("a", "5,2".into()), ("a", "10,3".into())],
        0,
    );
    assert_eq!(
        list_and_map(&shard, "a"),
        (vec![1, 2, 3], vec![("even".into(), 2), ("odd".into(), 3)])
    );
    // Watermark 36 - 10 = 26 min: list items of minutes 0 and 5 (expiring at 20, 25) are gone, the
    // map entries (expiring at 45, 50) stay; the new item is appended after the old ones.
    collect(&mut shard, &[("a", "36,5".into())], 3);
    assert_eq!(
        list_and_map(&shard, "a"),
        (vec![3, 5], vec![("even".into(), 2), ("odd".into(), 5)])
    );
    drop(shard);
    let mut shard = Shard::open(&path, 0).expect("reopen");
    assert_eq!(
        list_and_map(&shard, "a").0,
        vec![3, 5],
        "list state survives reopen"
    );
    // Watermark 90 - 10 = 80: everything of "a" (last expiry: 36 + 40 = 76) was evicted.
    collect(&mut shard, &[("z", "90,1".into())], 4);
    assert_eq!(list_and_map(&shard, "a"), (vec![], vec![]));
}

/// The checkpoint protocol takes RocksDB checkpoints on another thread while the processing
/// thread keeps committing: each must hold the shard exactly at a batch boundary, with the offset
/// it reports, and the state of exactly the records before that offset.
#[test]
fn checkpoints_taken_while_batches_commit_hold_the_shard_at_a_batch_boundary() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    const BATCH: i64 = 7;
    const KEYS: i64 = 5;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut shard = Shard::open(&dir.path().join("shard-0"), 0).expect("open");
    let checkpointer = shard.checkpointer();
    let checkpoints = dir.path().join("checkpoints");
    std::fs::create_dir_all(&checkpoints).expect("checkpoint directory");
    let committed = Arc::new(AtomicI64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let taking = std::thread::spawn({
        let (committed, done) = (Arc::clone(&committed), Arc::clone(&done));
        move || {
            // Start once batches are committing; they go on until the last checkpoint is taken.
            while committed.load(Ordering::SeqCst) < 3 {
                std::thread::yield_now();
            }
            let taken: Vec<_> = (0..12)
                .map(|n| {
                    let target = checkpoints.join(format!("c{n}"));
                    let offset = checkpointer.create(&target).expect("checkpoint");
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    (target, offset)
                })
                .collect();
            done.store(true, Ordering::SeqCst);
            taken
        }
    });
    // Every record has a distinct payload (no dedup), all at minute 0 (nothing expires).
    let mut batches = 0;
    while !done.load(Ordering::SeqCst) {
        let first = batches * BATCH;
        let inputs: Vec<(Vec<u8>, Vec<u8>)> = (first..first + BATCH)
            .map(|offset| {
                (
                    format!("k{}", offset % KEYS).into_bytes(),
                    format!("0,{offset}").into_bytes(),
                )
            })
            .collect();
        run(&mut shard, &inputs, first);
        batches += 1;
        committed.store(batches, Ordering::SeqCst);
    }
    let taken = taking.join().expect("checkpoint thread");
    drop(shard);
    let mut offsets_seen = std::collections::BTreeSet::new();
    for (target, offset) in taken {
        let restored = Shard::open(&target, 0).expect("open checkpoint");
        assert_eq!(restored.progress().next_offset, offset, "{}", target.display());
        let next = offset.expect("batches were committed before the first checkpoint");
        assert_eq!(next % BATCH, 0, "offset {next} is not a batch boundary");
        assert!(next >= 3 * BATCH && next <= batches * BATCH, "offset {next}");
        offsets_seen.insert(next);
        for key in 0..KEYS {
            // Independent of the engine: the records before `next` with this key.
            let offsets: Vec<i64> = (0..next).filter(|offset| offset % KEYS == key).collect();
            let expected = (!offsets.is_empty()).then(|| Sum {
                total: offsets.iter().sum(),
                count: offsets.len() as u64,
            });
            assert_eq!(
                sum_of(&restored, &format!("k{key}")),
                expected,
                "k{key} at {next}"
            );
        }
    }
    assert!(
        offsets_seen.len() > 1,
        "batches committed while the checkpoints were taken: {offsets_seen:?}"
    );
}

#[tokio::test]
async fn a_second_checkpoint_reuses_unchanged_sst_files_and_restores_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = CheckpointStore::local(&dir.path().join("checkpoints")).expect("store");
    let shard_path = dir.path().join("state/shard-0");
    let mut shard = Shard::open(&shard_path, 0).expect("open");
    run(
        &mut shard,
        &records(&[("a", "0,5".into()), ("b", "1,7".into())]),
        0,
    );
    shard.checkpoint(&dir.path().join("c1")).expect("checkpoint 1");
    let first = store
        .upload_shard_reusing(1, 0, 2, &dir.path().join("c1"), None)
        .await
        .expect("upload 1");
    assert_eq!(first.reused, 0);
    run(&mut shard, &records(&[("c", "2,1".into())]), 2);
    shard.checkpoint(&dir.path().join("c2")).expect("checkpoint 2");
    let second = store
        .upload_shard_reusing(2, 0, 3, &dir.path().join("c2"), Some(&first))
        .await
        .expect("upload 2");
    assert!(
        second.reused >= 1,
        "the first checkpoint's SST is copied, not uploaded: {second:?}"
    );
    let expected = contents(&shard);
    drop(shard);
    // Epoch 1 is collected; epoch 2 must restore on its own.
    store.delete_epoch(1).await.expect("collect epoch 1");
    std::fs::remove_dir_all(&shard_path).expect("lose the volume");
    store
        .download_shard(&second.checkpoint, &shard_path)
        .await
        .expect("download");
    let restored = Shard::open(&shard_path, 0).expect("open restored");
    assert_eq!(contents(&restored), expected);
    assert_eq!(restored.progress().next_offset, Some(3));
}
