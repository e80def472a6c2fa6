//! One chaos run of `contrail up` and every check of it: the replay with `kill -9` of the stages,
//! then the raw topic read back, the expectation computed from it, and the serving store, the
//! history and the alerts compared with that expectation.

use super::*;

/// The ingest token of the month test's platform.
const MONTH_TOKEN: &str = "month-test-ingest-token-0123456789";

/// A check of the running platform given its summary.
pub(super) type WhileUp<'a> = dyn Fn(&UpUnderTest, &serde_json::Value) + 'a;

/// A chaos run of `contrail up` and what it must show.
pub(super) struct ChaosRun<'a> {
    /// Test directory name.
    pub(super) name: &'a str,
    /// `contrail up` options besides the working directory, token and the recording of
    /// acknowledged events.
    pub(super) args: &'a [&'a str],
    /// Distinct events the replay holds at least.
    pub(super) min_events: u64,
    /// Redeliveries (duplicates) the raw topic holds at least.
    pub(super) min_duplicates: usize,
    /// Kills per stage at least.
    pub(super) min_kills: u64,
    /// How long the summary may take.
    pub(super) settle: Duration,
    /// Checks of the running platform once the summary is out (it stays up until the test ends).
    pub(super) while_up: Option<&'a WhileUp<'a>>,
}

