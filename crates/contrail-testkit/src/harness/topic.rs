//! Topics: creating them, reading them back whole (every partition, no consumer group), keys.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedMessage;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

/// A group-less consumer assigned every partition of `topic` from the beginning; `fetch_wait` is
/// how long the broker may hold a fetch (librdkafka's default, 500 ms, when `None`).
fn reader_from_beginning(brokers: &str, topic: &str, fetch_wait: Option<Duration>) -> Result<BaseConsumer> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("group.id", "contrail-testkit-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false");
    if let Some(wait) = fetch_wait {
        config.set("fetch.wait.max.ms", wait.as_millis().to_string());
    }
    let consumer: BaseConsumer = config.create().context("consumer")?;
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .context("metadata")?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|candidate| candidate.name() == topic)
        .flat_map(|candidate| candidate.partitions().iter().map(|partition| partition.id()))
        .collect();
    if partitions.is_empty() {
        bail!("topic {topic} has no partitions (does it exist?)");
    }
    let mut assignment = TopicPartitionList::new();
    for partition in &partitions {
        assignment.add_partition_offset(topic, *partition, Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;
    Ok(consumer)
}

/// How long [`quiescent_ends`] waits for a topic's first record.
const FIRST_RECORD_TIMEOUT: Duration = Duration::from_secs(120);

/// The end offset of every partition of `topic` that holds records, read from the topic until no
/// record arrived for `idle` after the first one (what was produced so far; call it once the
/// producers are done). The local broker's high watermarks were seen below offsets it had already
/// served, so tests read the ends instead of asking for them. Fails if the topic shows no record
/// within two minutes.
pub fn quiescent_ends(brokers: &str, topic: &str, idle: Duration) -> Result<BTreeMap<i32, i64>> {
    let mut reader = TopicReader::open(brokers, topic)?;
    reader.keep = false;
    let opened = Instant::now();
    while reader.ends.is_empty() {
        if opened.elapsed() > FIRST_RECORD_TIMEOUT {
            bail!("no record on {topic} within {FIRST_RECORD_TIMEOUT:?}: the topic is empty or unreadable");
        }
        reader.poll_for(Duration::from_millis(200))?;
    }
    while reader.poll_for(idle)? > 0 {}
    Ok(reader.ends)
}

/// The end offset of every partition of `topic` that holds records, for a topic whose producers
/// are known to be done (the topic may be empty): read until nothing arrived for `idle`.
pub fn settled_ends(brokers: &str, topic: &str, idle: Duration) -> Result<BTreeMap<i32, i64>> {
    let mut reader = TopicReader::open(brokers, topic)?;
    reader.keep = false;
    while reader.poll_for(idle)? > 0 {}
    Ok(reader.ends)
}

/// A group-less reader of every partition of one topic from the beginning, accumulating what it
/// read. Use it where a test reads a topic repeatedly (one consumer, no re-reads).
pub struct TopicReader {
    consumer: BaseConsumer,
    topic: String,
    messages: Vec<OwnedMessage>,
    /// Per partition, one past the highest offset read.
    ends: BTreeMap<i32, i64>,
    keep: bool,
    /// Consumer errors met so far (librdkafka reports transient ones, e.g. a broker connection
    /// that dropped, and recovers by itself) and the last of them, for a failure's message.
    errors: usize,
    last_error: Option<String>,
}

/// Consumer errors one reader tolerates before it fails: enough to ride out a broker that is busy
/// or reconnecting, few enough that a persistent failure surfaces at once.
const TOLERATED_ERRORS: usize = 50;

impl TopicReader {
    /// Opens the reader (fails if the topic does not exist).
    pub fn open(brokers: &str, topic: &str) -> Result<TopicReader> {
        Self::open_as(brokers, topic, None)
    }

    /// Opens the reader with the broker allowed to hold a fetch for `fetch_wait` at most: what a
    /// latency measurement needs (the local broker holds a fetch for the whole wait even when
    /// records are there, and librdkafka's default wait is 500 ms).
    pub fn open_with_fetch_wait(brokers: &str, topic: &str, fetch_wait: Duration) -> Result<TopicReader> {
        Self::open_as(brokers, topic, Some(fetch_wait))
    }

    fn open_as(brokers: &str, topic: &str, fetch_wait: Option<Duration>) -> Result<TopicReader> {
        Ok(TopicReader {
            consumer: reader_from_beginning(brokers, topic, fetch_wait)?,
            topic: topic.to_owned(),
            messages: Vec::new(),
            ends: BTreeMap::new(),
            keep: true,
            errors: 0,
            last_error: None,
        })
    }

    /// Reads what arrives within `duration`; returns how many records arrived.
    pub fn poll_for(&mut self, duration: Duration) -> Result<usize> {
        let deadline = Instant::now() + duration;
        let mut arrived = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.consumer.poll(left.min(Duration::from_millis(100))) {
                Some(Ok(message)) => {
                    arrived += 1;
                    let end = self.ends.entry(message.partition()).or_insert(0);
                    *end = (*end).max(message.offset() + 1);
                    if self.keep {
                        self.messages.push(message.detach());
                    }
                }
                Some(Err(error)) => {
                    self.errors += 1;
                    self.last_error = Some(error.to_string());
                    if self.errors > TOLERATED_ERRORS {
                        bail!(
                            "reading {}: {} consumer errors, the last: {error}",
                            self.topic,
                            self.errors
                        );
                    }
                }
                None => {}
            }
            if left.is_zero() {
                return Ok(arrived);
            }
        }
    }

    /// Reads until at least `expected` records were read in all; the error says how many were
    /// read per partition when `timeout` passes.
    pub fn read_at_least(&mut self, expected: usize, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        while self.messages.len() < expected {
            if started.elapsed() >= timeout {
                bail!(
                    "read {} of {expected} records of {} in {:.1} s; ends per partition: {:?}{}",
                    self.messages.len(),
                    self.topic,
                    started.elapsed().as_secs_f64(),
                    self.ends,
                    self.errors_seen()
                );
            }
            self.poll_for(Duration::from_millis(200))?;
        }
        Ok(())
    }

    /// `; N consumer errors, the last: …`, or nothing when there was none.
    fn errors_seen(&self) -> String {
        match &self.last_error {
            Some(last) => format!("; {} consumer errors, the last: {last}", self.errors),
            None => String::new(),
        }
    }

    /// Everything read so far, in arrival order.
    pub fn messages(&self) -> &[OwnedMessage] {
        &self.messages
    }

    /// Per partition, one past the highest offset read so far.
    pub fn ends(&self) -> &BTreeMap<i32, i64> {
        &self.ends
    }

    /// The records read.
    pub fn into_messages(self) -> Vec<OwnedMessage> {
        self.messages
    }
}

