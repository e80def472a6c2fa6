//! The flight board in headless Chromium, the admin CLI against a running platform, and the
//! shipped alert rules in a real Prometheus.

use super::*;

const BOARD_TOKEN: &str = "board-test-ingest-token-0123456789";

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
            "100",
            "--latency-sample-every",
            "0",
            "--ingest-token",
            BOARD_TOKEN,
        ],
    )
    .expect("contrail up starts");
    // The board answers as soon as contrail up runs (its data routes say "starting" until the
    // stores are open); the replay starts once every consumer owns its partitions.
    up.wait_phase("the flight board to answer", Duration::from_secs(120), |_| true)
        .expect("the board answers");
    let board = up.board_url();
    let browser = Browser::start(&dir.join("browser")).expect("headless chromium");
    browser.goto(&board).expect("open the board");

    // Live: while the replay runs, the board's rows change without a reload.
    let first: Vec<String> = browser
        .wait_for(
            "five departures on the board",
            Duration::from_secs(300),
            |browser| {
                let rows = browser.texts("#board tbody tr[data-key]")?;
                Ok(if rows.len() >= 5 {
                    Probe::Ready(rows)
                } else {
                    Probe::NotYet(format!(
                        "{} rows; header {:?}",
                        rows.len(),
                        browser.texts("#pipeline")?
                    ))
                })
            },
        )
        .expect("rows");
    let phase_at_first = up.meta().map(|meta| meta["phase"].clone()).unwrap_or_default();
    assert_eq!(
        phase_at_first, "replaying",
        "the first rows were seen while the replay runs (the rate leaves minutes for it)"
    );
    let changed = browser
        .wait_for(
            "the board to change while the replay runs",
            Duration::from_secs(60),
            |browser| {
                let rows = browser.texts("#board tbody tr[data-key]")?;
                Ok(if rows != first {
                    Probe::Ready(rows)
                } else {
                    Probe::NotYet(format!("the same {} rows as first seen", rows.len()))
                })
            },
        )
        .expect("a live update");
    assert_ne!(changed, first);

    // After the replay: what each row shows is what Cosmos holds (read in one script, so keys and
    // statuses come from the same refresh; the board refreshes every 2 s).
    let summary = up.wait_summary(Duration::from_secs(900)).expect("settles");
    assert_eq!(summary["passed"], true, "{:#}", summary["checks"]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let containers = runtime
        .block_on(containers_at(&up.cosmos_endpoint()))
        .expect("Cosmos client");
    let (keys, documents) = browser
        .wait_for(
            "every row of the board to show its flight's status in Cosmos",
            Duration::from_secs(60),
            |browser| {
                let rows: Vec<(String, String)> = browser.execute(
                    "return [...document.querySelectorAll('#board tbody tr[data-key]')]\
                       .map(r => [r.dataset.key, r.querySelector('td.status').innerText.trim()])",
                    vec![],
                )?;
                let keys: Vec<String> = rows.iter().map(|(key, _)| key.clone()).collect();
                if keys.is_empty() {
                    return Ok(Probe::NotYet("no rows".to_owned()));
                }
                let documents = runtime.block_on(read_documents(&containers, &keys))?;
                let differing: Vec<String> = rows
                    .iter()
                    .filter(|(key, status)| {
                        documents
                            .get(key)
                            .and_then(|document| document["status"].as_str())
                            != Some(status.as_str())
                    })
                    .map(|(key, status)| {
                        let cosmos = documents.get(key).map(|document| document["status"].clone());
                        format!("{key}: board {status}, Cosmos {cosmos:?}")
                    })
                    .collect();
                Ok(if differing.is_empty() {
                    Probe::Ready((keys, documents))
                } else {
                    Probe::NotYet(format!(
                        "{} rows differ, e.g. {:?}",
                        differing.len(),
                        &differing[..differing.len().min(3)]
                    ))
                })
            },
        )
        .expect("the board agrees with Cosmos");
    for key in &keys {
        assert_eq!(
            documents[key]["origin"], "EWR",
            "the default board is EWR departures"
        );
        assert_eq!(documents[key]["serviceDate"], "2013-01-02");
    }

    // Local times: each row's scheduled time is its departure in New York (EST in January, UTC−5),
    // the UTC time on hover.
    let times: Vec<(String, String, String)> = browser
        .execute(
            "return [...document.querySelectorAll('#board tbody tr[data-key]')]\
               .map(r => { const t = r.querySelector('td.time span.local'); \
                 return [r.dataset.key, t.dataset.utc, t.innerText.trim()]; })",
            vec![],
        )
        .expect("times");
    for (key, utc, shown) in &times {
        assert_eq!(
            Some(utc.as_str()),
            documents[key]["scheduledOut"].as_str(),
            "{key}"
        );
        let new_york =
            chrono::DateTime::parse_from_rfc3339(utc).expect("an RFC 3339 time") - chrono::Duration::hours(5);
        assert_eq!(
            shown,
            &new_york.format("%H:%M").to_string(),
            "{key}: {utc} in New York"
        );
    }
    // Paging: the count is every EWR departure of the day in Cosmos; the next page shows others.
    let all = runtime
        .block_on(query_documents(&containers))
        .expect("every document");
    let departures = all
        .values()
        .filter(|document| document["origin"] == "EWR" && document["serviceDate"] == "2013-01-02")
        .count();
    let count = browser.texts("#count").expect("count");
    assert_eq!(
        count[0],
        format!("1–{} of {departures} flights", keys.len().min(100)),
        "the count of the whole filter, not of the page"
    );
    if departures > 100 {
        browser.click("#next").expect("next page");
        browser
            .wait_for("the second page", Duration::from_secs(30), |browser| {
                let shown = browser.texts("#count")?;
                let rows = browser.execute::<Vec<String>>(
                    "return [...document.querySelectorAll('#board tbody tr[data-key]')].map(r => r.dataset.key)",
                    vec![],
                )?;
                Ok(
                    if shown[0].starts_with("101–") && rows.iter().all(|row| !keys.contains(row)) {
                        Probe::Ready(())
                    } else {
                        Probe::NotYet(format!("{shown:?}, {} rows", rows.len()))
                    },
                )
            })
            .expect("page 2");
        browser.click("#prev").expect("back to page 1");
    }
    // Search: a flight by its number, typed as people type it.
    let wanted = &keys[keys.len() / 3];
    let flight = &documents[wanted];
    let typed = format!(
        "{} {}",
        flight["carrier"].as_str().unwrap_or_default().to_lowercase(),
        flight["flightNumber"]
    );
    browser
        .execute::<serde_json::Value>(
            "const s = document.getElementById('search'); s.value = arguments[0]; s.dispatchEvent(new Event('input')); return null;",
            vec![serde_json::Value::String(typed.clone())],
        )
        .expect("search");
    browser
        .wait_for("the searched flight alone", Duration::from_secs(30), |browser| {
            let rows: Vec<String> = browser.execute(
                "return [...document.querySelectorAll('#board tbody tr[data-key]')].map(r => r.dataset.key)",
                vec![],
            )?;
            Ok(if rows == [wanted.clone()] {
                Probe::Ready(())
            } else {
                Probe::NotYet(format!("searching {typed:?}: rows {rows:?}"))
            })
        })
        .expect("search by flight number");
    browser
        .execute::<serde_json::Value>(
            "const s = document.getElementById('search'); s.value = ''; s.dispatchEvent(new Event('input')); return null;",
            vec![],
        )
        .expect("clear the search");

    // The alerts panel: what /api/alerts says is open for the board's date, and the board marks
    // exactly those of its rows OVERDUE.
    let (open, marked): (BTreeSet<String>, BTreeSet<String>) = browser
        .wait_for("the alerts panel", Duration::from_secs(60), |browser| {
            let api = board_json(&format!("{board}api/alerts?date=2013-01-02"))?;
            let open: BTreeSet<String> = api["open"]
                .as_array()
                .map(|open| {
                    open.iter()
                        .map(|alert| alert["flightKey"].as_str().unwrap_or_default().to_owned())
                        .collect()
                })
                .unwrap_or_default();
            let listed: Vec<String> = browser.execute(
                "return [...document.querySelectorAll('#alerts-list li.alert-row')].map(r => r.dataset.key)",
                vec![],
            )?;
            let marked: Vec<String> = browser.execute(
                "return [...document.querySelectorAll('#board tbody tr.overdue')].map(r => r.dataset.key)",
                vec![],
            )?;
            let listed: BTreeSet<String> = listed.into_iter().collect();
            let rows = browser.texts("#board tbody tr[data-key]")?.len();
            Ok(if listed == open && rows == keys.len() {
                Probe::Ready((open, marked.into_iter().collect()))
            } else {
                Probe::NotYet(format!("panel {listed:?}, API {open:?}"))
            })
        })
        .expect("the alerts panel lists the open alerts");
    let on_board: BTreeSet<String> = keys.iter().cloned().collect();
    assert_eq!(
        marked,
        open.intersection(&on_board)
            .cloned()
            .collect::<BTreeSet<String>>(),
        "rows marked OVERDUE are the board's flights with an open alert"
    );
    println!(
        "alerts panel: {} open on 2013-01-02, {} of them on the board",
        open.len(),
        marked.len()
    );

    // A flight's detail: its history from Delta, one row per version.
    let key = &keys[keys.len() / 2];
    browser
        .click(&format!("#board tbody tr[data-key='{key}']"))
        .expect("click a flight");
    let version = documents[key]["version"].as_u64().expect("version") as usize;
    let history = browser
        .wait_for("the flight's history", Duration::from_secs(60), |browser| {
            let rows = browser.texts("#history tbody tr.history-row")?;
            Ok(if rows.len() == version {
                Probe::Ready(rows)
            } else {
                Probe::NotYet(format!("{} history rows, want {version}", rows.len()))
            })
        })
        .expect("history rows");
    assert!(history[0].starts_with('1'), "version 1 first: {:?}", history[0]);
    let title = browser.texts("#detail-title").expect("title");
    assert!(title[0].contains("EWR →"), "{title:?}");

    // Hostile values (what a broken or malicious source can send in any text field) are shown as
    // text: no element is made of them and no script of theirs runs. Another flight than `key`,
    // whose version the operator's tools check below.
    let hostile = &keys[(keys.len() / 2 + 1) % keys.len()];
    hostile_values_are_shown_as_text(&up, &browser, &runtime, hostile, &documents[hostile]);

    // Filters: a carrier shows only its flights.
    browser
        .execute::<serde_json::Value>(
            "const c = document.getElementById('carrier'); c.value = 'UA'; c.dispatchEvent(new Event('change')); return null;",
            vec![],
        )
        .expect("filter");
    browser
        .wait_for("only UA flights", Duration::from_secs(60), |browser| {
            let flights = browser.texts("#board tbody tr[data-key] td.flight")?;
            Ok(
                if !flights.is_empty() && flights.iter().all(|flight| flight.starts_with("UA ")) {
                    Probe::Ready(())
                } else {
                    Probe::NotYet(format!("flights {:?}", &flights[..flights.len().min(5)]))
                },
            )
        })
        .expect("carrier filter");

    // What it looks like (from the top: header, filters, board and the detail panel).
    browser
        .execute::<serde_json::Value>("window.scrollTo(0, 0); return null;", vec![])
        .expect("scroll");
    browser
        .wait_for(
            "the page scrolled to the top",
            Duration::from_secs(10),
            |browser| {
                let y: f64 = browser.execute("return window.scrollY;", vec![])?;
                Ok(if y == 0.0 {
                    Probe::Ready(())
                } else {
                    Probe::NotYet(format!("scrollY {y}"))
                })
            },
        )
        .expect("scrolled");
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

    // Monitoring: a real Prometheus with the chart's alert rules sees every stage, and a stopped
    // stage fires ContrailStageDown (before `operate`, which drains changefeed-sync).
    monitor(&up, &dir);

    // The operator's tools against the same platform.
    operate(&up, key, &documents[key]);

    // A stage killed after the summary is restarted like one killed during the run.
    let killed = stage_pid("cosmos-writer", 8082 + up.offset).expect("cosmos-writer's pid");
    contrail_testkit::send_signal(killed, contrail_testkit::libc::SIGKILL);
    wait_restarted(&up, "cosmos-writer", 8082, killed);
    assert!(
        up.output().contains("cosmos-writer exited"),
        "contrail up says what it restarted:\n{}",
        up.output_tail(20)
    );

    let status = up.interrupt(Duration::from_secs(90)).expect("stops");
    assert!(
        status.success(),
        "contrail up exited with {status}:\n{}",
        up.output()
    );
}

