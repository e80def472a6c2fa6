//! `contrail up` end to end: the whole platform as processes, a month of real flights with
//! duplicates, disorder, late events and chaos (`kill -9` of every stage, repeatedly), checked
//! against an expectation the test computes from the input events itself; and the flight board in
//! headless Chromium.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use chrono::DateTime;
use contrail_integration_tests::browser::{Browser, summarize_png};
use contrail_integration_tests::cosmos::{
    compare_documents, containers_at, expected_documents, query_documents, read_documents,
};
use contrail_integration_tests::dedup::{OracleRules, expect, expected_final_state, raw_records};
use contrail_integration_tests::delta::verify_tables;
use contrail_integration_tests::up::UpUnderTest;
use contrail_integration_tests::{quiescent_ends, read_topic, test_dir};
use contrail_proto::v1::{EventType, FlightState, OperationalEvent, ServingChange};
use prost::Message as _;

/// The fields the issue names, folded from the accepted events by the test's own rules (DESIGN
/// §3.4), without the stage's fold: status from the last status-bearing event in
/// (event_time, event_id) order, actual times from OUT/OFF/ON/IN, gate from GATE_ASSIGNED/OUT.
#[derive(Debug, Default, PartialEq, Eq)]
struct Essentials {
    status: String,
    actual: [Option<i64>; 4],
    gate: Option<String>,
    version: u64,
}

