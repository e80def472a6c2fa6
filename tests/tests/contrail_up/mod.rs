//! `contrail up` end to end: the whole platform as processes, a month of real flights with
//! duplicates, disorder, late events and chaos (`kill -9` of every stage, repeatedly), checked
//! against an expectation the test computes from the input events itself; and the flight board in
//! headless Chromium.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use chrono::DateTime;
use contrail_proto::v1::{EventType, FlightState, OperationalEvent, ServingChange};
use contrail_testkit::browser::{Browser, summarize_png};
use contrail_testkit::cosmos::{
    containers_at, contract_differences, contract_documents, query_documents, read_documents,
};
use contrail_testkit::dedup::{OracleRules, alerts_on_topic, delta_identities, expect, raw_records};
use contrail_testkit::delta::verify_tables;
use contrail_testkit::otlp::ReceivedSpan;
use contrail_testkit::prometheus::stage_pid;
use contrail_testkit::up::UpUnderTest;
use contrail_testkit::{Probe, TopicReader, quiescent_ends, read_topic, test_dir, wait_until};

use prost::Message as _;

mod board;
mod chaos;
mod check;
mod rotation;
mod serving;
mod trace;

/// A flight's essential fields, folded from the accepted events by the test's own rules
/// (docs/CONTRACT.md, the fold), without the stage's fold: status from the last status-bearing event in
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

/// `contrail up --no-replay` in test directory `name`, waiting for producers with ingest token
/// `token`.
fn idle_platform(name: &str, token: &str) -> UpUnderTest {
    let dir = test_dir(name);
    let mut up =
        UpUnderTest::start(&dir, &["--no-replay", "--ingest-token", token]).expect("contrail up starts");
    up.wait_phase(
        "the platform to wait for producers",
        Duration::from_secs(300),
        |phase| phase.starts_with("idle"),
    )
    .expect("idle");
    up
}

/// Waits (up to 300 s) until the serving store holds, for every flight of the raw topic (a day of
/// flights at least), the document the test's own fold of the raw topic says — and no other
/// document.
/// `contrail backfill serving` from `up`'s Delta history into its Cosmos endpoint, with `extra`
/// arguments: what it printed, once it succeeded.
fn backfill_serving(up: &UpUnderTest, extra: &[&str]) -> String {
    let contrail_bin = contrail_testkit::workspace_binary("contrail").expect("contrail");
    let output = std::process::Command::new(&contrail_bin)
        .args(["backfill", "serving", "--from-delta"])
        .arg(up.delta_root())
        .args([
            "--cosmos-endpoint",
            &up.cosmos_endpoint(),
            "--brokers",
            &up.brokers(),
            "--quiet",
        ])
        .args(extra)
        .output()
        .expect("run contrail backfill serving");
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    println!("contrail backfill serving printed:\n{printed}");
    assert!(
        output.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    printed
}

fn served_as_the_raw_topic_says(up: &UpUnderTest) {
    let brokers = up.brokers();
    let ends = quiescent_ends(&brokers, "ops.events.raw", Duration::from_secs(3)).expect("raw ends");
    let raw = read_topic(
        &brokers,
        "ops.events.raw",
        ends.values().sum::<i64>() as usize,
        Duration::from_secs(120),
    )
    .expect("raw topic");
    let expected = expect(&raw_records(&raw), OracleRules::default());
    assert!(
        expected.accepted.len() > 800,
        "a day of flights: {}",
        expected.accepted.len()
    );
    let runtime = test_runtime();
    let containers = runtime
        .block_on(containers_at(&up.cosmos_endpoint()))
        .expect("containers");
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        let documents = runtime.block_on(query_documents(&containers)).unwrap_or_default();
        let mut wrong: Vec<String> = expected
            .accepted
            .iter()
            .filter_map(|(key, accepted)| {
                let events: Vec<&OperationalEvent> = accepted.iter().map(|(event, _)| event).collect();
                let want = essentials(&events);
                let got = documents.get(key).map(essentials_of);
                (got.as_ref() != Some(&want)).then(|| format!("{key}: want {want:?}, got {got:?}"))
            })
            .collect();
        wrong.extend(
            documents
                .keys()
                .filter(|key| !expected.accepted.contains_key(*key))
                .map(|key| format!("{key}: served, but no event of it was accepted")),
        );
        if wrong.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} documents still differ after 300 s, e.g. {:?}\n{}",
            wrong.len(),
            &wrong[..wrong.len().min(3)],
            up.output_tail(40)
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// Runs `contrail ARGS` (with the platform's port offset); (success, stdout, stderr).
fn contrail(up: &UpUnderTest, args: &[&str]) -> (bool, String, String) {
    let output =
        std::process::Command::new(contrail_testkit::workspace_binary("contrail").expect("contrail"))
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

/// A JSON answer of the board's API (`200` required).
fn board_json(url: &str) -> anyhow::Result<serde_json::Value> {
    let answer = contrail_testkit::http_get(url)?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "GET {url}: {head}\n{body}");
    Ok(serde_json::from_str(body.trim())?)
}

fn json_of(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|error| panic!("not JSON ({error}): {text}"))
}

/// A Tokio runtime for the test's own clients and servers (two workers).
fn test_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}