/// Sends `key` a GATE_ASSIGNED event whose id and gate are HTML, through ingest, and checks the
/// board and the detail panel show them as text: no `img` element anywhere, its `onerror` never
/// ran.
fn hostile_values_are_shown_as_text(
    up: &UpUnderTest,
    browser: &Browser,
    runtime: &tokio::runtime::Runtime,
    key: &str,
    document: &serde_json::Value,
) {
    const HOSTILE_ID: &str = "<img src=x onerror=\"window.__pwned=1\">";
    const HOSTILE_GATE: &str = "<img src=x>";
    let last =
        chrono::DateTime::parse_from_rfc3339(document["lastEventTime"].as_str().expect("lastEventTime"))
            .expect("an RFC 3339 time");
    let event = serde_json::json!({
        "event_id": HOSTILE_ID,
        "source": "gate-system",
        "type": "GATE_ASSIGNED",
        "event_time": (last + chrono::Duration::minutes(1)).to_rfc3339(),
        "flight": {
            "carrier": document["carrier"],
            "number": document["flightNumber"],
            "origin": document["origin"],
            "date": document["serviceDate"],
        },
        "data": { "gate": HOSTILE_GATE },
    });
    let status = runtime
        .block_on(
            reqwest::Client::new()
                .post(format!("{}/v1/events", up.ingest_url()))
                .bearer_auth(BOARD_TOKEN)
                .json(&event)
                .send(),
        )
        .expect("ingest answers")
        .status();
    assert_eq!(status.as_u16(), 202, "the hostile event is valid input");
    let row = format!("#board tbody tr[data-key='{key}']");
    // The board's row and the detail panel (loaded on a click) show the values as text once the
    // board refreshed (every 2 s).
    let gate_cell = format!("{row} td.gate");
    let shown: Vec<String> = browser
        .wait_for(
            "the board and the detail panel to show the hostile values as text",
            Duration::from_secs(60),
            |browser| {
                let fields: Vec<String> = browser.execute(
                    "return [...document.querySelectorAll('#detail-fields dd')].map(d => d.innerText)",
                    vec![],
                )?;
                let gate = browser.texts(&gate_cell)?;
                Ok(
                    if fields.iter().any(|field| field == HOSTILE_ID) && gate == [HOSTILE_GATE] {
                        Probe::Ready(fields)
                    } else {
                        browser.click(&row)?;
                        Probe::NotYet(format!("detail fields {fields:?}, gate cell {gate:?}"))
                    },
                )
            },
        )
        .expect("the hostile event on the board");
    assert!(shown.iter().any(|field| field == HOSTILE_GATE), "{shown:?}");
    let (images, pwned): (u64, bool) = browser
        .execute(
            "return [document.querySelectorAll('#board img, #detail img, #history img, #alerts-list img').length, \
                     window.__pwned !== undefined]",
            vec![],
        )
        .expect("inspect the page");
    assert_eq!(images, 0, "no element made of the values");
    assert!(!pwned, "the value's script never ran");
}

