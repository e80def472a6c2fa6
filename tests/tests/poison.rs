//! No record stalls a partition, and no credential outage is taken for poison. Every stage is fed
//! a record larger than the broker's message limit (≈ 1 MB) between good ones: the good ones go
//! through, the big one is answered or dead-lettered with its first bytes (a dead letter always
//! fits), and the stage keeps running.
//! And a Cosmos DB key regenerated under a running writer is an outage: nothing is dead-lettered
//! or committed until the new key is deployed, then every flight reaches its highest version.

use std::collections::BTreeMap;
use std::time::Duration;

use contrail_proto::v1::{DeadLetter, FlightState, OperationalEvent};
use contrail_testkit::cosmos::{
    CosmosDev, CosmosStage, contract_documents, contract_problems, curated_stream, sync_env, writer_env,
};
use contrail_testkit::dedup::{DedupOptions, DedupTopics, produce_events, replay_events, start_dedup_state};
use contrail_testkit::{
    IngestOptions, TopicReader, create_topics, read_topic, shared_broker, start_ingest, test_dir, unique,
};
use prost::Message as _;
use rdkafka::Message as _;
use rdkafka::producer::Producer as _;

/// Larger than any broker's default message limit (1,000,000 bytes), as a real source's record
/// with a huge free-text field can be.
const HUGE: usize = 1_500_000;

/// Produces `(key, payload)` records in order with a producer that may send up to 4 MB (the local
/// broker enforces no limit: what another client puts on a topic can exceed ours).
fn produce_large(brokers: &str, topic: &str, records: &[(String, Vec<u8>)]) {
    let producer: rdkafka::producer::ThreadedProducer<rdkafka::producer::DefaultProducerContext> =
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("message.max.bytes", "4000000")
            .create()
            .expect("producer");
    for (key, payload) in records {
        producer
            .send(rdkafka::producer::BaseRecord::to(topic).key(key).payload(payload))
            .map_err(|(error, _)| error)
            .expect("enqueue");
    }
    producer.flush(Duration::from_secs(60)).expect("flush");
}

/// Every record of a topic that may be empty: reads until nothing arrived for `quiet`.
fn read_all_of(brokers: &str, topic: &str, quiet: Duration) -> Vec<rdkafka::message::OwnedMessage> {
    let mut reader = TopicReader::open(brokers, topic).expect("reader");
    while reader.poll_for(quiet).expect("read") > 0 {}
    reader.into_messages()
}

/// The dead letters on `topic`, each checked to fit in a message.
fn dead_letters(brokers: &str, topic: &str, at_least: usize) -> Vec<DeadLetter> {
    read_topic(brokers, topic, at_least, Duration::from_secs(120))
        .expect("dead letters")
        .iter()
        .map(|message| {
            let payload = message.payload().unwrap_or_default();
            assert!(
                payload.len() < 1_000_000,
                "a dead letter fits in a message: {}",
                payload.len()
            );
            DeadLetter::decode(payload).expect("a DeadLetter")
        })
        .collect()
}

/// A real event with an unknown field that makes it `size` bytes of JSON.
fn huge_event_json(size: usize) -> serde_json::Value {
    let event = &replay_events((2, 1), (2, 1), Default::default())[0];
    let mut json = serde_json::json!({
        "event_id": format!("{}-huge", event.event_id),
        "source": "aodb",
        "type": "GATE_ASSIGNED",
        "event_time": "2013-02-01T10:00:00Z",
        "flight": {"carrier": "UA", "number": 1545, "origin": "EWR", "date": "2013-02-01"},
        "data": {"gate": "C71"},
    });
    json["remarks"] = serde_json::Value::String("x".repeat(size));
    json
}

