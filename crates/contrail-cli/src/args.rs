//! Connection options the commands share — the Cosmos DB endpoint (`contrail flights`,
//! `contrail backfill`) and the broker (`contrail alerts`, `contrail backfill`) — and what the
//! Kafka readers ask a topic first: its partitions and where each begins and ends.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use contrail_common::kafka::KafkaConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message as _, Offset, TopicPartitionList};

/// Where the serving store is.
#[derive(Args, Debug, Clone)]
pub struct CosmosArgs {
    /// Cosmos DB endpoint (the local one of `contrail up` by default, shifted by `--port-offset`).
    #[arg(long, env = "CONTRAIL_COSMOS__ENDPOINT")]
    pub cosmos_endpoint: Option<String>,
    /// Cosmos DB account key (the local endpoint's development key by default). Never printed.
    #[arg(long, env = "CONTRAIL_COSMOS__KEY", hide_env_values = true)]
    pub cosmos_key: Option<String>,
}

impl CosmosArgs {
    /// The endpoint; `port_offset` shifts the local default.
    pub fn endpoint(&self, port_offset: u16) -> String {
        self.cosmos_endpoint
            .clone()
            .unwrap_or_else(|| crate::local::Ports { offset: port_offset }.cosmos_endpoint())
    }

    /// The Cosmos settings; `create`: create the database and containers when missing.
    pub fn config(&self, port_offset: u16, create: bool) -> contrail_cosmos::CosmosConfig {
        crate::local::cosmos_config(&self.endpoint(port_offset), self.cosmos_key.as_deref(), create)
    }
}

/// Where the broker is.
#[derive(Args, Debug, Clone)]
pub struct KafkaArgs {
    /// Kafka bootstrap servers (the local broker of `contrail up` by default, shifted by
    /// `--port-offset`).
    #[arg(long, env = "CONTRAIL_KAFKA__BROKERS")]
    pub brokers: Option<String>,
    /// Azure Event Hubs namespace connection string, instead of `--brokers`. Never printed.
    #[arg(
        long,
        env = "CONTRAIL_KAFKA__EVENT_HUBS_CONNECTION_STRING",
        hide_env_values = true
    )]
    pub event_hubs_connection_string: Option<String>,
}

impl KafkaArgs {
    /// The client settings; `port_offset` shifts the local default broker.
    pub fn config(&self, port_offset: u16) -> KafkaConfig {
        KafkaConfig {
            brokers: self.brokers.clone().unwrap_or_else(|| {
                format!(
                    "127.0.0.1:{}",
                    crate::local::Ports { offset: port_offset }.broker()
                )
            }),
            event_hubs_connection_string: contrail_common::config::Secret::new(
                self.event_hubs_connection_string.clone().unwrap_or_default(),
            ),
            ..KafkaConfig::default()
        }
    }
}

/// The broker, for messages (never the connection string).
pub fn describe(kafka: &KafkaConfig) -> String {
    if kafka.is_event_hubs() {
        "Event Hubs".to_owned()
    } else {
        kafka.brokers.clone()
    }
}

/// Each partition of `topic` with its first and next offset (low and high watermarks).
pub fn partition_ends(
    consumer: &BaseConsumer,
    kafka: &KafkaConfig,
    topic: &str,
) -> Result<Vec<(i32, i64, i64)>> {
    let where_ = describe(kafka);
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(15))
        .with_context(|| {
            format!("reading the metadata of topic {topic:?} from {where_} (is the platform up?)")
        })?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|candidate| candidate.name() == topic)
        .flat_map(|candidate| candidate.partitions().iter().map(|partition| partition.id()))
        .collect();
    if partitions.is_empty() {
        bail!("topic {topic:?} does not exist on {where_} (a platform creates it at start)");
    }
    partitions
        .into_iter()
        .map(|partition| {
            let (low, high) = consumer
                .fetch_watermarks(topic, partition, Duration::from_secs(15))
                .with_context(|| format!("the offsets of {topic} partition {partition}"))?;
            Ok((partition, low, high))
        })
        .collect()
}

/// How long [`read_ends`] reads at most (a topic still being written has no end to find); it
/// takes a partition's end as found once nothing arrived for `QUIET_PAST_END`.
const READ_ENDS_AT_MOST: Duration = Duration::from_secs(20);

/// [`partition_ends`], with each end read rather than asked: a broker's reported high watermark
/// can trail its log — the local broker reports the first offset of a partition's last batch + 1
/// (docs/TESTING.md) — so the records from the reported end − 1 on are read until none arrived
/// for 1.5 s, and a partition's end is one past the last offset seen. On a broker that reports
/// its log's end (Event Hubs, Kafka) this reads one record per partition.
pub fn read_ends(consumer: &BaseConsumer, kafka: &KafkaConfig, topic: &str) -> Result<Vec<(i32, i64, i64)>> {
    let mut ends = partition_ends(consumer, kafka, topic)?;
    let mut assignment = TopicPartitionList::new();
    for (partition, low, high) in &ends {
        if high > low {
            assignment
                .add_partition_offset(topic, *partition, Offset::Offset(high - 1))
                .with_context(|| format!("{topic} partition {partition}: offset {}", high - 1))?;
        }
    }
    if assignment.count() == 0 {
        return Ok(ends);
    }
    consumer
        .assign(&assignment)
        .with_context(|| format!("reading the tail of {topic}"))?;
    let started = Instant::now();
    let mut last_record = Instant::now();
    while last_record.elapsed() < contrail_common::kafka::QUIET_PAST_END
        && started.elapsed() < READ_ENDS_AT_MOST
    {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                last_record = Instant::now();
                if let Some(end) = ends
                    .iter_mut()
                    .find(|(partition, _, _)| *partition == message.partition())
                {
                    end.2 = end.2.max(message.offset() + 1);
                }
            }
            Some(Err(error)) => bail!("reading the tail of {topic}: {error}"),
            None => {}
        }
    }
    consumer
        .unassign()
        .with_context(|| format!("done reading the tail of {topic}"))?;
    Ok(ends)
}