/// A real Prometheus scrapes the five stages of `up` with the shipped rules (their `for:` shortened
/// to 3 s): every stage is up and reports its start time, every consuming stage its consumer lag;
/// then delta-archiver is stopped (SIGSTOP: it cannot answer, like a hung process) and
/// ContrailStageDown fires for it and for no other stage; once it continues, the alert resolves.
fn monitor(up: &UpUnderTest, dir: &std::path::Path) {
    use contrail_testkit::prometheus::Prometheus;
    let stages = [
        ("ingest", 8080),
        ("dedup-state", 8081),
        ("cosmos-writer", 8082),
        ("changefeed-sync", 8083),
        ("delta-archiver", 8084),
    ];
    let targets: Vec<(String, String)> = stages
        .iter()
        .map(|(stage, port)| {
            (
                format!("contrail-{stage}"),
                format!("127.0.0.1:{}", port + up.offset),
            )
        })
        .collect();
    let prometheus = Prometheus::start(&dir.join("prometheus"), &targets, "3s").expect("prometheus");
    let timeout = Duration::from_secs(60);
    prometheus
        .wait_for_series(r#"up{job=~".*contrail.*"} == 1"#, 5, timeout)
        .expect("every stage scraped");
    prometheus
        .wait_for_series("contrail_process_start_time_seconds", 5, timeout)
        .expect("every stage's start time");
    prometheus
        .wait_for_series("contrail_consumer_partitions_owned > 0", 4, timeout)
        .expect("every consuming stage owns partitions (changefeed-sync: leases)");
    let lagging = prometheus
        .wait_for_series("count by (job) (contrail_consumer_lag_records)", 3, timeout)
        .expect("the consuming stages' lag");
    let jobs: BTreeSet<String> = lagging
        .iter()
        .map(|series| series["metric"]["job"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        jobs,
        [
            "contrail-cosmos-writer",
            "contrail-dedup-state",
            "contrail-delta-archiver"
        ]
        .map(str::to_owned)
        .into(),
        "the consuming stages export their lag"
    );
    let down = |prometheus: &Prometheus| -> Vec<String> {
        prometheus
            .alerts()
            .expect("alerts")
            .into_iter()
            .filter(|alert| alert.name == "ContrailStageDown" && alert.state == "firing")
            .map(|alert| {
                format!(
                    "{} {}",
                    alert.labels["job"].as_str().unwrap_or_default(),
                    alert.state
                )
            })
            .collect()
    };
    assert!(
        down(&prometheus).is_empty(),
        "no stage is down yet: {:?}",
        down(&prometheus)
    );

    let pid = stage_pid("delta-archiver", 8084 + up.offset).expect("delta-archiver's pid");
    contrail_testkit::send_signal(pid, contrail_testkit::libc::SIGSTOP);
    let fired = contrail_testkit::wait_until("ContrailStageDown to fire", timeout, || {
        let alerts = down(&prometheus);
        Ok(
            if alerts
                .iter()
                .any(|alert| alert == "contrail-delta-archiver firing")
            {
                Probe::Ready(alerts)
            } else {
                Probe::NotYet(format!("{alerts:?}"))
            },
        )
    });
    contrail_testkit::send_signal(pid, contrail_testkit::libc::SIGCONT);
    let fired = fired.expect("the alert fires for the stopped stage");
    assert_eq!(
        fired,
        vec!["contrail-delta-archiver firing".to_owned()],
        "only the stopped stage is down"
    );
    contrail_testkit::wait_until("ContrailStageDown to resolve", timeout, || {
        let alerts = down(&prometheus);
        Ok(if alerts.is_empty() {
            Probe::Ready(())
        } else {
            Probe::NotYet(format!("{alerts:?}"))
        })
    })
    .expect("the alert resolves once the stage answers again");
}

/// Waits until `stage` runs again as another process than `old_pid` and answers `/healthz` on its
/// HTTP port (`http_port` before the platform's offset).
fn wait_restarted(up: &UpUnderTest, stage: &str, http_port: u16, old_pid: u32) {
    let port = http_port + up.offset;
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let pid = stage_pid(stage, port).ok();
        let live = pid.is_some_and(|pid| pid != old_pid)
            && matches!(
                contrail_testkit::answers_200(&format!("http://127.0.0.1:{port}/healthz")),
                Probe::Ready(())
            );
        if live {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{stage} was not restarted within 90 s (pid {pid:?}, was {old_pid}):\n{}",
            up.output_tail(20)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
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

    // Drain: the stage finishes, exits, and contrail up's supervisor starts it again (the run's
    // summary is out: the supervisor keeps going while the board is up).
    let drained = stage_pid("changefeed-sync", 8083 + up.offset).expect("changefeed-sync's pid");
    let (ok, out, err) = contrail(up, &["admin", "--stage", "changefeed-sync", "drain", "--json"]);
    assert!(ok && json_of(&out)["draining"] == true, "{out}{err}");
    wait_restarted(up, "changefeed-sync", 8083, drained);

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