/// ingest: a record over `limits.max_record_bytes` is answered `400` naming it (not `503`, which a
/// client retries forever), its dead letter holds its first bytes and its size, and the good
/// records of the same request are on the raw topic.
#[tokio::test(flavor = "multi_thread")]
async fn ingest_rejects_an_oversized_record_by_name_and_dead_letters_its_first_bytes() {
    let broker = shared_broker();
    let ingest = start_ingest(IngestOptions {
        brokers: &broker.address,
        extra_env: Vec::new(),
        dir: None,
        topic_prefix: None,
    })
    .expect("ingest starts");
    let good: Vec<serde_json::Value> = replay_events((2, 1), (2, 1), Default::default())
        .iter()
        .take(2)
        .map(|event| {
            serde_json::json!({
                "event_id": event.event_id, "source": "aodb", "type": "GATE_ASSIGNED",
                "event_time": "2013-02-01T09:00:00Z",
                "flight": {"carrier": event.flight.as_ref().map(|f| f.carrier.clone()),
                           "number": event.flight.as_ref().map(|f| f.number),
                           "origin": event.flight.as_ref().map(|f| f.origin.clone()),
                           "date": event.flight.as_ref().map(|f| f.service_date.clone())},
                "data": {"gate": "A1"}
            })
        })
        .collect();
    let body = serde_json::Value::Array(vec![good[0].clone(), huge_event_json(HUGE), good[1].clone()]);
    let response = reqwest::Client::new()
        .post(format!("{}/v1/events", ingest.http_url))
        .bearer_auth(&ingest.token)
        .body(body.to_string())
        .send()
        .await
        .expect("request");
    let status = response.status().as_u16();
    let answer: serde_json::Value = response.json().await.expect("json answer");
    assert_eq!(
        status, 400,
        "an oversized record is the client's to fix: {answer}"
    );
    let text = answer.to_string();
    assert!(
        text.contains("record 1 is") && text.contains("limits.max_record_bytes"),
        "the answer names the record and the limit: {text}"
    );
    let (brokers, raw, dlq) = (
        broker.address.clone(),
        ingest.raw_topic.clone(),
        ingest.dlq_topic.clone(),
    );
    let (raw_records, letters) = tokio::task::spawn_blocking(move || {
        (
            read_topic(&brokers, &raw, 2, Duration::from_secs(30)).expect("raw"),
            dead_letters(&brokers, &dlq, 1),
        )
    })
    .await
    .expect("join");
    assert_eq!(raw_records.len(), 2, "the two good records are on the raw topic");
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert!(
        letter.payload_truncated,
        "the record does not fit: its first bytes are kept"
    );
    assert!(letter.payload_size as usize > HUGE);
    assert!(letter.payload.starts_with(b"{"), "the record's own first bytes");
    assert!(
        letter.reason.contains("limits.max_record_bytes"),
        "{}",
        letter.reason
    );
}

/// dedup-state: a record on the raw topic larger than its outputs may be (another client wrote
/// it) is dead-lettered — with its first bytes and its position — and the partition goes on.
#[test]
fn dedup_state_dead_letters_a_record_too_large_for_its_outputs_and_goes_on() {
    let broker = shared_broker();
    let topics = DedupTopics::unique();
    create_topics(&broker.address, &[&topics.raw], 1).expect("raw topic");
    let events = replay_events((2, 2), (2, 2), Default::default());
    let (before, after) = events[..400].split_at(200);
    produce_events(&broker.address, &topics.raw, before).expect("produce");
    let mut huge: OperationalEvent = before[0].clone();
    huge.event_id = format!("{}-huge", huge.event_id);
    huge.extra_json = serde_json::json!({ "remarks": "x".repeat(HUGE) }).to_string();
    produce_large(
        &broker.address,
        &topics.raw,
        &[(huge.flight_key.clone(), huge.encode_to_vec())],
    );
    produce_events(&broker.address, &topics.raw, after).expect("produce");
    let dir = test_dir("poison-dedup");
    let group = unique("pd");
    let mut stage = start_dedup_state(DedupOptions::single(&broker.address, &topics, &group, &dir))
        .expect("dedup-state starts");
    stage
        .wait_caught_up(1, Duration::from_secs(120))
        .expect("the partition goes past the record");
    let letters = dead_letters(&broker.address, &topics.dlq, 1);
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert!(letter.payload_truncated && letter.payload_size as usize > HUGE);
    assert_eq!(
        letter.input.as_ref().map(|input| input.offset),
        Some(200),
        "its raw position"
    );
    assert!(letter.reason.contains("message limit"), "{}", letter.reason);
    let accepted = read_all_of(&broker.address, &topics.accepted, Duration::from_secs(3));
    assert!(
        accepted
            .iter()
            .all(|message| message.payload().unwrap_or_default().len() < 1_000_000),
        "no output over the limit"
    );
    assert!(
        !accepted.iter().any(
            |message| OperationalEvent::decode(message.payload().unwrap_or_default())
                .is_ok_and(|event| event.event_id == huge.event_id)
        ),
        "the record was not accepted"
    );
    assert!(stage.process.is_running(), "{}", stage.process.log_tail(30));
    stage.process.terminate(Duration::from_secs(30)).expect("stops");
}