/// Reads every record of `topic` (all partitions, from the beginning, no consumer group) until
/// `expected` records were read, then 500 ms more, so records beyond the expectation (copies)
/// show up too. Fails, naming what it read, if fewer than `expected` arrive within `timeout`.
pub fn read_topic(
    brokers: &str,
    topic: &str,
    expected: usize,
    timeout: Duration,
) -> Result<Vec<OwnedMessage>> {
    let mut reader = TopicReader::open(brokers, topic)?;
    reader.read_at_least(expected, timeout)?;
    reader.poll_for(Duration::from_millis(500))?;
    Ok(reader.into_messages())
}

pub use contrail_common::kafka::QUIET_PAST_END;

/// Reads every record of `topic` to its true end — for outputs of a stage that is caught up. A
/// count-based read ([`read_topic`]) can stop before a partition's tail when the topic also holds
/// re-sent copies; this one cannot. See [`read_to_end_at_least`].
pub fn read_to_end(brokers: &str, topic: &str, timeout: Duration) -> Result<Vec<OwnedMessage>> {
    read_to_end_at_least(brokers, topic, 0, timeout)
}

/// Reads every record of `topic` (all partitions, from the beginning): at least `at_least`
/// records, every partition up to the high watermark it reports when the read starts, and then
/// on until no record arrived for [`QUIET_PAST_END`]. The local broker reports a partition's end
/// as the first offset of its last batch + 1, below the records it serves, so the high watermark
/// alone stops early. Fails after `timeout`, naming the partitions short of their reported end,
/// the count read against `at_least`, or a topic that never went quiet.
pub fn read_to_end_at_least(
    brokers: &str,
    topic: &str,
    at_least: usize,
    timeout: Duration,
) -> Result<Vec<OwnedMessage>> {
    let mut reader = TopicReader::open(brokers, topic)?;
    let metadata = reader
        .consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .context("metadata")?;
    let mut reported = BTreeMap::new();
    for partition in metadata
        .topics()
        .iter()
        .filter(|candidate| candidate.name() == topic)
        .flat_map(|candidate| candidate.partitions().iter().map(|partition| partition.id()))
    {
        let (_, high) = reader
            .consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(10))
            .context("watermarks")?;
        if high > 0 {
            reported.insert(partition, high);
        }
    }
    let started = Instant::now();
    let mut last_record = Instant::now();
    loop {
        if reader.poll_for(Duration::from_millis(200))? > 0 {
            last_record = Instant::now();
        }
        let short: Vec<(i32, i64, i64)> = reported
            .iter()
            .map(|(partition, high)| {
                (
                    *partition,
                    reader.ends.get(partition).copied().unwrap_or(0),
                    *high,
                )
            })
            .filter(|(_, read, high)| read < high)
            .collect();
        let enough = reader.messages.len() >= at_least;
        let quiet = last_record.elapsed() >= QUIET_PAST_END;
        if short.is_empty() && enough && quiet {
            return Ok(reader.into_messages());
        }
        if started.elapsed() >= timeout {
            let read = reader.messages.len();
            let ends = &reader.ends;
            let errors = reader.errors_seen();
            if !short.is_empty() {
                bail!(
                    "{topic}: partitions (partition, read up to, reported end) short of their end after {timeout:?}: {short:?}; {read} records read{errors}"
                );
            }
            if !enough {
                bail!(
                    "{topic}: {read} records read after {timeout:?}, expected at least {at_least}; ends read per partition: {ends:?}{errors}"
                );
            }
            bail!(
                "{topic}: records still arriving after {timeout:?} ({read} read; ends per partition: {ends:?}): the topic never went quiet for {QUIET_PAST_END:?}{errors}"
            );
        }
    }
}