/// Runs and checks `run`; returns contrail up's summary.
pub(super) fn replay_with_chaos_and_check(run: ChaosRun<'_>) -> serde_json::Value {
    let dir = test_dir(run.name);
    let acknowledged_path = dir.join("acknowledged.tsv");
    let mut args: Vec<&str> = run.args.to_vec();
    args.extend([
        "--ingest-token",
        MONTH_TOKEN,
        "--acknowledged-out",
        acknowledged_path.to_str().expect("utf-8 path"),
    ]);
    let started = std::time::Instant::now();
    // Where a long run spends its time, in its output.
    let phase = |name: &str| println!("[{:6.1} s] {name}", started.elapsed().as_secs_f64());
    let mut up = UpUnderTest::start(&dir, &args).expect("contrail up starts");
    // Ingest runs with authentication on: a request without the token is refused.
    up.wait_phase("the replay to start", Duration::from_secs(300), |phase| {
        phase == "replaying"
    })
    .expect("replaying");
    phase("replaying");
    let ingest = format!("{}/v1/events", up.ingest_url());
    let unauthenticated = contrail_testkit::http_post(&ingest, "{}").expect("ingest answers");
    assert!(unauthenticated.starts_with("HTTP/1.1 401"), "{unauthenticated}");
    let summary = up.wait_summary(run.settle).expect("contrail up settles");
    let output = up.output();
    println!("{output}");
    phase("settled");
    if let Some(check) = run.while_up {
        check(&up, &summary);
    }

    // What contrail up itself reports.
    assert_eq!(summary["passed"], true, "its own checks: {:#}", summary["checks"]);
    assert_eq!(
        summary["crashes"], 0,
        "no stage exited on its own (only the chaos kills restarted stages)"
    );
    let distinct = summary["distinct_events"].as_u64().unwrap_or_default();
    assert!(
        distinct >= run.min_events,
        "at least {} events: {distinct}",
        run.min_events
    );
    // Every instance of every stage (`dedup-state`, or `dedup-state-0`, `-1`… when scaled).
    let kills = summary["kills"].as_object().expect("kills per instance");
    for stage in [
        "ingest",
        "dedup-state",
        "cosmos-writer",
        "changefeed-sync",
        "delta-archiver",
    ] {
        let instances: Vec<(&String, u64)> = kills
            .iter()
            .filter(|(name, _)| {
                *name == stage
                    || name
                        .strip_prefix(stage)
                        .and_then(|rest| rest.strip_prefix('-'))
                        .is_some_and(|index| index.parse::<u16>().is_ok())
            })
            .map(|(name, count)| (name, count.as_u64().unwrap_or_default()))
            .collect();
        assert!(!instances.is_empty(), "{stage} is in the summary: {kills:?}");
        for (name, count) in instances {
            assert!(count >= run.min_kills, "{name} was killed {count} times");
        }
    }
    assert!(
        output.matches("chaos: kill -9").count() as u64 >= 5 * run.min_kills,
        "the kills are reported as they happen"
    );
    for (option, event) in [
        ("--chaos-broker-restarts", "broker_restarts"),
        ("--chaos-volume-losses", "volume_losses"),
    ] {
        if let Some(at) = run.args.iter().position(|arg| *arg == option) {
            let asked: u64 = run.args[at + 1].parse().expect("a count");
            assert_eq!(summary[event].as_u64(), Some(asked), "{event}");
        }
    }
    if run.args.contains(&"--chaos-freeze-cosmos-s") {
        assert_eq!(
            summary["cosmos_freezes"].as_u64(),
            Some(1),
            "one freeze of the Cosmos endpoint"
        );
        let froze = output
            .find("chaos: freeze cosmos-dev")
            .expect("the freeze is reported");
        let thawed = output
            .find("chaos: thaw cosmos-dev")
            .expect("the thaw is reported");
        assert!(froze < thawed, "frozen, then thawed");
    }

    // Latency from real samples, to both stores (every 20th flight to Cosmos by default).
    for store in ["ingest_to_cosmos", "ingest_to_delta"] {
        let latency = &summary["latency_ms"][store];
        assert!(
            latency["samples"].as_u64().unwrap_or(0) > 0 && latency["p99"].as_f64().is_some(),
            "{store}: {latency}"
        );
    }

    // The test's own expectation, from the events on the raw topic (the input as ingest wrote it).
    let brokers = up.brokers();
    let ends = quiescent_ends(&brokers, "ops.events.raw", Duration::from_secs(3)).expect("raw ends");
    let total: i64 = ends.values().sum();
    let raw = read_topic(
        &brokers,
        "ops.events.raw",
        total as usize,
        Duration::from_secs(120),
    )
    .expect("raw topic");
    let records = raw_records(&raw);
    phase("the raw topic read");
    let expected = expect(&records, OracleRules::default());
    phase("the expectation computed");
    assert!(
        expected.restarted.is_empty(),
        "no flight outlives its record: {:?}",
        expected.restarted
    );
    // Nothing ingest acknowledged is lost: every acknowledged (flight key, event id) is on the raw
    // topic (the replay wrote what ingest answered 202 for).
    let on_raw: BTreeSet<(String, String)> = records
        .iter()
        .map(|record| (record.event.flight_key.clone(), record.event.event_id.clone()))
        .collect();
    let acknowledged: Vec<(String, String)> = std::fs::read_to_string(&acknowledged_path)
        .expect("acknowledged events")
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(key, id)| (key.to_owned(), id.to_owned()))
        .collect();
    assert_eq!(
        acknowledged.len() as u64,
        summary["distinct_events"].as_u64().unwrap_or_default()
    );
    let lost: Vec<&(String, String)> = acknowledged
        .iter()
        .filter(|event| !on_raw.contains(*event))
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged events are not on the raw topic, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(3)]
    );
    // The DEPARTURE_OVERDUE alerts are exactly the expected ones (copies allowed), and nothing
    // of this valid feed was dead-lettered.
    let alert_ends = quiescent_ends(&brokers, "ops.alerts", Duration::from_secs(3)).expect("alert ends");
    let (alerts, resolutions) = alerts_on_topic(
        &read_topic(
            &brokers,
            "ops.alerts",
            alert_ends.values().sum::<i64>() as usize,
            Duration::from_secs(120),
        )
        .expect("alerts"),
    );
    assert_eq!(
        alerts.len(),
        expected.alerts.len(),
        "alerts: {} expected, {} distinct on the topic; missing e.g. {:?}, unexpected e.g. {:?}",
        expected.alerts.len(),
        alerts.len(),
        expected.alerts.difference(&alerts).next(),
        alerts.difference(&expected.alerts).next()
    );
    assert_eq!(alerts, expected.alerts);
    assert_eq!(
        resolutions,
        expected.resolutions,
        "alert resolutions: missing e.g. {:?}, unexpected e.g. {:?}",
        expected.resolutions.difference(&resolutions).next(),
        resolutions.difference(&expected.resolutions).next()
    );
    assert_eq!(
        (
            summary["alerts"]["raised"].as_u64(),
            summary["alerts"]["resolved"].as_u64()
        ),
        (
            Some(expected.alerts.len() as u64),
            Some(expected.resolutions.len() as u64)
        ),
        "the summary counts the alerts of the Delta alerts table"
    );
    assert!(
        !expected.resolutions.is_empty(),
        "the feed has flights that left the gate after their overdue alert"
    );
    // `contrail alerts tail` prints each alert and each resolution once, copies on the topic or not.
    let (ok, stdout, stderr) = contrail(
        &up,
        &["alerts", "tail", "--from-beginning", "--no-follow", "--json"],
    );
    assert!(ok, "contrail alerts tail: {stderr}");
    let mut tailed: Vec<(String, String, String)> = stdout
        .lines()
        .map(|line| {
            let alert = json_of(line);
            let text = |field: &str| alert[field].as_str().unwrap_or_default().to_owned();
            (text("flight_key"), text("state"), text("fired_at"))
        })
        .collect();
    tailed.sort();
    let utc = |micros: i64| {
        chrono::DateTime::from_timestamp_micros(micros)
            .expect("a time")
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    };
    let mut wanted: Vec<(String, String, String)> = expected
        .alerts
        .iter()
        .map(|(key, at)| (key.clone(), "FIRING".to_owned(), utc(*at)))
        .chain(
            expected
                .resolutions
                .iter()
                .map(|(key, at, _)| (key.clone(), "RESOLVED".to_owned(), utc(*at))),
        )
        .collect();
    wanted.sort();
    assert_eq!(tailed, wanted, "contrail alerts tail --json");
    // The board's alerts panel lists the open ones: raised and not resolved.
    let resolved: BTreeSet<&String> = expected.resolutions.iter().map(|(key, _, _)| key).collect();
    let open_expected: BTreeSet<String> = expected
        .alerts
        .iter()
        .map(|(key, _)| key.clone())
        .filter(|key| !resolved.contains(key))
        .collect();
    let board_alerts = board_json(&format!("{}api/alerts", up.board_url())).expect("the board answers");
    let open_on_board: BTreeSet<String> = board_alerts["open"]
        .as_array()
        .expect("open alerts")
        .iter()
        .map(|alert| alert["flightKey"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(open_on_board, open_expected, "the board's open alerts");
    println!(
        "alerts: {} raised, {} resolved — on the topic, in Delta, in the summary and tailed",
        expected.alerts.len(),
        expected.resolutions.len()
    );
    phase("alerts checked");
    let mut dlq = TopicReader::open(&brokers, "ops.events.dlq").expect("dead-letter topic");
    dlq.poll_for(Duration::from_secs(3)).expect("read");
    assert!(
        dlq.messages().is_empty(),
        "nothing of a valid feed is dead-lettered"
    );
    assert!(!expected.late.is_empty(), "the feed has late events");
    assert!(
        expected.duplicates >= run.min_duplicates,
        "the feed has at least {} duplicates: {}",
        run.min_duplicates,
        expected.duplicates
    );

    // Cosmos: one document per flight, equal to the expectation.
    let runtime = test_runtime();
    let documents = runtime
        .block_on(async {
            let containers = containers_at(&up.cosmos_endpoint()).await?;
            query_documents(&containers).await
        })
        .expect("documents");
    let mut essentials_wrong = Vec::new();
    for (key, accepted) in &expected.accepted {
        let events: Vec<&OperationalEvent> = accepted.iter().map(|(event, _)| event).collect();
        let want = essentials(&events);
        let got = documents.get(key).map(essentials_of);
        if got.as_ref() != Some(&want) {
            essentials_wrong.push(format!("{key}: want {want:?}, got {got:?}"));
        }
    }
    assert!(
        essentials_wrong.is_empty(),
        "{} documents differ in status/actual times/gate/version, e.g. {:?}",
        essentials_wrong.len(),
        &essentials_wrong[..essentials_wrong.len().min(3)]
    );
    // Every document field by field, against documents the test kit writes out from the
    // accepted events alone (not with the stages' fold or document code).
    let accepted_events: Vec<OperationalEvent> = expected
        .accepted
        .values()
        .flat_map(|accepted| accepted.iter().map(|(event, _)| event.clone()))
        .collect();
    let problems = contract_differences(&documents, &contract_documents(&accepted_events));
    assert!(
        problems.is_empty(),
        "{} document problems, e.g. {:?}",
        problems.len(),
        &problems[..problems.len().min(3)]
    );

    phase("Cosmos checked");
    // The change topic: every flight's final version reached it; read it for serving_changes.
    let change_ends =
        quiescent_ends(&brokers, "ops.flights.changes", Duration::from_secs(3)).expect("change ends");
    let change_total: i64 = change_ends.values().sum();
    let changes: Vec<ServingChange> = read_topic(
        &brokers,
        "ops.flights.changes",
        change_total as usize,
        Duration::from_secs(120),
    )
    .expect("changes")
    .iter()
    .map(|message| {
        use rdkafka::Message as _;
        ServingChange::decode(message.payload().unwrap_or_default()).expect("a ServingChange")
    })
    .collect();
    let mut newest: HashMap<&str, u64> = HashMap::new();
    for change in &changes {
        let version: u64 = serde_json::from_str::<serde_json::Value>(&change.document_json)
            .ok()
            .and_then(|document| document["version"].as_u64())
            .unwrap_or_default();
        let entry = newest.entry(change.flight_key.as_str()).or_default();
        *entry = (*entry).max(version);
    }
    let unchanged: Vec<&String> = expected
        .accepted
        .iter()
        .filter(|(key, accepted)| newest.get(key.as_str()).copied() != Some(accepted.len() as u64))
        .map(|(key, _)| key)
        .collect();
    assert!(
        unchanged.is_empty(),
        "{} flights' final versions are not on ops.flights.changes, e.g. {:?}",
        unchanged.len(),
        &unchanged[..unchanged.len().min(3)]
    );

    // Delta, read by the independent reader: one row per identity in every table.
    let mut identities = delta_identities(&expected);
    let change_ids: BTreeSet<String> = changes
        .iter()
        .map(|change| format!("{}#{}", change.id, change.lsn))
        .collect();
    identities.insert("serving_changes", change_ids.into_iter().collect());
    // The platform settles once delta-archiver has archived every topic up to where it ended then;
    // a change a restarted cosmos-writer produced after that may still be on its way to Delta.
    // Missing rows are waited for; an unexpected or doubled row fails at once.
    let reports = wait_until(
        "Delta to hold every expected row",
        Duration::from_secs(120),
        || {
            let reports = verify_tables(
                &up.delta_root(),
                &dir.join("verify"),
                &identities,
                &BTreeMap::new(),
            )?;
            let missing: Vec<String> = reports
                .iter()
                .filter(|(_, report)| report.missing > 0 && report.unexpected == 0)
                .map(|(table, report)| {
                    format!(
                        "{table}: {} missing, e.g. {:?}",
                        report.missing, report.missing_sample
                    )
                })
                .collect();
            Ok(if missing.is_empty() {
                Probe::Ready(reports)
            } else {
                Probe::NotYet(missing.join("; "))
            })
        },
    )
    .expect("independent reader");
    phase("Delta checked");
    for (table, report) in &reports {
        println!("{table}: {report:?}");
        assert_eq!(report.missing, 0, "{table}: missing {:?}", report.missing_sample);
        assert_eq!(
            report.unexpected, 0,
            "{table}: unexpected {:?}",
            report.unexpected_sample
        );
        assert_eq!(report.rows, report.distinct, "{table}: an identity stored twice");
    }
    assert_eq!(
        reports["late_events"].rows as usize,
        expected.late.len(),
        "every late event is in late_events"
    );

    // Ctrl-C stops every process gracefully.
    let status = up.interrupt(Duration::from_secs(90)).expect("stops");
    assert!(
        status.success(),
        "contrail up exited with {status}:\n{}",
        up.output()
    );
    phase("stopped");
    summary
}