/// cosmos-writer: an undecodable record of 1.5 MB between good states is dead-lettered with its
/// first bytes; the good states are written and the partition committed past it.
#[test]
fn cosmos_writer_dead_letters_an_oversized_record_and_commits_past_it() {
    let broker = shared_broker();
    let dir = test_dir("poison-writer");
    let dev = CosmosDev::start(&dir).expect("cosmos-dev");
    let topic = format!("{}.ops.flights.curated", unique("pw"));
    create_topics(&broker.address, &[&topic, &format!("{topic}.dlq")], 1).expect("topics");
    let events = replay_events((2, 3), (2, 3), Default::default())[..300].to_vec();
    let states = curated_stream(&events);
    let encode = |state: &FlightState| (state.flight_key.clone(), state.encode_to_vec());
    let mut records: Vec<(String, Vec<u8>)> = states[..150].iter().map(encode).collect();
    records.push((states[0].flight_key.clone(), vec![0xff; HUGE]));
    records.extend(states[150..].iter().map(encode));
    produce_large(&broker.address, &topic, &records);
    let mut writer = CosmosStage::start(
        "cosmos-writer",
        writer_env(&broker.address, &topic, &unique("pw"), &dev),
        &dir.join("writer"),
    )
    .expect("cosmos-writer starts");
    writer
        .wait_committed(&broker.address, &topic, records.len(), Duration::from_secs(180))
        .expect("committed past the record");
    let letters = dead_letters(&broker.address, &format!("{topic}.dlq"), 1);
    assert_eq!(letters.len(), 1);
    assert!(letters[0].payload_truncated && letters[0].payload_size as usize == HUGE);
    assert_eq!(letters[0].input.as_ref().map(|input| input.offset), Some(150));
    let problems = contract_problems(&dev, &contract_documents(&events));
    assert!(problems.is_empty(), "{problems:?}");
    writer.process.terminate(Duration::from_secs(30)).expect("stops");
}

/// delta-archiver: an undecodable record of 1.5 MB on the accepted topic is dead-lettered with
/// its first bytes and the partition's stored position goes past it.
#[test]
fn delta_archiver_dead_letters_an_oversized_record_and_goes_on() {
    let broker = shared_broker();
    let dir = test_dir("poison-archiver");
    let prefix = unique("pa");
    let accepted = format!("{prefix}.ops.events.accepted");
    let dlq = format!("{prefix}.ops.events.dlq");
    create_topics(&broker.address, &[&accepted, &dlq], 1).expect("topics");
    let mut events: Vec<OperationalEvent> = replay_events((2, 4), (2, 4), Default::default())[..200].to_vec();
    for (offset, event) in events.iter_mut().enumerate() {
        let offset = if offset >= 100 { offset + 1 } else { offset };
        event.input = Some(contrail_proto::v1::SourcePosition {
            topic: "ops.events.raw".to_owned(),
            partition: 0,
            offset: offset as i64,
        });
    }
    let encode = |event: &OperationalEvent| (event.flight_key.clone(), event.encode_to_vec());
    let mut records: Vec<(String, Vec<u8>)> = events[..100].iter().map(encode).collect();
    records.push(("garbage".to_owned(), vec![0xfe; HUGE]));
    records.extend(events[100..].iter().map(encode));
    produce_large(&broker.address, &accepted, &records);
    let env = [
        ("CONTRAIL_KAFKA__BROKERS", broker.address.clone()),
        ("CONTRAIL_TOPICS__ACCEPTED", accepted.clone()),
        ("CONTRAIL_TOPICS__CURATED", String::new()),
        ("CONTRAIL_TOPICS__LATE", String::new()),
        ("CONTRAIL_TOPICS__CHANGES", String::new()),
        ("CONTRAIL_TOPICS__ALERTS", String::new()),
        ("CONTRAIL_TOPICS__DLQ", dlq.clone()),
        ("CONTRAIL_DELTA_ROOT", dir.join("delta").display().to_string()),
        ("CONTRAIL_GROUP__ID", unique("pa")),
        ("CONTRAIL_MAINTENANCE__ENABLED", "false".to_owned()),
        ("CONTRAIL_BATCH__MAX_LATENCY_MS", "500".to_owned()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value))
    .collect();
    let mut archiver = CosmosStage::start("delta-archiver", env, &dir.join("archiver")).expect("starts");
    let ends: BTreeMap<(String, i32), i64> = [((accepted.clone(), 0), records.len() as i64)].into();
    archiver
        .wait_positions(&ends, Duration::from_secs(180))
        .expect("the partition goes past the record");
    let letters = dead_letters(&broker.address, &dlq, 1);
    assert_eq!(letters.len(), 1);
    assert!(letters[0].payload_truncated && letters[0].payload_size as usize == HUGE);
    assert_eq!(letters[0].input.as_ref().map(|input| input.offset), Some(100));
    assert!(archiver.process.is_running());
    archiver
        .process
        .terminate(Duration::from_secs(30))
        .expect("stops");
}

