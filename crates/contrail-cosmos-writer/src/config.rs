//! Configuration of the cosmos-writer stage (`CONTRAIL_…` variables, `--config` TOML).

use contrail_common::auth::AuthConfig;
use contrail_common::config::ListenConfig;
use contrail_common::kafka::{GroupConfig, KafkaConfig};
use contrail_common::telemetry::TelemetryConfig;
use contrail_common::topology::{self, topics};
use contrail_cosmos::CosmosConfig;
use serde::{Deserialize, Serialize};

/// Everything the cosmos-writer stage can be told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CosmosWriterConfig {
    /// Instance name (pod name); defaults to `$HOSTNAME`.
    pub instance: String,
    /// HTTP (probes, metrics) and gRPC (admin) listen addresses.
    pub listen: ListenConfig,
    /// Logging.
    pub telemetry: TelemetryConfig,
    /// The broker.
    pub kafka: KafkaConfig,
    /// Consumer group membership.
    pub group: GroupConfig,
    /// Topic names.
    pub topics: TopicsConfig,
    /// Batching and concurrency.
    pub batch: BatchConfig,
    /// The Cosmos DB account.
    pub cosmos: CosmosConfig,
    /// Authentication of the admin API.
    pub auth: AuthConfig,
}

impl Default for CosmosWriterConfig {
    fn default() -> Self {
        CosmosWriterConfig {
            instance: std::env::var("HOSTNAME").unwrap_or_else(|_| "cosmos-writer-0".to_owned()),
            listen: ListenConfig::of(topology::COSMOS_WRITER),
            telemetry: TelemetryConfig::default(),
            kafka: KafkaConfig::default(),
            group: GroupConfig::with_id("contrail-cosmos-writer"),
            topics: TopicsConfig::default(),
            batch: BatchConfig::default(),
            cosmos: CosmosConfig::default(),
            auth: AuthConfig::default(),
        }
    }
}

/// Topics cosmos-writer reads and writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsConfig {
    /// Input: one `FlightState` per accepted event, keyed by flight key.
    pub curated: String,
    /// Records that are not decodable flight states.
    pub dlq: String,
    /// Create missing topics at start (local development; off against Event Hubs).
    pub create: bool,
    /// Partitions of created topics.
    pub partitions: i32,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        TopicsConfig {
            curated: topics::CURATED.to_owned(),
            dlq: topics::DLQ.to_owned(),
            create: true,
            partitions: 4,
        }
    }
}

/// Batching: a batch is what arrives within `max_wait_ms` (at most `max_records`); its flights are
/// coalesced to their newest version and written with at most `concurrency` requests in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Most records per batch.
    pub max_records: usize,
    /// Longest wait for a batch to fill, ms.
    pub max_wait_ms: u64,
    /// Cosmos DB writes in flight.
    pub concurrency: usize,
    /// Flights whose last written version and ETag are remembered (saves the read before a replace).
    pub etag_cache_entries: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            max_records: 2_000,
            max_wait_ms: 100,
            concurrency: 32,
            etag_cache_entries: 200_000,
        }
    }
}

impl CosmosWriterConfig {
    /// Checks values the types cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.batch.max_records == 0 {
            return Err("batch.max_records must be at least 1".to_owned());
        }
        if self.batch.concurrency == 0 {
            return Err("batch.concurrency must be at least 1".to_owned());
        }
        if self.topics.curated.trim().is_empty() {
            return Err("topics.curated is empty".to_owned());
        }
        self.cosmos.validate().map_err(|error| error.to_string())
    }
}
