//! The durable local broker (nisshi on SQLite, `DurableBroker`): `kill -9` of the broker while a
//! producer streams into it and a restart on the same disk lose nothing the broker acknowledged,
//! and a consumer group resumes exactly where it committed before the kill.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use contrail_testkit::{DurableBroker, create_topics, key_of, read_topic, test_dir, unique};
use rdkafka::ClientConfig;
use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{Message, Offset};

/// What the broker acknowledged: key → (partition, offset), and delivery failures.
#[derive(Default)]
struct Acks {
    acknowledged: Mutex<HashMap<String, (i32, i64)>>,
    failed: Mutex<Vec<String>>,
}

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(message) => {
                let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
                if let Ok(mut acknowledged) = self.acknowledged.lock() {
                    acknowledged.insert(key, (message.partition(), message.offset()));
                }
            }
            Err((error, _)) => {
                if let Ok(mut failed) = self.failed.lock() {
                    failed.push(error.to_string());
                }
            }
        }
    }
}

fn acknowledged(acks: &Acks) -> usize {
    acks.acknowledged.lock().map(|map| map.len()).unwrap_or(0)
}

fn send(producer: &ThreadedProducer<Acks>, topic: &str, index: usize) {
    let key = format!("record-{index:06}");
    let payload = format!("{{\"index\":{index}}}");
    let mut record = BaseRecord::to(topic).key(&key).payload(&payload);
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((_, back)) => {
                // The local queue is full (the broker is down): wait for it to drain.
                record = back;
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// A member of consumer group `group` subscribed to `topic`, committing only when told, starting
/// at `reset` where the group has no commit.
fn group_member(address: &str, group: &str, topic: &str, reset: &str) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", address)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", reset)
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    consumer
}

const PARTITIONS: i32 = 3;
const BEFORE: usize = 3_000;
const DURING: usize = 9_000;

#[test]
fn kill_9_of_the_broker_loses_nothing_acknowledged_and_groups_resume_at_their_commit() {
    let dir = test_dir("durable-broker");
    let mut broker = DurableBroker::start(&dir).expect("the durable broker starts");
    let address = broker.address.clone();
    let topic = unique("durable");
    create_topics(&address, &[&topic], PARTITIONS).expect("topic");

    let producer: Arc<ThreadedProducer<Acks>> = Arc::new(
        ClientConfig::new()
            .set("bootstrap.servers", &address)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            // Long enough to ride out the broker's restart: a record is retried, not failed.
            .set("message.timeout.ms", "180000")
            .create_with_context(Acks::default())
            .expect("producer"),
    );
    let acks = producer.context();
    for index in 0..BEFORE {
        send(&producer, &topic, index);
    }
    producer
        .flush(Duration::from_secs(60))
        .expect("the first records acknowledged");
    assert_eq!(acknowledged(acks), BEFORE);

    // A consumer group reads about half of them and commits its position.
    let group = unique("durable-group");
    let committed = {
        let consumer = group_member(&address, &group, &topic, "earliest");
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut read = 0;
        while read < BEFORE / 2 {
            assert!(
                Instant::now() < deadline,
                "the group read {read} records in 120 s"
            );
            if let Some(Ok(_)) = consumer.poll(Duration::from_millis(200)) {
                read += 1;
            }
        }
        consumer.commit_consumer_state(CommitMode::Sync).expect("commit");
        let committed: BTreeMap<i32, i64> = consumer
            .committed(Duration::from_secs(30))
            .expect("committed offsets")
            .elements()
            .iter()
            // A partition the member read nothing of has no commit (`Offset::Invalid`).
            .filter_map(|element| match element.offset() {
                Offset::Offset(offset) => Some((element.partition(), offset)),
                _ => None,
            })
            .collect();
        assert_eq!(
            committed.values().sum::<i64>(),
            i64::try_from(read).expect("count"),
            "the commit covers what was read: {committed:?}"
        );
        assert!(!committed.is_empty());
        committed
    };
    println!("group {group} committed {committed:?}");

    // More records stream in; the broker is killed (kill -9) while they do, then restarted on the
    // same disk. The producer carries on through the outage.
    let streaming = {
        let producer = Arc::clone(&producer);
        let topic = topic.clone();
        std::thread::spawn(move || {
            for index in BEFORE..BEFORE + DURING {
                send(&producer, &topic, index);
                if index % 100 == 0 {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(1_500));
    let acknowledged_before_kill = acknowledged(acks);
    broker.kill9();
    std::thread::sleep(Duration::from_secs(1));
    broker.restart().expect("the broker starts again");
    streaming.join().expect("the producer thread");
    producer
        .flush(Duration::from_secs(180))
        .expect("every record acknowledged after the restart");
    let failed = acks.failed.lock().expect("lock").clone();
    assert!(failed.is_empty(), "deliveries failed: {failed:?}");
    println!(
        "acknowledged: {BEFORE} before the stream, {} before the kill, {} in all",
        acknowledged_before_kill,
        acknowledged(acks)
    );
    assert!(
        acknowledged_before_kill > BEFORE && acknowledged_before_kill < BEFORE + DURING,
        "the kill came mid-stream: {acknowledged_before_kill} acknowledged before it"
    );
    assert_eq!(
        acknowledged(acks),
        BEFORE + DURING,
        "every record acknowledged in the end"
    );

    // Nothing acknowledged is lost: every record is where the broker said it put it.
    let messages =
        read_topic(&address, &topic, BEFORE + DURING, Duration::from_secs(180)).expect("read back");
    let mut at: HashMap<(i32, i64), String> = HashMap::new();
    let mut copies: HashMap<String, usize> = HashMap::new();
    for message in &messages {
        at.insert((message.partition(), message.offset()), key_of(message));
        *copies.entry(key_of(message)).or_default() += 1;
    }
    let acknowledged = acks.acknowledged.lock().expect("lock").clone();
    let lost: Vec<_> = acknowledged
        .iter()
        .filter(|(key, place)| at.get(place) != Some(*key))
        .take(10)
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged records not where acknowledged (first 10): {lost:?}"
    );
    let doubled: Vec<_> = copies.iter().filter(|(_, count)| **count > 1).take(10).collect();
    assert!(doubled.is_empty(), "records stored twice (first 10): {doubled:?}");
    assert_eq!(messages.len(), BEFORE + DURING);

    // The group resumes exactly at its commit: a new member that would otherwise start at the end
    // (`latest`) reads from the committed offsets on.
    let consumer = group_member(&address, &group, &topic, "latest");
    let mut first: BTreeMap<i32, i64> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while first.len() < committed.len() {
        assert!(
            Instant::now() < deadline,
            "after the restart the group read first {first:?}, committed {committed:?}; broker log:\n{}",
            broker.log()
        );
        if let Some(Ok(message)) = consumer.poll(Duration::from_millis(200)) {
            first.entry(message.partition()).or_insert(message.offset());
        }
    }
    assert_eq!(first, committed, "the group resumed where it committed");
    assert_eq!(broker.starts, 2);
    broker.kill9();
    let _ = std::fs::remove_dir_all(&dir);
}
