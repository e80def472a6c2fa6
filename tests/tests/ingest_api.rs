//! The ingest stage as a process against a real broker (tansu): what lands on the topics, how bad
//! input is answered and dead-lettered, authentication, gRPC, and graceful shutdown.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::Duration;

use contrail_events::{Limits, validate_record};
use contrail_proto::v1::{DeadLetter, OperationalEvent};
use contrail_testkit::{
    IngestOptions, IngestUnderTest, event_ids, key_of, read_topic, shared_broker, start_ingest,
};
use prost::Message as _;
use rdkafka::Message as _;
use serde_json::{Value, json};

/// Real events: the first `count` of 1 January 2013, in event-time order, no duplicates.
fn real_events(count: usize) -> Vec<Value> {
    let data_dir = contrail_flightdata::default_data_dir().expect("the shipped nycflights13 data");
    let day = chrono::NaiveDate::from_ymd_opt(2013, 1, 1);
    let data = contrail_flightdata::FlightData::load(&data_dir, day, day).expect("load flights");
    let config = contrail_flightdata::ReplayConfig {
        duplicate_rate: 0.0,
        max_disorder: chrono::Duration::zero(),
        ..Default::default()
    };
    contrail_flightdata::ReplayStream::new(data, config)
        .take(count)
        .map(|delivery| delivery.event.to_json())
        .collect()
}

fn start() -> IngestUnderTest {
    start_ingest(IngestOptions {
        brokers: &shared_broker().address,
        extra_env: vec![("CONTRAIL_LIMITS__MAX_BODY_BYTES".into(), "200000".into())],
        dir: None,
        topic_prefix: None,
    })
    .expect("ingest starts")
}

async fn post(ingest: &IngestUnderTest, body: Vec<u8>, gzip: bool, token: Option<&str>) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{}/v1/events", ingest.http_url))
        .body(body);
    if gzip {
        request = request.header("content-encoding", "gzip");
    }
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("ingest answers");
    let status = response.status().as_u16();
    let body = response.json::<Value>().await.unwrap_or(Value::Null);
    (status, body)
}

