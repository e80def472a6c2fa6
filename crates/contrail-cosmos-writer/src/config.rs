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

/// The write window: consumed records are written as they arrive, with at most `concurrency`
/// writes in flight (one per flight; newer versions of a flight being written coalesce behind it),
/// and each partition is committed up to its first record not yet in Cosmos DB every
/// `commit_interval_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Most records consumed and not yet committed (consumption pauses beyond it). Called
    /// `max_records` before the window replaced fixed batches; that name is still accepted.
    #[serde(alias = "max_records")]
    pub window_records: usize,
    /// How often finished writes' offsets are committed, ms (also the longest a record written to
    /// Cosmos DB waits for its commit). Called `max_wait_ms` before; that name is still accepted.
    #[serde(alias = "max_wait_ms")]
    pub commit_interval_ms: u64,
    /// Cosmos DB writes in flight.
    pub concurrency: usize,
    /// Flights whose last written version and ETag are remembered (saves the read before a replace).
    pub etag_cache_entries: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            window_records: 2_000,
            commit_interval_ms: 100,
            concurrency: 32,
            etag_cache_entries: 200_000,
        }
    }
}

impl CosmosWriterConfig {
    /// Checks values the types cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.batch.window_records == 0 {
            return Err("batch.window_records must be at least 1".to_owned());
        }
        if self.batch.commit_interval_ms == 0 {
            return Err("batch.commit_interval_ms must be at least 1".to_owned());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_settings_of_earlier_versions_still_configure_the_window() {
        let parse = |json: &str| serde_json::from_str::<BatchConfig>(json);
        let old = parse(r#"{"max_records": 10, "max_wait_ms": 5}"#).expect("old names");
        assert_eq!((old.window_records, old.commit_interval_ms), (10, 5));
        let new = parse(r#"{"window_records": 11, "commit_interval_ms": 6}"#).expect("new names");
        assert_eq!((new.window_records, new.commit_interval_ms), (11, 6));
        let error = parse(r#"{"window_record": 1}"#).expect_err("a misspelt key is refused");
        assert!(error.to_string().contains("window_record"), "{error}");
    }
}
