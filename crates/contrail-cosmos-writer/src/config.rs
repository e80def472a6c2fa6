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
    /// What the deployment writes: flight states (the serving documents) or the rotation
    /// processor's predictions (their fields of those documents). One per deployment, each in
    /// its own consumer group.
    pub input: Input,
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
            input: Input::default(),
            listen: ListenConfig::of(topology::COSMOS_WRITER),
            telemetry: TelemetryConfig::default(),
            kafka: KafkaConfig::default(),
            group: GroupConfig::with_id(FLIGHT_STATES_GROUP),
            topics: TopicsConfig::default(),
            batch: BatchConfig::default(),
            cosmos: CosmosConfig::default(),
            auth: AuthConfig::default(),
        }
    }
}

/// The records a cosmos-writer deployment writes to Cosmos DB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Input {
    /// `FlightState`s of `topics.curated`: each flight's document, guarded by `version`.
    #[default]
    FlightStates,
    /// `FlightPrediction`s of `topics.predictions` (the rotation processor's): `predictedOut`,
    /// `knockOnFrom`, … set on the flight's document, guarded by `predictionVersion`.
    Predictions,
}

/// The consumer group of the flight states' deployment, unless configured.
pub const FLIGHT_STATES_GROUP: &str = "contrail-cosmos-writer";

/// The consumer group of a predictions deployment, unless configured (a group of its own: in
/// the flight states' group it would take partitions of the curated topic's members).
pub const PREDICTIONS_GROUP: &str = "contrail-cosmos-predictions";

/// Topics cosmos-writer reads and writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsConfig {
    /// Input of `input = "flight_states"`: one `FlightState` per accepted event, keyed by flight
    /// key.
    pub curated: String,
    /// Input of `input = "predictions"`: `FlightPrediction`s keyed by flight key.
    pub predictions: String,
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
            predictions: topics::PREDICTIONS.to_owned(),
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
    /// The topic the deployment consumes.
    pub fn input_topic(&self) -> &str {
        match self.input {
            Input::FlightStates => &self.topics.curated,
            Input::Predictions => &self.topics.predictions,
        }
    }

    /// The configuration with the defaults that depend on `input`: a predictions deployment left
    /// in the flight states' default group gets [`PREDICTIONS_GROUP`].
    pub fn with_input_defaults(mut self) -> Self {
        if self.input == Input::Predictions && self.group.id == FLIGHT_STATES_GROUP {
            self.group.id = PREDICTIONS_GROUP.to_owned();
        }
        self
    }

    fn input_key(&self) -> &'static str {
        match self.input {
            Input::FlightStates => "curated",
            Input::Predictions => "predictions",
        }
    }

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
        if self.input_topic().trim().is_empty() {
            return Err(format!("topics.{} is empty", self.input_key()));
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

    #[test]
    fn a_predictions_deployment_reads_its_topic_in_a_group_of_its_own() {
        let mut config = CosmosWriterConfig {
            input: Input::Predictions,
            ..CosmosWriterConfig::default()
        }
        .with_input_defaults();
        assert_eq!(config.group.id, PREDICTIONS_GROUP);
        let flights = CosmosWriterConfig::default().with_input_defaults();
        assert_eq!(flights.group.id, FLIGHT_STATES_GROUP);
        assert_eq!(flights.input_topic(), "ops.flights.curated");
        assert_eq!(config.input_topic(), "ops.flights.predictions");
        config.topics.predictions = " ".to_owned();
        assert!(
            config
                .validate()
                .expect_err("empty")
                .contains("topics.predictions")
        );
        let parsed: CosmosWriterConfig =
            serde_json::from_str(r#"{"input": "predictions"}"#).expect("input parses");
        assert_eq!(parsed.input, Input::Predictions);
        assert!(serde_json::from_str::<CosmosWriterConfig>(r#"{"input": "prediction"}"#).is_err());
    }
}