fn ndjson(events: &[Value]) -> Vec<u8> {
    events
        .iter()
        .map(|event| format!("{event}\n"))
        .collect::<String>()
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread")]
async fn valid_events_land_on_the_raw_topic_decodable_with_the_flight_key() {
    let ingest = start();
    let events = real_events(120);
    // The same contract, three body shapes: a JSON array, NDJSON (gzip), and single objects.
    let (status, answer) = post(
        &ingest,
        serde_json::to_vec(&events[..50]).expect("json"),
        false,
        Some(&ingest.token),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["accepted"], 50);
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(&ndjson(&events[50..110])).expect("gzip");
    let (status, answer) = post(
        &ingest,
        encoder.finish().expect("gzip"),
        true,
        Some(&ingest.token),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["accepted"], 60);
    for event in &events[110..] {
        let pretty = serde_json::to_vec_pretty(event).expect("json");
        let (status, answer) = post(&ingest, pretty, false, Some(&ingest.token)).await;
        assert_eq!(status, 202, "{answer}");
        assert_eq!(answer["results"][0]["event_id"], event["event_id"]);
    }

    let brokers = shared_broker().address.clone();
    let topic = ingest.raw_topic.clone();
    let messages =
        tokio::task::spawn_blocking(move || read_topic(&brokers, &topic, 120, Duration::from_secs(30)))
            .await
            .expect("join")
            .expect("read raw topic");
    assert_eq!(messages.len(), 120, "exactly the posted events, no more");
    // Expected, computed independently: the contract's own validation of the posted JSON.
    let limits = Limits::default();
    let mut expected: Vec<OperationalEvent> = events
        .iter()
        .map(|event| validate_record(event, &limits, 0).expect("real events are valid"))
        .collect();
    expected.sort_by(|a, b| a.event_id.cmp(&b.event_id));
    let mut landed: Vec<OperationalEvent> = messages
        .iter()
        .map(|message| {
            let event = OperationalEvent::decode(message.payload().expect("payload"))
                .expect("decodes as OperationalEvent");
            assert_eq!(key_of(message), event.flight_key, "record key is the flight key");
            assert!(event.ingested_at_us > 0);
            OperationalEvent {
                ingested_at_us: 0,
                ..event
            }
        })
        .collect();
    landed.sort_by(|a, b| a.event_id.cmp(&b.event_id));
    assert_eq!(landed, expected);
    // Records of one flight share a partition (keyed), so per-flight order is kept.
    let mut partition_of_flight = std::collections::HashMap::new();
    for message in &messages {
        let previous = partition_of_flight.insert(key_of(message), message.partition());
        assert!(previous.is_none() || previous == Some(message.partition()));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_class_of_bad_input_is_answered_and_dead_lettered() {
    let mut ingest = start();
    let good = real_events(1).remove(0);
    let mut missing_field = good.clone();
    missing_field.as_object_mut().expect("object").remove("source");
    missing_field["event_id"] = json!("bad-missing-source");
    let mut bad_timestamp = good.clone();
    bad_timestamp["event_id"] = json!("bad-timestamp");
    bad_timestamp["event_time"] = json!("2013-13-01T25:00:00Z");
    let mut unknown_type = good.clone();
    unknown_type["event_id"] = json!("bad-type");
    unknown_type["type"] = json!("TELEPORTED");
    let mut oversized_field = good.clone();
    oversized_field["event_id"] = json!("x".repeat(200));
    let body = format!(
        "{good}\n{{\"event_id\": \"broken\", \n{missing_field}\n{bad_timestamp}\n{unknown_type}\n{oversized_field}\n"
    );
    let (status, answer) = post(&ingest, body.into_bytes(), false, Some(&ingest.token)).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        answer["accepted"], 1,
        "the valid record of the request is still accepted"
    );
    assert_eq!(answer["rejected"], 5);
    let results = answer["results"].as_array().expect("results");
    let field_of = |index: usize| {
        results[index]["errors"][0]["field"]
            .as_str()
            .unwrap_or("?")
            .to_owned()
    };
    assert_eq!(results[0]["status"], "accepted");
    assert_eq!(results[1]["status"], "rejected");
    assert!(
        results[1]["errors"][0]["message"]
            .as_str()
            .expect("message")
            .contains("invalid JSON")
    );
    assert_eq!(field_of(2), "source");
    assert_eq!(field_of(3), "event_time");
    assert!(
        results[3]["errors"][0]["message"]
            .as_str()
            .expect("message")
            .contains("2013-13-01T25:00:00Z")
    );
    assert_eq!(field_of(4), "type");
    assert_eq!(field_of(5), "event_id");

    // Request-level refusals: not records, so nothing for the DLQ.
    let (status, answer) = post(&ingest, b"   ".to_vec(), false, Some(&ingest.token)).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"].as_str().expect("error").contains("empty"));
    let (status, answer) = post(&ingest, vec![b' '; 300_000], false, Some(&ingest.token)).await;
    assert_eq!(status, 413, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .expect("error")
            .contains("max_body_bytes")
    );
    let (status, _) = post(
        &ingest,
        ndjson(std::slice::from_ref(&good)),
        false,
        Some("wrong-token"),
    )
    .await;
    assert_eq!(status, 401);
    let (status, answer) = post(&ingest, ndjson(std::slice::from_ref(&good)), false, None).await;
    assert_eq!(status, 401);
    assert!(answer["error"].as_str().expect("error").contains("Bearer"));
    let (status, answer) = post(&ingest, b"not gzip".to_vec(), true, Some(&ingest.token)).await;
    assert_eq!(status, 400);
    assert!(answer["error"].as_str().expect("error").contains("gzip"));

    let brokers = shared_broker().address.clone();
    let topic = ingest.dlq_topic.clone();
    let letters =
        tokio::task::spawn_blocking(move || read_topic(&brokers, &topic, 5, Duration::from_secs(30)))
            .await
            .expect("join")
            .expect("read dlq");
    assert_eq!(
        letters.len(),
        5,
        "one dead letter per rejected record, none for request-level refusals"
    );
    let mut reasons = BTreeSet::new();
    for message in &letters {
        let letter = DeadLetter::decode(message.payload().expect("payload")).expect("decodes as DeadLetter");
        assert_eq!(letter.stage, "ingest");
        assert_eq!(letter.origin, "http");
        assert!(!letter.payload.is_empty(), "the record itself is kept");
        reasons.insert(letter.errors[0].field.clone());
    }
    assert_eq!(
        reasons,
        BTreeSet::from([
            "".to_owned(),
            "source".into(),
            "event_time".into(),
            "type".into(),
            "event_id".into()
        ])
    );
    // Still up and healthy after all of that.
    assert!(ingest.process.is_running());
    let health = reqwest::get(format!("{}/healthz", ingest.http_url))
        .await
        .expect("healthz");
    assert_eq!(health.status().as_u16(), 200);
    let metrics = reqwest::get(format!("{}/metrics", ingest.http_url))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("contrail_ingest_records_rejected_total{origin=\"http\"} 5"),
        "{metrics}"
    );
}

/// Plausible time, and a gzip body of several members (`cat a.gz b.gz`): a record from a clock in
/// 2099 and one from 1971 are answered `400` naming their index and `event_time`, and
/// dead-lettered; the real events around them, spread over three gzip members, are all accepted
/// and land on the raw topic.
#[tokio::test(flavor = "multi_thread")]
async fn broken_clocks_are_rejected_and_every_gzip_member_is_read() {
    let ingest = start();
    let events = real_events(30);
    let mut from_2099 = events[0].clone();
    from_2099["event_id"] = json!("clock-2099");
    from_2099["event_time"] = json!("2099-01-01T00:00:00Z");
    let mut from_1971 = events[0].clone();
    from_1971["event_id"] = json!("clock-1971");
    from_1971["event_time"] = json!("1971-01-01T00:00:00Z");
    let members: [Vec<Value>; 3] = [
        events[..10].to_vec(),
        [vec![from_2099], events[10..20].to_vec(), vec![from_1971]].concat(),
        events[20..].to_vec(),
    ];
    let mut body = Vec::new();
    for member in &members {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(&ndjson(member)).expect("gzip");
        body.extend(encoder.finish().expect("gzip"));
    }
    let (status, answer) = post(&ingest, body, true, Some(&ingest.token)).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["accepted"], 30, "all three members were read: {answer}");
    assert_eq!(answer["rejected"], 2);
    let results = answer["results"].as_array().expect("results");
    for (index, year) in [(10, "2099"), (21, "1971")] {
        assert_eq!(results[index]["status"], "rejected", "{answer}");
        assert_eq!(results[index]["errors"][0]["field"], "event_time");
        let message = results[index]["errors"][0]["message"].as_str().expect("message");
        assert!(
            message.contains(&format!("{year}-01-01T00:00:00Z is implausible")),
            "{message}"
        );
    }
    let brokers = shared_broker().address.clone();
    let (raw_topic, dlq_topic) = (ingest.raw_topic.clone(), ingest.dlq_topic.clone());
    let (raw, letters) = tokio::task::spawn_blocking(move || {
        (
            read_topic(&brokers, &raw_topic, 30, Duration::from_secs(30)),
            read_topic(&brokers, &dlq_topic, 2, Duration::from_secs(30)),
        )
    })
    .await
    .expect("join");
    let landed: BTreeSet<String> = raw
        .expect("raw")
        .iter()
        .map(|message| {
            OperationalEvent::decode(message.payload().expect("payload"))
                .expect("event")
                .event_id
        })
        .collect();
    let posted: BTreeSet<String> = events
        .iter()
        .map(|event| event["event_id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(landed, posted);
    let letters: BTreeSet<(u32, String)> = letters
        .expect("dlq")
        .iter()
        .map(|message| {
            let letter = DeadLetter::decode(message.payload().expect("payload")).expect("letter");
            (letter.record_index, letter.errors[0].field.clone())
        })
        .collect();
    assert_eq!(
        letters,
        [(10, "event_time".to_owned()), (21, "event_time".to_owned())].into()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_ingest_validates_per_record_and_requires_the_token() {
    use contrail_proto::ingest::v1::{
        EventInput, FlightInput, PublishRequest, RecordStatus, ingest_service_client::IngestServiceClient,
    };
    let ingest = start();
    let mut client = IngestServiceClient::connect(ingest.grpc_url.clone())
        .await
        .expect("connect");
    let as_input = |event: &Value| EventInput {
        event_id: event["event_id"].as_str().unwrap_or_default().to_owned(),
        source: event["source"].as_str().unwrap_or_default().to_owned(),
        r#type: event["type"].as_str().unwrap_or_default().to_owned(),
        event_time: event["event_time"].as_str().unwrap_or_default().to_owned(),
        flight: Some(FlightInput {
            carrier: event["flight"]["carrier"].as_str().unwrap_or_default().to_owned(),
            number: u32::try_from(event["flight"]["number"].as_u64().unwrap_or(0)).unwrap_or(0),
            origin: event["flight"]["origin"].as_str().unwrap_or_default().to_owned(),
            date: event["flight"]["date"].as_str().unwrap_or_default().to_owned(),
        }),
        data: None,
    };
    let events = real_events(10);
    let mut inputs: Vec<EventInput> = events.iter().map(as_input).collect();
    inputs[3].event_time = "yesterday".into();
    let authorized = |message: PublishRequest, token: &str| {
        let mut request = tonic::Request::new(message);
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().expect("ascii"));
        request
    };
    let denied = client
        .publish(authorized(
            PublishRequest {
                events: inputs.clone(),
            },
            "nope",
        ))
        .await
        .expect_err("wrong token");
    assert_eq!(denied.code(), tonic::Code::Unauthenticated);
    let response = client
        .publish(authorized(
            PublishRequest {
                events: inputs[..5].to_vec(),
            },
            &ingest.token,
        ))
        .await
        .expect("publish")
        .into_inner();
    assert_eq!((response.accepted, response.rejected), (4, 1));
    assert_eq!(response.results[3].status, RecordStatus::Rejected as i32);
    assert_eq!(response.results[3].errors[0].field, "event_time");
    // Client streaming: two batches, indexes continue across them.
    let batches = vec![
        PublishRequest {
            events: inputs[5..7].to_vec(),
        },
        PublishRequest {
            events: inputs[7..].to_vec(),
        },
    ];
    let mut request = tonic::Request::new(futures::stream::iter(batches));
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", ingest.token).parse().expect("ascii"),
    );
    let streamed = client.publish_stream(request).await.expect("stream").into_inner();
    assert_eq!(streamed.accepted, 5);
    assert_eq!(streamed.results.last().expect("results").index, 4);

    let brokers = shared_broker().address.clone();
    let topic = ingest.raw_topic.clone();
    let messages =
        tokio::task::spawn_blocking(move || read_topic(&brokers, &topic, 9, Duration::from_secs(30)))
            .await
            .expect("join")
            .expect("read raw");
    let ids: BTreeSet<String> = event_ids(&messages).into_iter().collect();
    let expected: BTreeSet<String> = events
        .iter()
        .enumerate()
        .filter(|(index, _)| *index != 3)
        .map(|(_, event)| event["event_id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(ids, expected);
    assert_eq!(messages.len(), 9);
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_and_exits_cleanly() {
    let mut ingest = start();
    let (status, _) = post(&ingest, ndjson(&real_events(5)), false, Some(&ingest.token)).await;
    assert_eq!(status, 202);
    let exit = ingest
        .process
        .terminate(Duration::from_secs(20))
        .expect("exits after SIGTERM");
    assert!(exit.success(), "exit status {exit:?}\n{}", ingest.process.log());
    assert!(ingest.process.log().contains("ingest stopped"));
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_health_and_reflection_work_without_proto_files() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let ingest = start();
    let channel = tonic::transport::Endpoint::from_shared(ingest.grpc_url.clone())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(channel.clone());
    for service in [
        "",
        "contrail.ingest.v1.IngestService",
        "contrail.admin.v1.AdminService",
    ] {
        let status = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("health check")
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }
    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(futures::stream::iter(vec![request]))
        .await
        .expect("reflection")
        .into_inner();
    let response = responses.message().await.expect("stream").expect("one response");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection answer {response:?}");
    };
    let names: BTreeSet<String> = list.service.into_iter().map(|service| service.name).collect();
    for expected in [
        "contrail.ingest.v1.IngestService",
        "contrail.admin.v1.AdminService",
        "grpc.health.v1.Health",
    ] {
        assert!(names.contains(expected), "{expected} missing from {names:?}");
    }
}

/// `message` with `Authorization: Bearer token`.
fn bearer<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().expect("ascii"));
    request
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_api_reports_status_pauses_and_requires_the_operators_token() {
    use contrail_proto::admin::v1::{
        PauseRequest, ResumeRequest, StatusRequest, admin_service_client::AdminServiceClient,
    };
    let ingest = start();
    let (status, _) = post(&ingest, ndjson(&real_events(7)), false, Some(&ingest.token)).await;
    assert_eq!(status, 202);
    // The operators' token is not a producer's: it cannot post events.
    let (status, _) = post(&ingest, ndjson(&real_events(1)), false, Some(&ingest.admin_token)).await;
    assert_eq!(status, 401, "the admin token must not write events");
    let mut admin = AdminServiceClient::connect(ingest.grpc_url.clone())
        .await
        .expect("connect");
    let denied = admin.status(StatusRequest {}).await.expect_err("no token");
    assert_eq!(denied.code(), tonic::Code::Unauthenticated);
    // A data producer cannot pause (or drain, or read the status of) ingest.
    let denied = admin
        .pause(bearer(PauseRequest {}, &ingest.token))
        .await
        .expect_err("a producer's token on the admin API");
    assert_eq!(denied.code(), tonic::Code::Unauthenticated);
    let report = admin
        .status(bearer(StatusRequest {}, &ingest.admin_token))
        .await
        .expect("status")
        .into_inner();
    assert_eq!(report.stage, "ingest");
    assert!(report.ready);
    assert!(!report.paused, "the producer's pause was refused");
    assert_eq!(report.counters.get("events_accepted_total").copied(), Some(7.0));
    let paused = admin
        .pause(bearer(PauseRequest {}, &ingest.admin_token))
        .await
        .expect("pause");
    assert!(paused.into_inner().paused);
    let (status, answer) = post(&ingest, ndjson(&real_events(1)), false, Some(&ingest.token)).await;
    assert_eq!(status, 503, "paused ingest refuses: {answer}");
    admin
        .resume(bearer(ResumeRequest {}, &ingest.admin_token))
        .await
        .expect("resume");
    let (status, _) = post(&ingest, ndjson(&real_events(1)), false, Some(&ingest.token)).await;
    assert_eq!(status, 202);
}