type Admin = rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>;

/// An admin client of `brokers` and a runtime to wait for its answers on.
fn admin_client(brokers: &str) -> Result<(Admin, tokio::runtime::Runtime)> {
    let admin: Admin = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .context("admin client")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok((admin, runtime))
}

/// Asks for `topics` with `partitions` partitions each; the topics refused, with the broker's code.
fn request_topics(
    admin: &Admin,
    runtime: &tokio::runtime::Runtime,
    topics: &[&str],
    partitions: i32,
) -> Result<Vec<(String, rdkafka::types::RDKafkaErrorCode)>> {
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    let new_topics: Vec<NewTopic> = topics
        .iter()
        .map(|topic| NewTopic::new(topic, partitions, TopicReplication::Fixed(1)))
        .collect();
    let results = runtime.block_on(admin.create_topics(&new_topics, &AdminOptions::new()))?;
    Ok(results.into_iter().filter_map(Result::err).collect())
}

/// Creates topics (ignoring "already exists").
pub fn create_topics(brokers: &str, topics: &[&str], partitions: i32) -> Result<()> {
    let (admin, runtime) = admin_client(brokers)?;
    for (topic, code) in request_topics(&admin, &runtime, topics, partitions)? {
        if code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists {
            bail!("create topic {topic}: {code}");
        }
    }
    Ok(())
}

