//! Configuration of the ingest stage (`contrail-ingest.toml`, `CONTRAIL_…` variables).

use std::path::PathBuf;

use contrail_common::config::{ListenConfig, Secret};
use contrail_common::kafka::KafkaConfig;
use contrail_common::telemetry::TelemetryConfig;
use contrail_common::topology::{self, topics};
use serde::{Deserialize, Serialize};

/// Everything the ingest stage can be told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IngestConfig {
    /// Instance name (pod name); defaults to `$HOSTNAME`.
    pub instance: String,
    /// HTTP and gRPC listen addresses.
    pub listen: ListenConfig,
    /// Logging.
    pub telemetry: TelemetryConfig,
    /// The broker.
    pub kafka: KafkaConfig,
    /// Topic names.
    pub topics: TopicsConfig,
    /// Authentication of the ingest API (`/v1/*`, `IngestService`): the tokens of data producers.
    pub auth: AuthConfig,
    /// Authentication of the admin API (pause, resume, drain, status): the tokens of operators,
    /// apart from `auth`, so a data producer cannot drain or pause ingest.
    pub admin_auth: AuthConfig,
    /// Size and capacity limits.
    pub limits: LimitsConfig,
    /// Where pull sources keep their cursors.
    pub cursor_dir: PathBuf,
    /// How many pull-source fetches may run at once, across all sources.
    pub source_concurrency: usize,
    /// Pull sources.
    pub sources: Vec<SourceConfig>,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            instance: std::env::var("HOSTNAME").unwrap_or_else(|_| "ingest-0".to_owned()),
            listen: ListenConfig::of(topology::INGEST),
            telemetry: TelemetryConfig::default(),
            kafka: KafkaConfig::default(),
            topics: TopicsConfig::default(),
            auth: AuthConfig::default(),
            admin_auth: AuthConfig::default(),
            limits: LimitsConfig::default(),
            cursor_dir: PathBuf::from("./data/ingest/cursors"),
            source_concurrency: 16,
            sources: Vec::new(),
        }
    }
}

/// Topics ingest writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsConfig {
    /// Valid events.
    pub raw: String,
    /// Rejected records.
    pub dlq: String,
    /// Create the topics at start if missing (local development; off against Event Hubs).
    pub create: bool,
    /// Partitions of created topics.
    pub partitions: i32,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        TopicsConfig {
            raw: topics::RAW.to_owned(),
            dlq: topics::DLQ.to_owned(),
            create: true,
            partitions: 4,
        }
    }
}

pub use contrail_common::auth::AuthConfig;

/// Room the stages after ingest need besides a record's own bytes (positions, reasons, keys).
pub const RECORD_HEADROOM_BYTES: usize = 64 * 1024;

/// Limits that keep memory bounded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest request body, after gzip decompression, in bytes (`413` above).
    pub max_body_bytes: usize,
    /// Most records in one request (`413` above).
    pub max_records_per_request: usize,
    /// Most records accepted but not yet acknowledged by the broker, over all requests; above it
    /// requests get `429` with `Retry-After`.
    pub max_in_flight_records: usize,
    /// Most bytes (records as received) accepted but not yet acknowledged by the broker, over all
    /// requests; above it requests get `429` with `Retry-After`. With `max_in_flight_records` this
    /// bounds ingest's memory whatever the records' sizes.
    pub max_in_flight_bytes: usize,
    /// How long a request waits for broker acknowledgements before answering `503`.
    pub produce_timeout_ms: u64,
    /// librdkafka `message.timeout.ms`: how long the producer keeps retrying one record.
    pub delivery_timeout_ms: u64,
    /// Largest record, in bytes as received (JSON, or protobuf over gRPC): a larger one is
    /// rejected (`400` naming it) and dead-lettered with its first bytes. At least 64 KiB below
    /// the broker's message limit (`kafka.properties."message.max.bytes"`, 1,000,000 by default),
    /// so every stage after ingest can write what it derives from the record.
    pub max_record_bytes: usize,
    /// How far ahead of ingest's clock a record's `event_time` may be (docs/CONTRACT.md,
    /// "Plausible time"); a record further ahead is rejected (`400` naming it) and dead-lettered.
    pub max_clock_skew_secs: i64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_body_bytes: 16 * 1024 * 1024,
            max_records_per_request: 10_000,
            max_in_flight_records: 200_000,
            max_in_flight_bytes: 256 * 1024 * 1024,
            produce_timeout_ms: 10_000,
            delivery_timeout_ms: 120_000,
            max_record_bytes: 512 * 1024,
            max_clock_skew_secs: 3_600,
        }
    }
}