/// changefeed-sync: a document larger than a message (Cosmos DB allows 2 MB) is published as a
/// change without its JSON, and the changes after it keep coming.
#[test]
fn changefeed_sync_publishes_a_document_too_large_for_a_message_without_its_json() {
    let broker = shared_broker();
    let dir = test_dir("poison-sync");
    let dev = CosmosDev::start(&dir).expect("cosmos-dev");
    let topic = format!("{}.ops.flights.changes", unique("ps"));
    create_topics(&broker.address, &[&topic], 1).expect("topic");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let upsert = |id: &str, version: u64, notes: usize| {
        let document = serde_json::json!({
            "id": id, "flightKey": id, "version": version, "notes": "n".repeat(notes)
        });
        runtime
            .block_on(async {
                let containers = dev.containers().await?;
                containers
                    .flights
                    .upsert_item(id.to_owned(), id, &document, None)
                    .await?;
                anyhow::Ok(())
            })
            .expect("upsert");
    };
    upsert("AA1-2013-02-05-JFK", 1, 10);
    upsert("AA2-2013-02-05-JFK", 1, HUGE);
    let mut sync = CosmosStage::start(
        "changefeed-sync",
        sync_env(&broker.address, &topic, "sync-poison", &dev),
        &dir.join("sync"),
    )
    .expect("changefeed-sync starts");
    upsert("AA3-2013-02-05-JFK", 1, 10);
    let changes: Vec<contrail_proto::v1::ServingChange> =
        read_topic(&broker.address, &topic, 3, Duration::from_secs(60))
            .expect("three changes")
            .iter()
            .map(|message| {
                contrail_proto::v1::ServingChange::decode(message.payload().unwrap_or_default())
                    .expect("change")
            })
            .collect();
    let by_id: BTreeMap<&str, &contrail_proto::v1::ServingChange> = changes
        .iter()
        .map(|change| (change.id.as_str(), change))
        .collect();
    let huge = by_id["AA2-2013-02-05-JFK"];
    assert!(huge.document_omitted && huge.document_json.is_empty());
    assert!(huge.document_size as usize > HUGE);
    assert!(huge.lsn > 0);
    assert!(
        !by_id["AA3-2013-02-05-JFK"].document_omitted,
        "the changes after it keep coming"
    );
    sync.process.terminate(Duration::from_secs(30)).expect("stops");
}

