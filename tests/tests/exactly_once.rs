//! Exactly-once outside the envelope of our own generators (docs/CONTRACT.md, "Version",
//! "Lifetime" and "Guarantees across restarts"): feeds shaped the way real sources and real
//! failures shape them.
//!
//! - A correction for a flight days after its last event (its state expired) is late (`expired`):
//!   the flight's versions never restart.
//! - A dedup-state shard restored from an old checkpoint regenerates far more than any window of
//!   offsets: every Delta table still holds one row per identity.
//! - Event ids unique per flight only: two flights' events with the same ids are all archived.
//!
//! Expectations come from the oracle of `contrail_testkit::dedup` (docs/CONTRACT.md's
//! "Processing in dedup-state" re-derived from the raw topic's records) and the tables are read
//! by the independent reader.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use contrail_flightdata::ReplayConfig;
use contrail_proto::v1::{EventData, EventType, OperationalEvent};
use contrail_testkit::cosmos::CosmosStage;
use contrail_testkit::dedup::{
    DedupOptions, DedupTopics, DedupUnderTest, Expected, OracleRules, check_outputs, delta_identities,
    expect, produce_events, raw_records, realistic_feed, replay_events, start_dedup_state,
};
use contrail_testkit::delta::{TableReport, verify_tables};
use contrail_testkit::{
    create_topics, quiescent_ends, read_topic, settled_ends, shared_broker, test_dir, unique,
};

/// Every topic of a dedup-state deployment, created with one partition (one shard, one topic
/// partition per output: copies of a restored shard land in the same partition as the originals).
fn one_partition_topics(brokers: &str) -> DedupTopics {
    let topics = DedupTopics::unique();
    let names = [
        &topics.raw,
        &topics.curated,
        &topics.accepted,
        &topics.late,
        &topics.alerts,
        &topics.dlq,
    ];
    let names: Vec<&str> = names.iter().map(|name| name.as_str()).collect();
    create_topics(brokers, &names, 1).expect("topics");
    topics
}

/// dedup-state on `topics` with checkpoints only on request.
fn dedup_state(brokers: &str, topics: &DedupTopics, dir: &Path) -> DedupUnderTest {
    let group = unique("eo");
    start_dedup_state(DedupOptions {
        extra_env: vec![
            ("CONTRAIL_CHECKPOINT__INTERVAL_MS".into(), "3600000".into()),
            ("CONTRAIL_GROUP__STATIC_MEMBERSHIP".into(), "true".into()),
        ],
        ..DedupOptions::single(brokers, topics, &group, dir)
    })
    .expect("dedup-state starts")
}

/// delta-archiver reading dedup-state's four archived outputs (alerts included) into tables under `root`.
fn archiver(brokers: &str, topics: &DedupTopics, root: &Path, dir: &Path) -> CosmosStage {
    let env = [
        ("CONTRAIL_KAFKA__BROKERS", brokers.to_owned()),
        ("CONTRAIL_TOPICS__ACCEPTED", topics.accepted.clone()),
        ("CONTRAIL_TOPICS__CURATED", topics.curated.clone()),
        ("CONTRAIL_TOPICS__LATE", topics.late.clone()),
        ("CONTRAIL_TOPICS__CHANGES", String::new()),
        ("CONTRAIL_TOPICS__ALERTS", topics.alerts.clone()),
        ("CONTRAIL_TOPICS__DLQ", format!("{}.archiver", topics.dlq)),
        ("CONTRAIL_DELTA_ROOT", root.display().to_string()),
        ("CONTRAIL_GROUP__ID", unique("eo-archiver")),
        ("CONTRAIL_GROUP__SESSION_TIMEOUT_MS", "6000".to_owned()),
        ("CONTRAIL_GROUP__STATIC_MEMBERSHIP", "true".to_owned()),
        ("CONTRAIL_INSTANCE", "delta-archiver-0".to_owned()),
        ("CONTRAIL_MAINTENANCE__ENABLED", "false".to_owned()),
        ("CONTRAIL_BATCH__MAX_LATENCY_MS", "1000".to_owned()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value))
    .collect();
    CosmosStage::start("delta-archiver", env, dir).expect("delta-archiver starts")
}