/// One pull source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "snake_case")]
pub enum SourceConfig {
    /// Polls a paged HTTP endpoint (see `crates/contrail-ingest/README.md`, "Pull sources").
    HttpPoll(HttpPollConfig),
    /// Replays nycflights13 as operational events.
    Replay(ReplaySourceConfig),
}

impl SourceConfig {
    /// The source's name (cursor key, metrics label).
    pub fn name(&self) -> &str {
        match self {
            SourceConfig::HttpPoll(config) => &config.name,
            SourceConfig::Replay(config) => &config.name,
        }
    }
}

/// A paged HTTP endpoint: `GET {url}?cursor=…&limit=…` → `{"events":[…],"next_cursor":"…","has_more":…}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpPollConfig {
    /// Unique source name.
    pub name: String,
    /// Endpoint URL.
    pub url: String,
    /// Records per page.
    #[serde(default = "default_page_size")]
    pub page_size: usize,
    /// Pause between polls once caught up.
    #[serde(default = "default_poll_interval_ms")]
    pub poll_interval_ms: u64,
    /// Bearer token for the endpoint.
    #[serde(default)]
    pub token: Secret,
    /// Per-request timeout.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
}

/// Whether this build carries the nycflights13 replay source (cargo feature `replay`).
pub const REPLAY_BUILT: bool = cfg!(feature = "replay");

/// The start-up error for a replay source in a build without the `replay` feature.
pub fn replay_not_built(name: &str) -> String {
    format!(
        "sources.{name}: kind = \"replay\" (the nycflights13 demo source) is not in this build of \
         ingest (built without the cargo feature `replay`, as production images are); remove the \
         source or use a build with default features"
    )
}

/// The nycflights13 replay as a pull source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaySourceConfig {
    /// Unique source name.
    pub name: String,
    /// Folder with `flights.csv.zip` and `airports.csv`; default: the shipped data.
    #[serde(default)]
    pub data_dir: Option<PathBuf>,
    /// First service date, `YYYY-MM-DD`.
    #[serde(default)]
    pub from: Option<String>,
    /// Last service date (inclusive).
    #[serde(default)]
    pub to: Option<String>,
    /// Seed of duplicates/disorder.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Share of redelivered events.
    #[serde(default)]
    pub duplicate_rate: f64,
    /// Maximum disorder, minutes of event time.
    #[serde(default)]
    pub max_disorder_minutes: i64,
    /// Share of stragglers.
    #[serde(default)]
    pub straggler_rate: f64,
    /// Events per second; 0 = as fast as possible.
    #[serde(default)]
    pub rate_limit: u64,
    /// Records per page.
    #[serde(default = "default_page_size")]
    pub page_size: usize,
}

fn default_page_size() -> usize {
    500
}
fn default_poll_interval_ms() -> u64 {
    1_000
}
fn default_request_timeout_ms() -> u64 {
    10_000
}
fn default_seed() -> u64 {
    2013
}

impl IngestConfig {
    /// Checks what serde cannot: names, ranges, relations. Errors name the key and the value.
    pub fn validate(&self) -> Result<(), String> {
        self.validate_for_build(REPLAY_BUILT)
    }