/// An outage, not poison (docs/CONTRACT.md, "Serving writes"): the Cosmos DB account key is
/// regenerated under a running cosmos-writer. Its writes are refused (401): it reports not ready
/// and waits — nothing is dead-lettered, nothing committed. Redeployed with the new key, it writes
/// every flight at its highest version, and the dead-letter topic stays empty.
#[test]
fn a_regenerated_cosmos_key_is_an_outage_not_poison() {
    let broker = shared_broker();
    let dir = test_dir("outage-key");
    let first_key = "Zmlyc3Qta2V5LWZvci1jb250cmFpbA==";
    let second_key = "c2Vjb25kLWtleS1mb3ItY29udHJhaWw=";
    let mut dev = CosmosDev::start_with_key(&dir, Some(first_key)).expect("cosmos-dev");
    let topic = format!("{}.ops.flights.curated", unique("ok"));
    let dlq = format!("{topic}.dlq");
    create_topics(&broker.address, &[&topic, &dlq], 2).expect("topics");
    let events = replay_events((2, 6), (2, 6), Default::default())[..2_000].to_vec();
    let states = curated_stream(&events);
    let encode = |state: &FlightState| (state.flight_key.clone(), state.encode_to_vec());
    let (before, after) = states.split_at(states.len() / 2);
    let mut writer = CosmosStage::start(
        "cosmos-writer",
        writer_env(&broker.address, &topic, &unique("ok"), &dev),
        &dir.join("writer"),
    )
    .expect("cosmos-writer starts");
    produce_large(
        &broker.address,
        &topic,
        &before.iter().map(encode).collect::<Vec<_>>(),
    );
    writer
        .wait_committed(&broker.address, &topic, before.len(), Duration::from_secs(120))
        .expect("the first half is written");

    dev.rotate_key(second_key).expect("key regenerated");
    produce_large(
        &broker.address,
        &topic,
        &after.iter().map(encode).collect::<Vec<_>>(),
    );
    let readyz = format!("{}/readyz", writer.http_url);
    writer
        .process
        .wait_until(
            "cosmos-writer reports the outage (/readyz 503)",
            Duration::from_secs(60),
            || {
                Ok(match contrail_testkit::http_get(&readyz) {
                    Ok(answer) if answer.starts_with("HTTP/1.1 503") => contrail_testkit::Probe::Ready(()),
                    Ok(answer) => {
                        contrail_testkit::Probe::NotYet(answer.lines().next().unwrap_or_default().to_owned())
                    }
                    Err(error) => contrail_testkit::Probe::NotYet(error.to_string()),
                })
            },
        )
        .expect("not ready during the outage");
    std::thread::sleep(Duration::from_secs(3)); // the outage lasts: still nothing may leak
    assert!(
        writer.process.is_running(),
        "an outage is waited out, not a crash"
    );
    assert!(
        writer.process.log().contains("refuses the credentials"),
        "the log says what is wrong:\n{}",
        writer.process.log_tail(20)
    );
    let committed: i64 = writer
        .status()
        .expect("status")
        .partitions
        .iter()
        .map(|partition| partition.committed_offset.max(0))
        .sum();
    assert!(
        committed <= before.len() as i64,
        "nothing committed past the outage: {committed} of {} before it",
        before.len()
    );
    assert!(
        read_all_of(&broker.address, &dlq, Duration::from_secs(2)).is_empty(),
        "nothing dead-lettered"
    );

    writer
        .redeploy(&[("CONTRAIL_COSMOS__KEY", second_key)])
        .expect("redeployed with the new key");
    writer
        .wait_committed(&broker.address, &topic, states.len(), Duration::from_secs(180))
        .expect("everything written after the fix");
    let problems = contract_problems(&dev, &contract_documents(&events));
    assert!(
        problems.is_empty(),
        "{} problems, e.g. {:?}",
        problems.len(),
        &problems[..problems.len().min(3)]
    );
    assert!(
        read_all_of(&broker.address, &dlq, Duration::from_secs(2)).is_empty(),
        "nothing dead-lettered"
    );
    writer.process.terminate(Duration::from_secs(30)).expect("stops");
}

