//! The rotation extension: every flight's knock-on prediction served, against an independent
//! expectation.

use super::*;

/// `contrail up --rotation`: the knock-on delay extension runs as two more
/// deployments — dedup-state with `processor = "rotation"` on the flight deployment's by-tail
/// states, cosmos-writer with `input = "predictions"` — next to the five stages. Half a day of
/// real flights later, every flight document with an aircraft and a schedule carries the prediction the
/// independent expectation (`contrail_testkit::rotation`, written apart from the processor)
/// computes from the documents' own flight fields, some of them knocked on by their inbound.
#[test]
fn contrail_up_with_the_rotation_extension_serves_every_flights_knock_on_prediction() {
    use contrail_testkit::rotation::{expected_predictions, has_rotation};
    const TOKEN: &str = "rotation-test-ingest-token-0123456789";
    let dir = test_dir("contrail-up-rotation");
    let mut up = UpUnderTest::start(
        &dir,
        &[
            "--no-replay",
            "--rotation",
            "--ingest-token",
            TOKEN,
            "--from",
            "2013-06-10",
            "--to",
            "2013-06-10",
        ],
    )
    .expect("contrail up starts");
    up.wait_phase(
        "the platform to wait for producers",
        Duration::from_secs(300),
        |phase| phase.starts_with("idle"),
    )
    .expect("idle");
    let rotation_http = format!("http://127.0.0.1:{}", 8085 + up.offset);
    let predictions_http = format!("http://127.0.0.1:{}", 8086 + up.offset);
    for url in [&rotation_http, &predictions_http] {
        if let Probe::NotYet(answer) = contrail_testkit::answers_200(&format!("{url}/readyz")) {
            panic!("{url} is not ready: {answer}\n{}", up.output_tail(30));
        }
    }
    let contrail_bin = contrail_testkit::workspace_binary("contrail").expect("contrail");
    let replayed = std::process::Command::new(&contrail_bin)
        .args(["replay", "--url", &up.ingest_url()])
        .args(["--from", "2013-06-10", "--to", "2013-06-10"])
        // The day's feed up to about mid-day: the afternoon's flights still to leave, some behind
        // their aircraft's late inbound.
        .args(["--seed", "7", "--rate", "400", "--limit", "4500", "--quiet"])
        .env("CONTRAIL_INGEST_TOKEN", TOKEN)
        .output()
        .expect("run contrail replay");
    assert!(
        replayed.status.success(),
        "{}{}",
        String::from_utf8_lossy(&replayed.stdout),
        String::from_utf8_lossy(&replayed.stderr)
    );

    // The pipeline drained: the flight deployment, cosmos-writer, the rotation deployment and the
    // predictions writer at lag 0 on every partition, twice a second apart.
    let admin = [9091, 9192, 9195, 9196].map(|port| format!("http://127.0.0.1:{}", port + up.offset));
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let mut drained = 0;
    while drained < 2 {
        let lags: Vec<i64> = admin
            .iter()
            .map(|url| {
                contrail_testkit::cosmos::status_at(url)
                    .map(|status| status.partitions.iter().map(|p| p.lag.max(0)).sum())
                    .unwrap_or(i64::MAX)
            })
            .collect();
        drained = if lags.iter().all(|lag| *lag == 0) {
            drained + 1
        } else {
            0
        };
        assert!(
            std::time::Instant::now() < deadline,
            "lags {lags:?} after 180 s\n{}",
            up.output_tail(30)
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    // `contrail admin` knows the extension's deployments: `status` lists them after the five, up
    // and ready, and `--stage rotation` reaches the rotation deployment.
    let (ok, stdout, stderr) = contrail(&up, &["admin", "status", "--json"]);
    assert!(ok, "contrail admin status: {stderr}");
    let rows: Vec<serde_json::Value> = stdout.lines().map(json_of).collect();
    let stages: Vec<&str> = rows.iter().filter_map(|row| row["stage"].as_str()).collect();
    assert_eq!(
        stages,
        [
            "ingest",
            "dedup-state",
            "cosmos-writer",
            "changefeed-sync",
            "delta-archiver",
            "rotation",
            "cosmos-predictions"
        ],
        "{stdout}"
    );
    for (row, binary) in rows[5..].iter().zip(["dedup-state", "cosmos-writer"]) {
        assert!(row["up"] == true && row["ready"] == true, "{row}");
        assert_eq!(row["binary"], binary, "{row}");
    }
    let (ok, stdout, stderr) = contrail(&up, &["admin", "--stage", "rotation", "status", "--json"]);
    assert!(ok, "contrail admin --stage rotation status: {stderr}");
    let rotation = json_of(&stdout);
    assert_eq!(
        rotation["address"], admin[2],
        "the rotation deployment's admin port"
    );
    assert_eq!(rotation["stage"], "rotation", "{rotation}");
    let runtime = test_runtime();
    let containers = runtime
        .block_on(containers_at(&up.cosmos_endpoint()))
        .expect("containers");
    let state_of = |document: &serde_json::Value| FlightState {
        flight_key: document["id"].as_str().unwrap_or_default().to_owned(),
        carrier: document["carrier"].as_str().unwrap_or_default().to_owned(),
        status: document["status"].as_str().unwrap_or_default().to_owned(),
        tail_number: document["tailNumber"].as_str().map(str::to_owned),
        scheduled_out_us: micros(&document["scheduledOut"]),
        scheduled_in_us: micros(&document["scheduledIn"]),
        estimated_out_us: micros(&document["estimatedOut"]),
        estimated_in_us: micros(&document["estimatedIn"]),
        actual_out_us: micros(&document["actualOut"]),
        actual_in_us: micros(&document["actualIn"]),
        version: document["version"].as_u64().unwrap_or_default(),
        ..FlightState::default()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let (expected, problems, documents) = loop {
        let documents = runtime.block_on(query_documents(&containers)).unwrap_or_default();
        let states: Vec<FlightState> = documents.values().map(state_of).collect();
        let expected = expected_predictions(&states);
        let mut problems = Vec::new();
        for (key, want) in &expected {
            let document = &documents[key];
            let got = (
                micros(&document["predictedOut"]),
                micros(&document["predictedIn"]),
                document["knockOnFrom"].as_str().unwrap_or_default(),
            );
            if got != (Some(want.departure), want.arrival, want.cause.as_str()) {
                problems.push(format!("{key}: got {got:?}, want {want:?}"));
            }
        }
        let rotating = states.iter().filter(|state| has_rotation(state)).count();
        if documents.len() > 500 && problems.is_empty() {
            println!(
                "{} documents, {rotating} in a rotation, {} predicted, {} knocked on by their inbound",
                documents.len(),
                expected.len(),
                expected.values().filter(|want| !want.cause.is_empty()).count()
            );
            break (expected, problems, documents);
        }
        if std::time::Instant::now() > deadline {
            break (expected, problems, documents);
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    assert!(
        problems.is_empty(),
        "{} flights without the expected prediction after 300 s, e.g. {:?}\n{}",
        problems.len(),
        &problems[..problems.len().min(10)],
        up.output_tail(30)
    );
    assert!(
        expected.values().any(|want| !want.cause.is_empty()),
        "a day of real rotations knocks some flight on"
    );
    // The board: a knocked-on flight's row shows its predicted departure and the inbound flight
    // (the departures of its airport on its date, found by its number), its detail both fields.
    let (key, want) = expected
        .iter()
        .find(|(_, want)| !want.cause.is_empty())
        .expect("a knocked-on flight");
    let number = key.split('-').next().unwrap_or_default().to_owned();
    let origin = key.rsplit('-').next().unwrap_or_default().to_owned();
    let inbound = want.cause.split('-').next().unwrap_or_default().to_owned();
    let browser = Browser::start(&dir.join("browser")).expect("headless chromium");
    browser.goto(&up.board_url()).expect("open the board");
    let shown: String = browser
        .wait_for(
            "the knocked-on flight's row to show its prediction",
            Duration::from_secs(60),
            |browser| {
                browser.execute::<bool>(
                    "document.getElementById('airport').value = arguments[0];\
                     document.getElementById('date').value = '2013-06-10';\
                     document.getElementById('search').value = arguments[1]; refresh(); return true",
                    vec![origin.clone().into(), number.clone().into()],
                )?;
                let cells: Vec<String> = browser.execute(
                    "return [...document.querySelectorAll('#board tbody tr[data-key]')]\
                       .filter(r => r.dataset.key === arguments[0])\
                       .map(r => r.querySelector('td.expected').innerText)",
                    vec![key.clone().into()],
                )?;
                Ok(match cells.first() {
                    Some(text) if text.contains("pred") && text.contains(&inbound) => {
                        Probe::Ready(text.clone())
                    }
                    other => Probe::NotYet(format!("{key}'s cell: {other:?}")),
                })
            },
        )
        .expect("the prediction on the board");
    browser
        .click(&format!("#board tbody tr[data-key='{key}']"))
        .expect("open the flight's detail");
    let detail: String = browser
        .wait_for(
            "the detail to name the inbound",
            Duration::from_secs(30),
            |browser| {
                let text = browser.texts("#detail-fields")?.join(" ");
                Ok(if text.contains(&want.cause) {
                    Probe::Ready(text)
                } else {
                    Probe::NotYet(text)
                })
            },
        )
        .expect("the detail");
    assert!(detail.contains("Predicted out"), "{detail}");
    println!("{key} on the board: {shown:?}");

    // The serving store lost: `contrail backfill serving` rebuilds it from the history, the
    // predictions included (Delta `predictions`), every flight's fields as they were.
    let prediction_of = |document: &serde_json::Value| {
        (
            micros(&document["predictedOut"]),
            document["knockOnFrom"].as_str().map(str::to_owned),
            document["predictionVersion"].as_u64(),
        )
    };
    let before: BTreeMap<&String, _> = expected
        .keys()
        .map(|key| (key, prediction_of(&documents[key])))
        .collect();
    runtime
        .block_on(containers.flights.delete(None))
        .expect("delete the flights container");
    let printed = backfill_serving(&up, &[]);
    assert!(printed.contains("the newest predictions of"), "{printed}");
    let rebuilt = runtime
        .block_on(async { query_documents(&containers_at(&up.cosmos_endpoint()).await?).await })
        .expect("the rebuilt documents");
    let mut lost = Vec::new();
    for (key, was) in &before {
        let now = rebuilt.get(key.as_str()).map(prediction_of);
        if now.as_ref() != Some(was) {
            lost.push(format!("{key}: {was:?} → {now:?}"));
        }
    }
    assert!(
        lost.is_empty(),
        "{} predictions not as before the rebuild, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    let metric = |url: &str, name: &str| contrail_testkit::cosmos::metric_at(url, name, "");
    assert_eq!(
        metric(&predictions_http, "contrail_cosmos_writer_dead_letters_total"),
        0.0
    );
    assert!(
        metric(
            &predictions_http,
            "contrail_cosmos_writer_documents_written_total"
        ) > 0.0
    );
    let status = up.interrupt(Duration::from_secs(90)).expect("stops");
    assert!(
        status.success(),
        "contrail up exited with {status}:\n{}",
        up.output()
    );
}
