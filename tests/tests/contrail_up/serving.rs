//! The serving store from what a producer sends without a replay, and rebuilt from history while
//! the feed goes on; history reprocessed by a fresh deployment gives the served states.

use super::*;

#[test]
fn contrail_up_without_a_replay_serves_what_your_own_producer_sends() {
    const TOKEN: &str = "no-replay-test-ingest-token-0123456789";
    let mut up = idle_platform("contrail-up-no-replay", TOKEN);
    assert!(
        up.output().contains("ready for your events: POST"),
        "{}",
        up.output_tail(20)
    );
    let brokers = up.brokers();
    let raw_now = contrail_testkit::read_to_end(&brokers, "ops.events.raw", Duration::from_secs(30))
        .expect("raw topic");
    assert!(
        raw_now.is_empty(),
        "nothing was replayed: {} records",
        raw_now.len()
    );

    // Your producer: a day of real flights, posted from outside by `contrail replay`.
    let replay =
        std::process::Command::new(contrail_testkit::workspace_binary("contrail").expect("contrail"))
            .args([
                "replay",
                "--url",
                &up.ingest_url(),
                "--from",
                "2013-05-20",
                "--to",
                "2013-05-20",
            ])
            .args(["--seed", "3", "--quiet"])
            .env("CONTRAIL_INGEST_TOKEN", TOKEN)
            .output()
            .expect("run contrail replay");
    assert!(
        replay.status.success(),
        "{}{}",
        String::from_utf8_lossy(&replay.stdout),
        String::from_utf8_lossy(&replay.stderr)
    );

    served_as_the_raw_topic_says(&up);
    assert!(up.is_running(), "the platform keeps running until Ctrl-C");
    let status = up.interrupt(Duration::from_secs(90)).expect("stops");
    assert!(
        status.success(),
        "contrail up exited with {status}:\n{}",
        up.output()
    );
    assert!(
        !up.output().contains("contrail up: summary"),
        "no summary without a replay"
    );
}

/// Rebuild serving from history: the `flights` container is deleted while a feed is
/// being posted; cosmos-writer waits for it (no record dead-lettered, none committed past), and
/// `contrail backfill serving` recreates it from the Delta history while the feed goes on. At the
/// end every document is what the test's own fold of the raw topic says, and no other exists.
#[test]
fn the_serving_store_is_rebuilt_from_history_while_the_feed_goes_on() {
    const TOKEN: &str = "backfill-test-ingest-token-0123456789";
    let mut up = idle_platform("contrail-up-backfill", TOKEN);
    let contrail_bin = contrail_testkit::workspace_binary("contrail").expect("contrail");
    // A day of real flights at 120 events/s: about 70 s of feed.
    let mut replay = std::process::Command::new(&contrail_bin)
        .args(["replay", "--url", &up.ingest_url()])
        .args(["--from", "2013-06-10", "--to", "2013-06-10"])
        .args(["--seed", "5", "--rate", "120", "--quiet"])
        .env("CONTRAIL_INGEST_TOKEN", TOKEN)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run contrail replay");
    let runtime = test_runtime();
    let containers = runtime
        .block_on(containers_at(&up.cosmos_endpoint()))
        .expect("containers");

    // Mid-feed: the serving store is lost.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let served = runtime
            .block_on(query_documents(&containers))
            .map(|documents| documents.len())
            .unwrap_or_default();
        if served >= 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {served} documents served after 120 s\n{}",
            up.output_tail(30)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    runtime
        .block_on(containers.flights.delete(None))
        .expect("delete the flights container");
    let writer_http = format!("http://127.0.0.1:{}", 8082 + up.offset);
    let metric = |name: &str, filter: &str| contrail_testkit::cosmos::metric_at(&writer_http, name, filter);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while metric("contrail_cosmos_writer_retries_total", "cause=\"404\"") < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "cosmos-writer never met the missing container\n{}",
            up.output_tail(30)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Writes wait for the container: a few seconds of feed pile up behind it.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        metric("contrail_cosmos_writer_dead_letters_total", ""),
        0.0,
        "a missing container is an outage, not a fault of the records"
    );

    // The rebuild, while the feed goes on.
    let printed = backfill_serving(&up, &["--max-ru-per-second", "20000"]);
    assert!(
        printed.contains("delta-archiver has archived ops.flights.curated up to its end"),
        "{printed}"
    );
    let written: u64 = printed
        .split(" written")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no count of documents written in {printed:?}"));
    assert!(written >= 200, "the history had the lost documents: {printed}");
    assert!(
        replay.try_wait().expect("replay status").is_none(),
        "the feed was still running while the store was rebuilt"
    );
    let replayed = replay.wait_with_output().expect("replay ends");
    assert!(
        replayed.status.success(),
        "{}{}",
        String::from_utf8_lossy(&replayed.stdout),
        String::from_utf8_lossy(&replayed.stderr)
    );

    served_as_the_raw_topic_says(&up);
    assert_eq!(
        metric("contrail_cosmos_writer_dead_letters_total", ""),
        0.0,
        "nothing was dead-lettered"
    );
    the_replaced_containers_changes_reach_history(&up);
    the_history_reprocessed_by_a_fresh_deployment_gives_the_served_states(&up);
    let status = up.interrupt(Duration::from_secs(90)).expect("stops");
    assert!(
        status.success(),
        "contrail up exited with {status}:\n{}",
        up.output()
    );
}