/// ingest with credentials the broker refuses (SASL against a broker that does not take them —
/// as a revoked Event Hubs key): an outage — not ready, requests answered `503` with
/// `Retry-After`, nothing acknowledged or dead-lettered. Redeployed with working credentials, the
/// same records go in.
#[tokio::test(flavor = "multi_thread")]
async fn ingest_with_refused_broker_credentials_is_unavailable_not_lossy() {
    let broker = shared_broker();
    let dir = test_dir("ingest-sasl");
    let config = dir.join("ingest.toml");
    std::fs::write(
        &config,
        "[kafka.properties]\n\"security.protocol\" = \"SASL_PLAINTEXT\"\n\"sasl.mechanism\" = \"PLAIN\"\n\
         \"sasl.username\" = \"$ConnectionString\"\n\"sasl.password\" = \"a-revoked-key\"\n",
    )
    .expect("config");
    let prefix = unique("sasl");
    let (brokers, topic_prefix) = (broker.address.clone(), prefix.clone());
    tokio::task::spawn_blocking(move || {
        let (raw, dlq) = (
            format!("{topic_prefix}.ops.events.raw"),
            format!("{topic_prefix}.ops.events.dlq"),
        );
        create_topics(&brokers, &[&raw, &dlq], 3)
    })
    .await
    .expect("join")
    .expect("topics");
    let mut refused = contrail_testkit::spawn_ingest(IngestOptions {
        brokers: &broker.address,
        extra_env: vec![
            ("CONTRAIL_CONFIG_FILE".to_owned(), config.display().to_string()),
            (
                "CONTRAIL_LIMITS__PRODUCE_TIMEOUT_MS".to_owned(),
                "2000".to_owned(),
            ),
            ("CONTRAIL_TOPICS__CREATE".to_owned(), "false".to_owned()),
        ],
        dir: Some(dir.join("refused")),
        topic_prefix: Some(prefix.clone()),
    })
    .expect("ingest starts");
    let http = refused.http_url.clone();
    refused
        .process
        .wait_until("ingest answering on HTTP", Duration::from_secs(60), || {
            Ok(match contrail_testkit::http_get(&format!("{http}/healthz")) {
                Ok(answer) if answer.starts_with("HTTP/1.1 200") => contrail_testkit::Probe::Ready(()),
                Ok(answer) => {
                    contrail_testkit::Probe::NotYet(answer.lines().next().unwrap_or_default().to_owned())
                }
                Err(error) => contrail_testkit::Probe::NotYet(error.to_string()),
            })
        })
        .expect("live");
    let ready = contrail_testkit::http_get(&format!("{http}/readyz")).expect("readyz");
    assert!(
        ready.starts_with("HTTP/1.1 503"),
        "not ready while the broker refuses it: {ready}"
    );
    let events: Vec<serde_json::Value> = replay_events((2, 8), (2, 8), Default::default())
        .iter()
        .take(20)
        .map(|event| {
            let flight = event.flight.clone().unwrap_or_default();
            serde_json::json!({
                "event_id": event.event_id, "source": "aodb", "type": "BOARDING",
                "event_time": "2013-02-08T09:00:00Z",
                "flight": {"carrier": flight.carrier, "number": flight.number,
                           "origin": flight.origin, "date": flight.service_date},
            })
        })
        .collect();
    let body = serde_json::Value::Array(events.clone()).to_string();
    let client = reqwest::Client::new();
    let response = client
        .post(format!("{http}/v1/events"))
        .bearer_auth(&refused.token)
        .body(body.clone())
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status().as_u16(), 503, "an outage, to retry");
    assert!(response.headers().contains_key("retry-after"));
    assert!(refused.process.is_running(), "{}", refused.process.log_tail(20));
    refused.process.terminate(Duration::from_secs(30)).expect("stops");

    // Redeployed with working credentials (none, for this broker): the same records go in.
    let fixed = start_ingest(IngestOptions {
        brokers: &broker.address,
        extra_env: Vec::new(),
        dir: Some(dir.join("fixed")),
        topic_prefix: Some(prefix),
    })
    .expect("ingest starts");
    let response = client
        .post(format!("{}/v1/events", fixed.http_url))
        .bearer_auth(&fixed.token)
        .body(body)
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status().as_u16(), 202);
    let (brokers, raw, dlq) = (
        broker.address.clone(),
        fixed.raw_topic.clone(),
        fixed.dlq_topic.clone(),
    );
    let (on_raw, dead) = tokio::task::spawn_blocking(move || {
        (
            read_topic(&brokers, &raw, 20, Duration::from_secs(30))
                .expect("raw")
                .len(),
            read_all_of(&brokers, &dlq, Duration::from_secs(2)).len(),
        )
    })
    .await
    .expect("join");
    assert_eq!(
        (on_raw, dead),
        (20, 0),
        "every record once on the raw topic, none dead-lettered"
    );
}