/// Deletes `topics` and creates them again with `partitions` partitions each: the records and the
/// consumer groups' committed offsets go with the old topics, and the new ones start at offset 0
/// (how a retention gap's twin, a re-created topic, is made on the local broker, which has no
/// DeleteRecords and no retention).
pub fn recreate_topics(brokers: &str, topics: &[&str], partitions: i32) -> Result<()> {
    let (admin, runtime) = admin_client(brokers)?;
    let results = runtime.block_on(admin.delete_topics(topics, &rdkafka::admin::AdminOptions::new()))?;
    for result in results {
        if let Err((topic, code)) = result {
            bail!("delete topic {topic}: {code}");
        }
    }
    // The broker may still list a deleted topic for a moment: create until it takes the new one.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let refused = request_topics(&admin, &runtime, topics, partitions)?;
        if refused.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("creating the deleted topics again: {refused:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Commits `offsets` (`(partition, next offset)`) of `topic` for consumer group `group` from
/// outside the group, as an operator's tool would (the group must have no live member). With a
/// re-created topic this makes the position a consumer finds stored one the topic does not have —
/// what retention leaves behind on Event Hubs, which the local broker cannot do.
pub fn commit_group_offsets(brokers: &str, group: &str, topic: &str, offsets: &[(i32, i64)]) -> Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .context("consumer")?;
    let mut list = TopicPartitionList::new();
    for (partition, next) in offsets {
        list.add_partition_offset(topic, *partition, Offset::Offset(*next))?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match consumer.commit(&list, rdkafka::consumer::CommitMode::Sync) {
            Ok(()) => break,
            Err(error) if Instant::now() < deadline => {
                println!("committing {offsets:?} for group {group}: {error}; again");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(error) => bail!("committing {offsets:?} of {topic} for group {group}: {error}"),
        }
    }
    let committed = consumer
        .committed_offsets(list, Duration::from_secs(10))
        .context("reading the commit back")?;
    for element in committed.elements() {
        let wanted = offsets
            .iter()
            .find(|(partition, _)| *partition == element.partition())
            .map(|(_, next)| Offset::Offset(*next));
        if Some(element.offset()) != wanted {
            bail!(
                "group {group} has {:?} for {topic}/{} after committing {wanted:?}",
                element.offset(),
                element.partition()
            );
        }
    }
    Ok(())
}

/// A message's key as UTF-8 (empty when absent).
pub fn key_of(message: &OwnedMessage) -> String {
    message
        .key()
        .map(|key| String::from_utf8_lossy(key).into_owned())
        .unwrap_or_default()
}

/// An idempotent producer for tests (acks from all replicas, 5 ms linger).
pub fn test_producer(
    brokers: &str,
) -> anyhow::Result<rdkafka::producer::ThreadedProducer<rdkafka::producer::DefaultProducerContext>> {
    use anyhow::Context as _;
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .context("producer")
}

/// Sends one record, waiting while the producer's local queue is full.
pub fn send_waiting(
    producer: &rdkafka::producer::ThreadedProducer<rdkafka::producer::DefaultProducerContext>,
    topic: &str,
    key: &str,
    payload: &[u8],
) -> anyhow::Result<()> {
    let mut record = rdkafka::producer::BaseRecord::to(topic).key(key).payload(payload);
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((
                rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                back,
            )) => {
                record = back;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((error, _)) => anyhow::bail!("produce to {topic}: {error}"),
        }
    }
}

/// The end offset of every partition of `topic`, read from the topic (`records` = how many it
/// holds; the local broker's high watermarks are not trusted, see `CosmosStage::wait_committed`).
pub fn topic_ends(brokers: &str, topic: &str, records: usize) -> Result<BTreeMap<i32, i64>> {
    let messages = read_topic(brokers, topic, records, Duration::from_secs(180))?;
    if messages.len() < records {
        bail!("{topic} holds {} records, expected {records}", messages.len());
    }
    let mut ends = BTreeMap::new();
    for message in &messages {
        use rdkafka::Message as _;
        let end = ends.entry(message.partition()).or_insert(0);
        *end = (*end).max(message.offset() + 1);
    }
    Ok(ends)
}