/// `contrail backfill reprocess`: the history's accepted events (every one since June 8) produced
/// to a topic of their own and processed by a fresh dedup-state deployment (its own state, group
/// and outputs) give every flight the state the platform serves — the same version, status,
/// actual times and gate as its Cosmos DB document — with nothing late and nothing twice.
fn the_history_reprocessed_by_a_fresh_deployment_gives_the_served_states(up: &UpUnderTest) {
    use contrail_testkit::dedup::{DedupOptions, DedupTopics, start_dedup_state};
    use rdkafka::Message as _;
    let topics = DedupTopics::unique();
    let contrail_bin = contrail_testkit::workspace_binary("contrail").expect("contrail");
    let reprocess = |to_topic: &str| {
        std::process::Command::new(&contrail_bin)
            .args(["backfill", "reprocess", "--from-delta"])
            .arg(up.delta_root())
            .args([
                "--from",
                "2013-06-08",
                "--to-topic",
                to_topic,
                "--brokers",
                &up.brokers(),
                "--quiet",
            ])
            .output()
            .expect("run contrail backfill reprocess")
    };
    let output = reprocess(&topics.raw);
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    println!("contrail backfill reprocess printed:\n{printed}");
    assert!(
        output.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        printed.contains("delta-archiver has archived ops.events.accepted up to its end"),
        "{printed}"
    );
    let produced: usize = printed
        .lines()
        .find(|line| line.contains("accepted events of"))
        .and_then(|line| line.split(' ').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no count of events in {printed:?}"));
    let refused = reprocess("ops.events.raw");
    let refusal = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && refusal.contains("ops.events.raw"),
        "the live raw topic is refused, by name: {refusal}"
    );

    let dir = test_dir("contrail-up-reprocess");
    let group = contrail_testkit::unique("reprocess");
    let mut fresh = start_dedup_state(DedupOptions::single(&up.brokers(), &topics, &group, &dir))
        .expect("a fresh dedup-state deployment");
    let curated = read_topic(&up.brokers(), &topics.curated, produced, Duration::from_secs(180))
        .expect("every reprocessed event accepted once");
    let late = read_topic(&up.brokers(), &topics.late, 0, Duration::from_secs(2)).unwrap_or_default();
    assert!(late.is_empty(), "{} reprocessed events late", late.len());
    let mut newest: BTreeMap<String, FlightState> = BTreeMap::new();
    for message in &curated {
        let state = FlightState::decode(message.payload().unwrap_or_default()).expect("a FlightState");
        if newest
            .get(&state.flight_key)
            .is_none_or(|kept| kept.version < state.version)
        {
            newest.insert(state.flight_key.clone(), state);
        }
    }
    let runtime = test_runtime();
    let documents = runtime
        .block_on(async { query_documents(&containers_at(&up.cosmos_endpoint()).await?).await })
        .expect("the served documents");
    let mut problems = Vec::new();
    for (key, document) in &documents {
        let Some(state) = newest.get(key) else {
            problems.push(format!("{key}: served, not reprocessed"));
            continue;
        };
        let served = essentials_of(document);
        let reprocessed = Essentials {
            status: state.status.clone(),
            actual: [
                state.actual_out_us,
                state.actual_off_us,
                state.actual_on_us,
                state.actual_in_us,
            ],
            gate: state.gate.clone(),
            version: state.version,
        };
        if served != reprocessed {
            problems.push(format!("{key}: served {served:?}, reprocessed {reprocessed:?}"));
        }
    }
    println!(
        "reprocessed {produced} events: {} flights, {} served documents, {} differences",
        newest.len(),
        documents.len(),
        problems.len()
    );
    assert!(
        problems.is_empty() && newest.len() == documents.len(),
        "{} differences, e.g. {:?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );
    fresh.process.terminate(Duration::from_secs(30)).expect("stops");
}

/// After the `flights` container was deleted and created again: changefeed-sync read the new
/// container from its beginning under new leases, so every document it holds now reached
/// `ops.flights.changes` labelled as the container's first replacement (`<range>#1` — its `_lsn`
/// may start again, and history keeps the highest `_lsn` per label), and the independent Delta
/// reader finds each of those changes in `serving_changes`.
fn the_replaced_containers_changes_reach_history(up: &UpUnderTest) {
    let feed_http = format!("http://127.0.0.1:{}", 8083 + up.offset);
    let superseded =
        contrail_testkit::cosmos::metric_at(&feed_http, "contrail_changefeed_leases_superseded_total", "");
    assert!(
        superseded >= 1.0,
        "changefeed-sync never superseded the old container's leases\n{}",
        up.output_tail(30)
    );
    let runtime = test_runtime();
    let documents = runtime
        .block_on(async { query_documents(&containers_at(&up.cosmos_endpoint()).await?).await })
        .expect("documents of the new container");
    let brokers = up.brokers();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let published: BTreeMap<(String, u64), ServingChange> = loop {
        let ends =
            quiescent_ends(&brokers, "ops.flights.changes", Duration::from_secs(2)).expect("change ends");
        let changes = read_topic(
            &brokers,
            "ops.flights.changes",
            ends.values().sum::<i64>() as usize,
            Duration::from_secs(60),
        )
        .expect("changes");
        let mut of_new_container = BTreeMap::new();
        for message in &changes {
            use rdkafka::Message as _;
            let change =
                ServingChange::decode(message.payload().unwrap_or_default()).expect("a ServingChange");
            if !change.feed_range.ends_with("#1") {
                continue;
            }
            let version = serde_json::from_str::<serde_json::Value>(&change.document_json)
                .ok()
                .and_then(|document| document["version"].as_u64())
                .unwrap_or_default();
            of_new_container.insert((change.id.clone(), version), change);
        }
        let missing: Vec<String> = documents
            .iter()
            .filter(|(id, document)| {
                let version = document["version"].as_u64().unwrap_or_default();
                !of_new_container.contains_key(&((*id).clone(), version))
            })
            .map(|(id, document)| format!("{id} v{}", document["version"]))
            .collect();
        if missing.is_empty() {
            break of_new_container;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {} documents of the new container never reached ops.flights.changes as its \
             changes (labelled #1), e.g. {:?}\n{}",
            missing.len(),
            documents.len(),
            &missing[..missing.len().min(3)],
            up.output_tail(30)
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    // History: each of those changes is a row of serving_changes (identity id#lsn).
    let expected: BTreeMap<&'static str, Vec<String>> = [(
        "serving_changes",
        published
            .values()
            .map(|change| format!("{}#{}", change.id, change.lsn))
            .collect::<BTreeSet<String>>()
            .into_iter()
            .collect(),
    )]
    .into();
    let work = up.delta_root().with_file_name("verify-replaced");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let reports =
            verify_tables(&up.delta_root(), &work, &expected, &BTreeMap::new()).expect("independent reader");
        let report = &reports["serving_changes"];
        if report.missing == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} changes of the new container are not in serving_changes, e.g. {:?}",
            report.missing,
            report.missing_sample
        );
        std::thread::sleep(Duration::from_secs(3));
    }
}