/// The oracle's expectation from everything on the raw topic.
fn expectation(brokers: &str, topics: &DedupTopics, raw_count: usize) -> (Expected, usize) {
    let raw =
        raw_records(&read_topic(brokers, &topics.raw, raw_count, Duration::from_secs(120)).expect("raw"));
    assert_eq!(raw.len(), raw_count, "every produced event is on the raw topic");
    let expected = expect(&raw, OracleRules::default());
    assert!(
        expected.restarted.is_empty(),
        "no flight of these feeds outlives its record"
    );
    let accepted = expected.accepted.values().map(Vec::len).sum();
    (expected, accepted)
}

/// dedup-state's outputs against the oracle.
fn check_dedup_outputs(brokers: &str, topics: &DedupTopics, expected: &Expected, accepted: usize) {
    let read = |topic: &str, at_least: usize| {
        read_topic(brokers, topic, at_least, Duration::from_secs(120)).expect(topic)
    };
    let problems = check_outputs(
        expected,
        &read(&topics.curated, accepted),
        &read(&topics.accepted, accepted),
        &read(&topics.late, expected.late.len()),
        &read(&topics.alerts, expected.alert_records()),
    );
    assert!(
        problems.is_empty(),
        "{} violations (first 10):\n{}",
        problems.len(),
        problems.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// Waits until the archiver committed every partition of the four topics up to their ends
/// (dedup-state is caught up: nothing more is produced; the late and alert topics may be empty).
fn wait_archived(stage: &mut CosmosStage, brokers: &str, topics: &DedupTopics) {
    let mut ends = BTreeMap::new();
    for topic in [&topics.accepted, &topics.curated, &topics.late, &topics.alerts] {
        for (partition, end) in settled_ends(brokers, topic, Duration::from_secs(2)).expect(topic) {
            ends.insert((topic.clone(), partition), end);
        }
    }
    stage
        .wait_positions(&ends, Duration::from_secs(600))
        .expect("archived up to the topics' ends");
}

/// Reads the tables with the independent reader: one row per expected identity, none missing,
/// none unexpected.
fn assert_one_row_each(root: &Path, work: &Path, expected: &Expected) -> BTreeMap<String, TableReport> {
    let reports =
        verify_tables(root, work, &delta_identities(expected), &BTreeMap::new()).expect("independent reader");
    for (table, report) in &reports {
        println!("{table}: {report:?}");
        assert_eq!(
            report.missing, 0,
            "{table}: missing, e.g. {:?}",
            report.missing_sample
        );
        assert_eq!(
            report.unexpected, 0,
            "{table}: unexpected, e.g. {:?}",
            report.unexpected_sample
        );
        assert_eq!(report.rows, report.distinct, "{table}: an identity stored twice");
    }
    reports
}

/// The versions on the curated topic, per flight, in topic order.
fn curated_versions(brokers: &str, topics: &DedupTopics, accepted: usize) -> BTreeMap<String, Vec<u64>> {
    use prost::Message as _;
    use rdkafka::Message as _;
    let states = read_topic(brokers, &topics.curated, accepted, Duration::from_secs(60)).expect("curated");
    let mut versions: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for message in &states {
        let state =
            contrail_proto::v1::FlightState::decode(message.payload().unwrap_or_default()).expect("state");
        versions.entry(state.flight_key).or_default().push(state.version);
    }
    versions
}

fn no_duplicates() -> ReplayConfig {
    ReplayConfig {
        duplicate_rate: 0.0,
        straggler_rate: 0.0,
        ..ReplayConfig::default()
    }
}

/// A flight's lifetime (docs/CONTRACT.md): a DELAYED correction three days after its flight —
/// the shard watermark past the flight's horizon (48 h after its service date's end), its record
/// still kept — is late (`expired`) and changes nothing: no version 1 of a second life, on the
/// curated topic or anywhere after it.
#[test]
fn a_correction_days_after_a_flight_expired_is_late_and_its_versions_never_restart() {
    let broker = shared_broker();
    let topics = one_partition_topics(&broker.address);
    let dir = test_dir("eo-expired");
    // A real flight of 1 January, then the flights of 3 January in the same partition: the shard
    // watermark moves past the flight's horizon (state_ttl after the end of 1 January, or after
    // its last event if later) but not past its record's expiry (dedup_ttl after the same), so
    // the flight is expired and still readable when its correction arrives.
    let first_day = replay_events((1, 1), (1, 1), no_duplicates());
    let flight_key = first_day[0].flight_key.clone();
    let flight: Vec<OperationalEvent> = first_day
        .iter()
        .filter(|event| event.flight_key == flight_key)
        .cloned()
        .collect();
    let later: Vec<OperationalEvent> = replay_events((1, 3), (1, 3), no_duplicates())
        .into_iter()
        .filter(|event| event.flight_key != flight_key)
        .collect();
    let newest = later
        .iter()
        .map(|event| event.event_time_us)
        .max()
        .expect("events");
    let last_of_flight = flight
        .iter()
        .map(|event| event.event_time_us)
        .max()
        .expect("events");
    let hour = 3_600_000_000;
    // 2013-01-02T00:00:00Z, by hand: the end of the flight's service date.
    let service_end = 15_707 * 24 * hour;
    let lived_from = service_end.max(last_of_flight);
    let watermark = newest - hour;
    assert!(
        watermark >= lived_from + 48 * hour && watermark < lived_from + 72 * hour,
        "the shard watermark is past the flight's horizon and within its record's expiry: {} h after {}",
        (watermark - lived_from) / hour,
        lived_from
    );
    let mut correction = flight[0].clone();
    correction.event_id = format!("{flight_key}-correction-delay");
    correction.r#type = EventType::Delayed as i32;
    correction.event_time_us = newest;
    correction.data = Some(EventData {
        delay_minutes: Some(45),
        delay_code: Some("93".to_owned()),
        ..EventData::default()
    });
    let mut feed = flight.clone();
    feed.extend(later);
    feed.push(correction);
    produce_events(&broker.address, &topics.raw, &feed).expect("produce");

    let mut stage = dedup_state(&broker.address, &topics, &dir);
    stage
        .wait_caught_up(1, Duration::from_secs(300))
        .expect("caught up");
    let (expected, accepted) = expectation(&broker.address, &topics, feed.len());
    let correction_offset = (feed.len() - 1) as i64;
    assert_eq!(
        expected.late.get(&(0, correction_offset)),
        Some(&"expired"),
        "the oracle, from the contract: the correction is late because its flight expired"
    );
    assert_eq!(expected.accepted[&flight_key].len(), flight.len());
    check_dedup_outputs(&broker.address, &topics, &expected, accepted);
    // Said once more in the terms of the scenario: the flight's states are versions 1..n, once.
    let versions = curated_versions(&broker.address, &topics, accepted);
    assert_eq!(
        versions.get(&flight_key).cloned().unwrap_or_default(),
        (1..=flight.len() as u64).collect::<Vec<_>>(),
        "{flight_key}"
    );
    let state = stage.read_key_state(&flight_key).expect("state");
    assert!(state.found && state.expired, "kept as a tombstone: {state:?}");
    stage.process.terminate(Duration::from_secs(30)).expect("stops");
}

/// A shard whose volume is lost restores its newest checkpoint (docs/CONTRACT.md, "Checkpoints")
/// — here one taken long before — and regenerates every output since: more than 60,000 copies per
/// topic partition, far beyond any window of offsets. The archiver keeps one row per identity in
/// every table (docs/CONTRACT.md, "Exact de-duplication").
#[test]
fn a_shard_restored_from_an_old_checkpoint_leaves_one_row_per_identity_in_delta() {
    let broker = shared_broker();
    let topics = one_partition_topics(&broker.address);
    let dir = test_dir("eo-restore");
    let root = dir.join("delta");
    let events = replay_events((1, 1), (1, 18), realistic_feed(41));
    let early = 15_000;
    produce_events(&broker.address, &topics.raw, &events[..early]).expect("produce");
    let mut stage = dedup_state(&broker.address, &topics, &dir);
    let mut archive = archiver(&broker.address, &topics, &root, &dir.join("archiver"));
    stage
        .wait_caught_up(1, Duration::from_secs(300))
        .expect("caught up");
    let epoch = stage.trigger_checkpoint().expect("checkpoint");
    println!("checkpoint {epoch} after {early} raw records");

    produce_events(&broker.address, &topics.raw, &events[early..]).expect("produce the rest");
    stage
        .wait_caught_up(1, Duration::from_secs(600))
        .expect("caught up");
    let (expected, accepted) = expectation(&broker.address, &topics, events.len());
    let after_checkpoint = expected
        .accepted
        .values()
        .flatten()
        .filter(|(_, position)| position.offset >= early as i64)
        .count();
    assert!(
        after_checkpoint > 60_000,
        "more than 60,000 outputs per topic partition after the checkpoint: {after_checkpoint}"
    );
    wait_archived(&mut archive, &broker.address, &topics);

    // The volume is lost: the shard restores the old checkpoint and regenerates everything since.
    stage.process.terminate(Duration::from_secs(60)).expect("stops");
    std::fs::remove_dir_all(stage.dir.join("shards")).expect("volume lost");
    stage.restart().expect("restarts");
    stage
        .wait_caught_up(1, Duration::from_secs(600))
        .expect("caught up again");
    let status = stage.status().expect("status");
    assert!(
        status.counters.get("restores_total").copied().unwrap_or_default() >= 1.0,
        "the shard was restored from the checkpoint store: {:?}",
        status.counters
    );
    let accepted_end: i64 = quiescent_ends(&broker.address, &topics.accepted, Duration::from_secs(2))
        .expect("ends")
        .values()
        .sum();
    let copies = accepted_end - accepted as i64;
    println!("{copies} regenerated copies on the accepted topic");
    assert!(
        copies > 60_000,
        "the restore regenerated the outputs since the checkpoint: {copies}"
    );
    check_dedup_outputs(&broker.address, &topics, &expected, accepted);

    wait_archived(&mut archive, &broker.address, &topics);
    let reports = assert_one_row_each(&root, &dir.join("verify"), &expected);
    assert_eq!(reports["events"].rows as usize, accepted);
    for stage in [&mut archive.process, &mut stage.process] {
        stage.terminate(Duration::from_secs(60)).expect("stops");
    }
}

/// Ids are unique per flight only (docs/CONTRACT.md, "Events"). Sources that number their events
/// per flight ("1", "2", …) give two flights of one partition the same ids: every event of both is
/// accepted and archived, while a redelivery of either is still a duplicate.
#[test]
fn events_of_two_flights_sharing_their_ids_are_all_archived() {
    let broker = shared_broker();
    let topics = one_partition_topics(&broker.address);
    let dir = test_dir("eo-shared-ids");
    let root = dir.join("delta");
    let day = replay_events((1, 7), (1, 7), no_duplicates());
    let mut keys: Vec<String> = day.iter().map(|event| event.flight_key.clone()).collect();
    keys.dedup();
    let chosen: Vec<&String> = keys.iter().take(40).collect();
    let mut per_flight: BTreeMap<String, u32> = BTreeMap::new();
    let mut feed: Vec<OperationalEvent> = Vec::new();
    for event in day.iter().filter(|event| chosen.contains(&&event.flight_key)) {
        let number = per_flight.entry(event.flight_key.clone()).or_default();
        *number += 1;
        let mut renumbered = event.clone();
        renumbered.event_id = number.to_string();
        feed.push(renumbered);
    }
    // Redeliveries of every fifth event: still duplicates of their own flight's event.
    let copies: Vec<OperationalEvent> = feed.iter().step_by(5).cloned().collect();
    let copy_count = copies.len();
    feed.extend(copies);
    produce_events(&broker.address, &topics.raw, &feed).expect("produce");

    let mut stage = dedup_state(&broker.address, &topics, &dir);
    let mut archive = archiver(&broker.address, &topics, &root, &dir.join("archiver"));
    stage
        .wait_caught_up(1, Duration::from_secs(300))
        .expect("caught up");
    let (expected, accepted) = expectation(&broker.address, &topics, feed.len());
    let distinct_ids: std::collections::BTreeSet<&str> = expected
        .accepted
        .values()
        .flatten()
        .map(|(event, _)| event.event_id.as_str())
        .collect();
    assert!(
        accepted > 5 * distinct_ids.len(),
        "the feed's ids repeat across flights: {accepted} events, {} ids",
        distinct_ids.len()
    );
    assert_eq!(
        expected.duplicates, copy_count,
        "every copy is a duplicate of its own flight's event"
    );
    check_dedup_outputs(&broker.address, &topics, &expected, accepted);
    wait_archived(&mut archive, &broker.address, &topics);
    let reports = assert_one_row_each(&root, &dir.join("verify"), &expected);
    assert_eq!(
        reports["events"].rows as usize, accepted,
        "every flight's events are in history"
    );
    for stage in [&mut archive.process, &mut stage.process] {
        stage.terminate(Duration::from_secs(60)).expect("stops");
    }
}

/// A flight lives as long as it operates, and one broken clock costs nobody data
/// (docs/CONTRACT.md, "Lifetime" and "Plausible time"). The raw topic gets, in this order:
/// - the schedules of the flights of 5 January 2013, published 330 days ahead (stamped
///   February 2012);
/// - the real events of 4 January 2013 (the shard's watermark moves 11 months on);
/// - three records written straight to the raw topic by sources with broken clocks — one event of
///   a 5 January flight stamped 2099, one stamped 1971, and one of a flight of today stamped two
///   days ahead (inside its dates, but past the broker's timestamp + max_clock_skew);
/// - the real events of 5 January 2013 (OUT, OFF, ON, IN, delays, …).
///
/// Every event of every 5 January flight is applied — versions 1..n with the schedule as version
/// 1 — nothing is late, the three broken records are dead-lettered naming `event_time`, and the
/// outputs match the oracle's expectation.
#[test]
fn schedules_published_months_ahead_are_applied_and_broken_clocks_move_nothing() {
    use prost::Message as _;
    use rdkafka::Message as _;
    let broker = shared_broker();
    let topics = one_partition_topics(&broker.address);
    let dir = test_dir("eo-lifetime");
    let day = 86_400_000_000;
    let fifth = replay_events((1, 5), (1, 5), no_duplicates());
    // Sixty flights of 5 January that have a schedule, each schedule published 330 days ahead.
    let mut keys: Vec<String> = fifth
        .iter()
        .filter(|event| event.r#type == EventType::Scheduled as i32)
        .map(|event| event.flight_key.clone())
        .collect();
    keys.dedup();
    keys.truncate(60);
    let ours = |event: &&OperationalEvent| keys.contains(&event.flight_key);
    let mut feed: Vec<OperationalEvent> = fifth
        .iter()
        .filter(ours)
        .filter(|event| event.r#type == EventType::Scheduled as i32)
        .map(|event| OperationalEvent {
            event_time_us: event.event_time_us - 330 * day,
            ..event.clone()
        })
        .collect();
    assert_eq!(feed.len(), keys.len(), "one schedule per flight");
    feed.extend(replay_events((1, 4), (1, 4), no_duplicates()));
    let broken_at = feed.len() as i64;
    let template = feed[0].clone();
    let broken = |id: &str, event_time_us: i64| OperationalEvent {
        event_id: id.to_owned(),
        r#type: EventType::Delayed as i32,
        event_time_us,
        ..template.clone()
    };
    feed.push(broken("clock-2099", 4_070_908_800_000_000)); // 2099-01-01T00:00:00Z
    feed.push(broken("clock-1971", 31_536_000_000_000)); // 1971-01-01T00:00:00Z
    // A flight of today whose source's clock runs two days ahead: inside its dates' window, but
    // later than the receiving clock (the record's broker timestamp) + max_clock_skew.
    let now = chrono::Utc::now();
    let today = now.format("%Y-%m-%d").to_string();
    let mut ahead = broken("clock-ahead", now.timestamp_micros() + 2 * day);
    let flight = ahead.flight.as_mut().expect("a flight");
    ahead.flight_key = ahead.flight_key.replace(&flight.service_date, &today);
    flight.service_date = today;
    feed.push(ahead);
    let operated: Vec<OperationalEvent> = fifth
        .iter()
        .filter(ours)
        .filter(|event| event.r#type != EventType::Scheduled as i32)
        .cloned()
        .collect();
    feed.extend(operated.iter().cloned());
    produce_events(&broker.address, &topics.raw, &feed).expect("produce");

    let mut stage = dedup_state(&broker.address, &topics, &dir);
    stage
        .wait_caught_up(1, Duration::from_secs(300))
        .expect("caught up");
    let (expected, accepted) = expectation(&broker.address, &topics, feed.len());
    assert_eq!(
        expected.implausible,
        [(0, broken_at), (0, broken_at + 1), (0, broken_at + 2)].into(),
        "the oracle: the three broken clocks are implausible"
    );
    check_dedup_outputs(&broker.address, &topics, &expected, accepted);
    // In the scenario's own terms, counted from the feed: every event of every flight is applied.
    let versions = curated_versions(&broker.address, &topics, accepted);
    for key in &keys {
        let events = 1 + operated.iter().filter(|event| &event.flight_key == key).count();
        assert_eq!(
            versions.get(key).cloned().unwrap_or_default(),
            (1..=events as u64).collect::<Vec<_>>(),
            "{key}: the schedule and every event of its day are applied once, in versions 1..{events}"
        );
    }
    let departed = operated
        .iter()
        .filter(|event| event.r#type == EventType::Out as i32)
        .count();
    assert!(
        departed > 30,
        "the flights' departures are among them: {departed}"
    );
    let letters = read_topic(&broker.address, &topics.dlq, 3, Duration::from_secs(60)).expect("dlq");
    let reasons: Vec<(i64, String)> = letters
        .iter()
        .map(|message| {
            let letter = contrail_proto::v1::DeadLetter::decode(message.payload().unwrap_or_default())
                .expect("letter");
            (letter.input.map_or(-1, |input| input.offset), letter.reason)
        })
        .collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert_eq!(reasons[0].0, broken_at);
    assert!(
        reasons[0]
            .1
            .contains("event_time: 2099-01-01T00:00:00Z is implausible"),
        "{reasons:?}"
    );
    assert_eq!(reasons[1].0, broken_at + 1);
    assert!(
        reasons[1]
            .1
            .contains("event_time: 1971-01-01T00:00:00Z is implausible"),
        "{reasons:?}"
    );
    assert_eq!(reasons[2].0, broken_at + 2);
    assert!(
        reasons[2].1.contains("later than the receiving clock"),
        "{reasons:?}"
    );
    stage.process.terminate(Duration::from_secs(30)).expect("stops");
}

/// Bounded per-key state (docs/CONTRACT.md, "Bounded state"): a broken source sends a new
/// estimate for one real flight every second, 50,000 distinct events. The flight accepts its
/// maximum (set to 500 here) and no more: its stored record keeps 500 dedup entries, every event
/// past the maximum is dead-lettered naming it, a redelivery of an accepted estimate is still a
/// duplicate, and the other flights of the partition go on as the oracle expects.
#[test]
fn a_flight_sent_fifty_thousand_events_keeps_a_bounded_record_and_every_event_is_accounted_for() {
    use prost::Message as _;
    use rdkafka::Message as _;
    const LIMIT: usize = 500;
    const ESTIMATES: usize = 50_000;
    let broker = shared_broker();
    let topics = one_partition_topics(&broker.address);
    let dir = test_dir("eo-bounded");
    // In event-time order, so that with the short lateness bound below nothing of the day is late.
    let mut day = replay_events((1, 2), (1, 2), no_duplicates());
    day.sort_by_key(|event| event.event_time_us);
    let key = day
        .iter()
        .find(|event| event.r#type == EventType::Scheduled as i32)
        .map(|event| event.flight_key.clone())
        .expect("a scheduled flight");
    let mut feed = day.clone();
    let own = feed.iter().filter(|event| event.flight_key == key).count();
    let template = feed
        .iter()
        .find(|event| event.flight_key == key)
        .cloned()
        .expect("the flight's first event");
    let start = feed
        .iter()
        .map(|event| event.event_time_us)
        .max()
        .expect("events");
    let second = 1_000_000;
    feed.extend((0..ESTIMATES as i64).map(|index| OperationalEvent {
        event_id: format!("estimate-{index}"),
        r#type: EventType::Estimated as i32,
        event_time_us: start + index * second,
        data: Some(EventData {
            estimated_out_us: Some(start + (index % 600) * 60 * second),
            ..EventData::default()
        }),
        ..template.clone()
    }));
    // A redelivery of the first estimate (accepted: the flight had room then).
    let redelivery = feed[day.len()].clone();
    feed.push(redelivery);
    produce_events(&broker.address, &topics.raw, &feed).expect("produce");

    let group = unique("eo-bounded");
    let mut stage = start_dedup_state(DedupOptions {
        extra_env: vec![
            ("CONTRAIL_RULES__MAX_EVENTS_PER_FLIGHT".into(), LIMIT.to_string()),
            // A short lateness bound keeps the flight's pending events few: the record is mostly
            // its dedup entries, the part the maximum bounds.
            ("CONTRAIL_RULES__ALLOWED_LATENESS_SECS".into(), "60".into()),
        ],
        ..DedupOptions::single(&broker.address, &topics, &group, &dir)
    })
    .expect("dedup-state starts");
    stage
        .wait_caught_up(1, Duration::from_secs(900))
        .expect("caught up");

    // In the scenario's own terms, counted from the feed: the flight's own events and the first
    // estimates up to the maximum are applied; every later estimate is dead-lettered.
    let full = own + ESTIMATES - LIMIT;
    let letters = read_topic(&broker.address, &topics.dlq, full, Duration::from_secs(120)).expect("dlq");
    assert_eq!(letters.len(), full, "one dead letter per event past the maximum");
    let first_full = (day.len() + LIMIT - own) as i64;
    for (index, message) in letters.iter().enumerate() {
        let letter =
            contrail_proto::v1::DeadLetter::decode(message.payload().unwrap_or_default()).expect("letter");
        let offset = letter.input.as_ref().map_or(-1, |input| input.offset);
        assert_eq!(offset, first_full + index as i64, "dead letters in input order");
        assert!(
            letter
                .reason
                .contains(&format!("the flight already accepted {LIMIT} events")),
            "{}",
            letter.reason
        );
    }
    let read = stage.read_key_state(&key).expect("key state");
    assert!(read.found);
    assert_eq!(
        read.dedup_event_ids.len(),
        LIMIT,
        "the record keeps one dedup entry per accepted event, no more"
    );
    assert!(
        read.state_json.contains(&format!("\"version\":{LIMIT}")),
        "{}",
        read.state_json
    );

    // And by the oracle, over every flight of the partition (the redelivery is a duplicate).
    let raw = raw_records(
        &read_topic(&broker.address, &topics.raw, feed.len(), Duration::from_secs(120)).expect("raw"),
    );
    let expected = expect(
        &raw,
        OracleRules {
            lateness_us: 60 * second,
            max_events_per_flight: LIMIT,
            ..OracleRules::default()
        },
    );
    assert_eq!(expected.full.len(), full);
    assert_eq!(expected.duplicates, 1);
    assert_eq!(expected.accepted[&key].len(), LIMIT);
    let accepted = expected.accepted.values().map(Vec::len).sum();
    assert_eq!(accepted, day.len() + LIMIT - own);
    check_dedup_outputs(&broker.address, &topics, &expected, accepted);
    stage.process.terminate(Duration::from_secs(30)).expect("stops");
}