    /// [`IngestConfig::validate`] for a build with or without the replay source.
    fn validate_for_build(&self, replay_built: bool) -> Result<(), String> {
        let limits = &self.limits;
        if limits.max_records_per_request == 0 || limits.max_in_flight_records == 0 {
            return Err(
                "limits.max_records_per_request and limits.max_in_flight_records must be > 0".to_owned(),
            );
        }
        if limits.max_in_flight_bytes < limits.max_body_bytes || u32::try_from(limits.max_body_bytes).is_err()
        {
            return Err(format!(
                "limits.max_in_flight_bytes = {} must be at least limits.max_body_bytes = {} (at most 4 GiB), \
                 or a full request could never be taken",
                limits.max_in_flight_bytes, limits.max_body_bytes
            ));
        }
        if limits.max_records_per_request > limits.max_in_flight_records {
            return Err(format!(
                "limits.max_records_per_request ({}) must not exceed limits.max_in_flight_records ({})",
                limits.max_records_per_request, limits.max_in_flight_records
            ));
        }
        let message_limit = self.kafka.max_message_bytes();
        if limits.max_record_bytes == 0 || limits.max_record_bytes + RECORD_HEADROOM_BYTES > message_limit {
            return Err(format!(
                "limits.max_record_bytes = {}: must be between 1 and {} (the broker's message limit \
                 {message_limit} less {RECORD_HEADROOM_BYTES} bytes for what later stages add to a record)",
                limits.max_record_bytes,
                message_limit.saturating_sub(RECORD_HEADROOM_BYTES)
            ));
        }
        if limits.max_clock_skew_secs < 0 {
            return Err(format!(
                "limits.max_clock_skew_secs = {}: must not be negative",
                limits.max_clock_skew_secs
            ));
        }
        if self.source_concurrency == 0 {
            return Err("source_concurrency must be > 0".to_owned());
        }
        let mut names = std::collections::BTreeSet::new();
        for source in &self.sources {
            let name = source.name();
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(format!("sources: name {name:?} must be non-empty [A-Za-z0-9_-]"));
            }
            if !names.insert(name) {
                return Err(format!("sources: name {name:?} is used twice"));
            }
            if let SourceConfig::Replay(replay) = source {
                if !replay_built {
                    return Err(replay_not_built(name));
                }
                for (key, value) in [
                    ("duplicate_rate", replay.duplicate_rate),
                    ("straggler_rate", replay.straggler_rate),
                ] {
                    if !(0.0..=1.0).contains(&value) {
                        return Err(format!("sources.{name}.{key} = {value}: must be between 0 and 1"));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_replay_source() -> IngestConfig {
        let mut config = IngestConfig::default();
        config.sources.push(SourceConfig::Replay(ReplaySourceConfig {
            name: "demo".to_owned(),
            data_dir: None,
            from: None,
            to: None,
            seed: 7,
            duplicate_rate: 0.1,
            max_disorder_minutes: 0,
            straggler_rate: 0.0,
            rate_limit: 0,
            page_size: 100,
        }));
        config
    }

    #[test]
    fn a_replay_source_needs_a_build_with_the_replay_feature() {
        let config = with_replay_source();
        assert_eq!(config.validate_for_build(true), Ok(()));
        let error = config
            .validate_for_build(false)
            .expect_err("refused without the feature");
        assert!(error.contains("sources.demo"), "{error}");
        assert!(error.contains("`replay`"), "{error}");
        // This workspace's build (default features) carries it.
        const { assert!(REPLAY_BUILT) };
        assert_eq!(config.validate(), Ok(()));
    }

    #[test]
    fn limits_that_could_never_be_met_are_named() {
        let mut config = IngestConfig::default();
        config.limits.max_in_flight_bytes = 1_000;
        let error = config
            .validate()
            .expect_err("a full request could never be taken");
        assert!(
            error.contains("limits.max_in_flight_bytes = 1000")
                && error.contains("limits.max_body_bytes = 16777216"),
            "{error}"
        );
        let mut config = IngestConfig::default();
        config.limits.max_clock_skew_secs = -5;
        let error = config.validate().expect_err("a negative skew");
        assert!(error.contains("limits.max_clock_skew_secs = -5"), "{error}");
    }
}