fn essentials(events: &[&OperationalEvent]) -> Essentials {
    let mut ordered: Vec<&OperationalEvent> = events.to_vec();
    ordered.sort_by(|a, b| (a.event_time_us, &a.event_id).cmp(&(b.event_time_us, &b.event_id)));
    let mut result = Essentials {
        version: events.len() as u64,
        ..Essentials::default()
    };
    for event in ordered {
        let data = event.data.clone().unwrap_or_default();
        let kind = EventType::try_from(event.r#type).unwrap_or(EventType::Unspecified);
        let status = match kind {
            EventType::Scheduled => Some("SCHEDULED"),
            EventType::Boarding => Some("BOARDING"),
            EventType::Out => Some("DEPARTED"),
            EventType::Off => Some("AIRBORNE"),
            EventType::On => Some("LANDED"),
            EventType::In => Some("ARRIVED"),
            EventType::Cancelled => Some("CANCELLED"),
            EventType::Diverted => Some("DIVERTED"),
            _ => None,
        };
        if let Some(status) = status {
            result.status = status.to_owned();
        }
        let slot = match kind {
            EventType::Out => Some(0),
            EventType::Off => Some(1),
            EventType::On => Some(2),
            EventType::In => Some(3),
            _ => None,
        };
        if let Some(slot) = slot {
            result.actual[slot] = Some(event.event_time_us);
        }
        if matches!(kind, EventType::GateAssigned | EventType::Out) && data.gate.is_some() {
            result.gate = data.gate;
        }
    }
    result
}

fn micros(value: &serde_json::Value) -> Option<i64> {
    value
        .as_str()
        .and_then(|text| DateTime::parse_from_rfc3339(text).ok())
        .map(|time| time.timestamp_micros())
}

fn essentials_of(document: &serde_json::Value) -> Essentials {
    Essentials {
        status: document["status"].as_str().unwrap_or_default().to_owned(),
        actual: [
            micros(&document["actualOut"]),
            micros(&document["actualOff"]),
            micros(&document["actualOn"]),
            micros(&document["actualIn"]),
        ],
        gate: document["gate"].as_str().map(str::to_owned),
        version: document["version"].as_u64().unwrap_or_default(),
    }
}

#[test]
fn contrail_up_replays_a_month_with_chaos_and_every_store_is_exactly_once() {
    let dir = test_dir("contrail-up-month");
    let mut up = UpUnderTest::start(
        &dir,
        &[
            "--from",
            "2013-01-01",
            "--to",
            "2013-01-31",
            "--rate",
            "4000",
            "--straggler-rate",
            "0.005",
            "--chaos",
            "--chaos-interval-s",
            "3",
            "--chaos-min-kills",
            "2",
            "--drain-timeout-s",
            "600",
        ],
    )
    .expect("contrail up starts");
    let summary = up
        .wait_summary(Duration::from_secs(900))
        .expect("contrail up settles");
    let output = up.output();
    println!("{output}");

    // What contrail up itself reports.
    assert_eq!(summary["passed"], true, "its own checks: {:#}", summary["checks"]);
    let distinct = summary["distinct_events"].as_u64().unwrap_or_default();
    assert!(
        distinct >= 150_000,
        "a month is at least 150,000 events: {distinct}"
    );
    for stage in [
        "ingest",
        "dedup-state",
        "cosmos-writer",
        "changefeed-sync",
        "delta-archiver",
    ] {
        let kills = summary["kills"][stage].as_u64().unwrap_or_default();
        assert!(kills >= 2, "{stage} was killed {kills} times");
    }
    assert!(
        output.matches("chaos: kill -9").count() >= 10,
        "the kills are reported as they happen"
    );

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
    let expected = expect(&records, OracleRules::default());
    let acknowledged = summary["acknowledged"].as_u64().unwrap_or_default();
    assert!(
        records.len() as u64 >= acknowledged,
        "every acknowledged record is on the raw topic"
    );
    assert!(!expected.late.is_empty(), "the feed has late events");
    assert!(
        expected.duplicates > 10_000,
        "the feed has duplicates: {}",
        expected.duplicates
    );

    // Cosmos: one document per flight, equal to the expectation.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
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
    let finals: Vec<FlightState> = expected
        .accepted
        .values()
        .map(|accepted| expected_final_state(accepted))
        .collect();
    let problems = compare_documents(&documents, &expected_documents(&finals));
    assert!(
        problems.is_empty(),
        "{} document problems, e.g. {:?}",
        problems.len(),
        &problems[..problems.len().min(3)]
    );

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
    let mut identities: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    identities.insert(
        "events",
        expected
            .accepted
            .values()
            .flatten()
            .map(|(event, _)| event.event_id.clone())
            .collect(),
    );
    identities.insert(
        "flight_states",
        expected
            .accepted
            .iter()
            .flat_map(|(key, accepted)| (1..=accepted.len()).map(move |version| format!("{key}#{version}")))
            .collect(),
    );
    identities.insert(
        "late_events",
        expected
            .late
            .iter()
            .map(|(partition, offset)| format!("{partition}#{offset}"))
            .collect(),
    );
    let change_ids: BTreeSet<String> = changes
        .iter()
        .map(|change| format!("{}#{}", change.id, change.lsn))
        .collect();
    identities.insert("serving_changes", change_ids.into_iter().collect());
    let reports = verify_tables(
        &up.delta_root(),
        &dir.join("verify"),
        &identities,
        &BTreeMap::new(),
    )
    .expect("independent reader");
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
}

#[test]
fn the_flight_board_updates_live_and_shows_a_flights_history_in_chromium() {
    let dir = test_dir("contrail-up-board");
    let mut up = UpUnderTest::start(
        &dir,
        &[
            "--from",
            "2013-01-02",
            "--to",
            "2013-01-02",
            "--rate",
            "300",
            "--latency-sample-every",
            "0",
        ],
    )
    .expect("contrail up starts");
    let board = up.board_url();
    contrail_integration_tests::wait_for_port(
        board.trim_start_matches("http://").trim_end_matches('/'),
        Duration::from_secs(60),
    )
    .expect("the board listens");
    let browser = Browser::start(&dir.join("browser")).expect("headless chromium");
    browser.goto(&board).expect("open the board");

    // Live: while the replay runs, the board's rows change without a reload.
    let first: Vec<String> = browser
        .wait_for("departures on the board", Duration::from_secs(120), |browser| {
            let rows = browser.texts("#board tbody tr[data-key]")?;
            Ok((rows.len() >= 5).then_some(rows))
        })
        .expect("rows");
    let changed = browser
        .wait_for(
            "the board to change while the replay runs",
            Duration::from_secs(60),
            |browser| {
                let rows = browser.texts("#board tbody tr[data-key]")?;
                Ok((rows != first).then_some(rows))
            },
        )
        .expect("a live update");
    assert_ne!(changed, first);

    // After the replay: what a row shows is what Cosmos holds.
    let summary = up.wait_summary(Duration::from_secs(600)).expect("settles");
    assert_eq!(summary["passed"], true, "{:#}", summary["checks"]);
    std::thread::sleep(Duration::from_secs(3));
    let keys: Vec<String> = browser
        .execute(
            "return [...document.querySelectorAll('#board tbody tr[data-key]')].map(r => r.dataset.key)",
            vec![],
        )
        .expect("keys");
    assert!(!keys.is_empty());
    let statuses = browser
        .texts("#board tbody tr[data-key] td.status")
        .expect("statuses");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let documents = runtime
        .block_on(async {
            let containers = containers_at(&up.cosmos_endpoint()).await?;
            read_documents(&containers, &keys).await
        })
        .expect("documents");
    for (key, status) in keys.iter().zip(&statuses) {
        assert_eq!(
            documents[key]["status"].as_str(),
            Some(status.trim()),
            "{key} on the board"
        );
        assert_eq!(
            documents[key]["origin"], "EWR",
            "the default board is EWR departures"
        );
        assert_eq!(documents[key]["serviceDate"], "2013-01-02");
    }

    // A flight's detail: its history from Delta, one row per version.
    let key = &keys[keys.len() / 2];
    browser
        .click(&format!("#board tbody tr[data-key='{key}']"))
        .expect("click a flight");
    let version = documents[key]["version"].as_u64().expect("version") as usize;
    let history = browser
        .wait_for("the flight's history", Duration::from_secs(30), |browser| {
            let rows = browser.texts("#history tbody tr.history-row")?;
            Ok((rows.len() == version).then_some(rows))
        })
        .expect("history rows");
    assert!(history[0].starts_with('1'), "version 1 first: {:?}", history[0]);
    let title = browser.texts("#detail-title").expect("title");
    assert!(title[0].contains("EWR →"), "{title:?}");

    // Filters: a carrier shows only its flights.
    browser
        .execute::<serde_json::Value>(
            "const c = document.getElementById('carrier'); c.value = 'UA'; c.dispatchEvent(new Event('change')); return null;",
            vec![],
        )
        .expect("filter");
    browser
        .wait_for("only UA flights", Duration::from_secs(20), |browser| {
            let flights = browser.texts("#board tbody tr[data-key] td.flight")?;
            Ok((!flights.is_empty() && flights.iter().all(|flight| flight.starts_with("UA "))).then_some(()))
        })
        .expect("carrier filter");

    // What it looks like (from the top: header, filters, board and the detail panel).
    browser
        .execute::<serde_json::Value>("window.scrollTo(0, 0); return null;", vec![])
        .expect("scroll");
    std::thread::sleep(Duration::from_millis(300));
    let png = browser.screenshot_png().expect("screenshot");
    std::fs::write(dir.join("board.png"), &png).expect("save screenshot");
    let picture = summarize_png(&png).expect("a PNG");
    println!("board screenshot: {picture:?} in {}", dir.display());
    assert!(picture.width >= 1000 && picture.height >= 700, "{picture:?}");
    assert!(
        picture.distinct_colours >= 8,
        "a rendered board has colours: {picture:?}"
    );
    assert!(
        picture.non_background_share > 0.05,
        "the board is not blank: {picture:?}"
    );

    drop(browser);

    // The operator's tools against the same platform.
    operate(&up, key, &documents[key]);

    let status = up.interrupt(Duration::from_secs(90)).expect("stops");
    assert!(
        status.success(),
        "contrail up exited with {status}:\n{}",
        up.output()
    );
}

/// Runs `contrail ARGS` (with the platform's port offset); (success, stdout, stderr).
fn contrail(up: &UpUnderTest, args: &[&str]) -> (bool, String, String) {
    let output = std::process::Command::new(
        contrail_integration_tests::workspace_binary("contrail").expect("contrail"),
    )
    .args(args)
    .env("CONTRAIL_PORT_OFFSET", up.offset.to_string())
    .output()
    .expect("run contrail");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn json_of(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|error| panic!("not JSON ({error}): {text}"))
}

/// `contrail admin` (every RPC) and `contrail flights` against a running platform.
fn operate(up: &UpUnderTest, key: &str, document: &serde_json::Value) {
    // Status of every stage, as a table and as JSON lines.
    let (ok, table, _) = contrail(up, &["admin", "status"]);
    assert!(ok, "{table}");
    for stage in [
        "ingest",
        "dedup-state",
        "cosmos-writer",
        "changefeed-sync",
        "delta-archiver",
    ] {
        assert!(table.contains(stage), "{stage} in {table}");
    }
    let (ok, lines, _) = contrail(up, &["admin", "status", "--json"]);
    assert!(ok);
    let statuses: Vec<serde_json::Value> = lines.lines().map(json_of).collect();
    assert_eq!(statuses.len(), 5, "{lines}");
    assert!(statuses.iter().all(|status| status["up"] == true), "{lines}");
    let dedup = statuses
        .iter()
        .find(|status| status["stage"] == "dedup-state")
        .expect("dedup-state");
    assert_eq!(dedup["partitions_owned"], 4, "{dedup}");

    // A flight's state, dedup entries and timers in dedup-state.
    let (ok, out, err) = contrail(up, &["admin", "--stage", "dedup-state", "state", key, "--json"]);
    assert!(ok, "{err}");
    let state = json_of(&out);
    assert_eq!(state["found"], true, "{state}");
    assert_eq!(
        state["dedup_event_ids"].as_array().map(Vec::len),
        document["version"].as_u64().map(|v| v as usize),
        "one dedup entry per accepted event: {state}"
    );
    let (ok, out, _) = contrail(up, &["admin", "--stage", "dedup-state", "state", key]);
    assert!(ok && out.contains(key), "{out}");

    // Checkpoints: trigger one, find it listed and complete.
    let (ok, out, err) = contrail(up, &["admin", "--stage", "dedup-state", "checkpoint", "--json"]);
    assert!(ok, "{err}");
    let epoch = json_of(&out)["epoch"].as_u64().expect("epoch");
    assert!(epoch > 0);
    let (ok, out, _) = contrail(up, &["admin", "--stage", "dedup-state", "checkpoints", "--json"]);
    assert!(ok);
    let listed = json_of(&out);
    assert!(
        listed["checkpoints"].as_array().is_some_and(|all| all
            .iter()
            .any(|c| c["epoch"].as_u64() == Some(epoch) && c["complete"] == true)),
        "epoch {epoch} in {listed}"
    );
    let (_, out, err) = contrail(
        up,
        &["admin", "--stage", "dedup-state", "restore", &epoch.to_string()],
    );
    // dedup-state answers with the restore procedure (stop, delete the shards, start) rather than
    // restoring under a running processor; the answer is shown either way.
    assert!(out.starts_with("accepted: "), "{out}{err}");

    // Pause and resume a consumer.
    let (ok, out, _) = contrail(up, &["admin", "--stage", "cosmos-writer", "pause", "--json"]);
    assert!(ok && json_of(&out)["paused"] == true, "{out}");
    let (ok, out, _) = contrail(up, &["admin", "--stage", "cosmos-writer", "status", "--json"]);
    assert!(ok && json_of(&out)["paused"] == true, "{out}");
    let (ok, out, _) = contrail(up, &["admin", "--stage", "cosmos-writer", "resume", "--json"]);
    assert!(ok && json_of(&out)["paused"] == false, "{out}");

    // A stage without state says so.
    let (ok, _, err) = contrail(up, &["admin", "--stage", "ingest", "state", key]);
    assert!(!ok && err.contains("does not support"), "{err}");
    // A bad stage name is named.
    let (ok, _, err) = contrail(up, &["admin", "--stage", "dedup", "status"]);
    assert!(!ok && err.contains("dedup"), "{err}");

    // Drain: the stage finishes, exits, and contrail up's supervisor starts it again.
    let (ok, out, err) = contrail(up, &["admin", "--stage", "changefeed-sync", "drain", "--json"]);
    assert!(ok && json_of(&out)["draining"] == true, "{out}{err}");

    // The serving store.
    let (ok, out, err) = contrail(up, &["flights", "get", key, "--json"]);
    assert!(ok, "{err}");
    assert_eq!(&json_of(&out), document);
    let (ok, out, _) = contrail(up, &["flights", "get", key]);
    assert!(
        ok && out.contains(&format!(
            "status         {}",
            document["status"].as_str().unwrap_or_default()
        )),
        "{out}"
    );
    let (ok, _, err) = contrail(up, &["flights", "get", "UA1-2099-01-01-EWR"]);
    assert!(!ok && err.contains("no flight UA1-2099-01-01-EWR"), "{err}");
    let (ok, out, err) = contrail(
        up,
        &["flights", "export", "--date", "2013-01-02", "--origin", "EWR"],
    );
    assert!(ok, "{err}");
    let exported: Vec<serde_json::Value> = out.lines().map(json_of).collect();
    assert!(
        exported.len() > 100,
        "EWR departures of the day: {}",
        exported.len()
    );
    assert!(
        exported
            .iter()
            .all(|flight| flight["origin"] == "EWR" && flight["serviceDate"] == "2013-01-02")
    );
    assert!(exported.iter().any(|flight| flight["id"] == key));
}
