//! Configuration of the delta-archiver stage (`CONTRAIL_…` variables, `--config` TOML).

use std::collections::BTreeMap;
use std::time::Duration;

use contrail_common::auth::AuthConfig;
use contrail_common::config::{ListenConfig, Secret};
use contrail_common::kafka::{GroupConfig, KafkaConfig};
use contrail_common::telemetry::TelemetryConfig;
use contrail_common::topology::{self, topics};
use serde::{Deserialize, Serialize};

use crate::progress::Thresholds;
use contrail_history::Table;

/// Everything the delta-archiver stage can be told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeltaArchiverConfig {
    /// Instance name (pod name); defaults to `$HOSTNAME`.
    pub instance: String,
    /// Where the tables live (`CONTRAIL_DELTA_ROOT`): a local directory (default `data/delta`),
    /// `file:///…`, or `abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH` (ADLS Gen2; see
    /// `delta.storage_options`). Each table is a directory below it.
    pub delta_root: String,
    /// HTTP (probes, metrics) and gRPC (admin) listen addresses.
    pub listen: ListenConfig,
    /// Logging.
    pub telemetry: TelemetryConfig,
    /// The broker.
    pub kafka: KafkaConfig,
    /// Consumer group membership.
    pub group: GroupConfig,
    /// Topic names; an empty name leaves that table out.
    pub topics: TopicsConfig,
    /// When a batch is committed.
    pub batch: BatchConfig,
    /// Delta table settings and storage credentials.
    pub delta: DeltaConfig,
    /// Scheduled compaction, checkpoints and vacuum.
    pub maintenance: MaintenanceConfig,
    /// Fault injection for tests; only in builds with the cargo feature `testing` (not the images),
    /// elsewhere an unknown key.
    #[cfg(feature = "testing")]
    pub testing: TestingConfig,
    /// Authentication of the admin API.
    pub auth: AuthConfig,
}

impl Default for DeltaArchiverConfig {
    fn default() -> Self {
        DeltaArchiverConfig {
            instance: std::env::var("HOSTNAME").unwrap_or_else(|_| "delta-archiver-0".to_owned()),
            delta_root: "data/delta".to_owned(),
            listen: ListenConfig::of(topology::DELTA_ARCHIVER),
            telemetry: TelemetryConfig::default(),
            kafka: KafkaConfig::default(),
            group: GroupConfig::with_id("contrail-delta-archiver"),
            topics: TopicsConfig::default(),
            batch: BatchConfig::default(),
            delta: DeltaConfig::default(),
            maintenance: MaintenanceConfig::default(),
            #[cfg(feature = "testing")]
            testing: TestingConfig::default(),
            auth: AuthConfig::default(),
        }
    }
}

/// Topics delta-archiver reads (one table each) and writes (dead letters).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsConfig {
    /// → table `events`.
    pub accepted: String,
    /// → table `flight_states`.
    pub curated: String,
    /// → table `late_events`.
    pub late: String,
    /// → table `serving_changes`.
    pub changes: String,
    /// → table `alerts` (raised and resolved).
    pub alerts: String,
    /// → table `predictions` (the rotation processor's `ops.flights.predictions`); empty (the
    /// default): not archived.
    pub predictions: String,
    /// Records that cannot be archived (undecodable, no identity, no valid date).
    pub dlq: String,
    /// Create missing topics at start (local development; off against Event Hubs).
    pub create: bool,
    /// Partitions of created topics.
    pub partitions: i32,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        TopicsConfig {
            accepted: topics::ACCEPTED.to_owned(),
            curated: topics::CURATED.to_owned(),
            late: topics::LATE.to_owned(),
            changes: topics::CHANGES.to_owned(),
            alerts: topics::ALERTS.to_owned(),
            predictions: String::new(),
            dlq: topics::DLQ.to_owned(),
            create: true,
            partitions: 4,
        }
    }
}

impl TopicsConfig {
    /// `(table, topic)` for every configured table.
    pub fn tables(&self) -> Vec<(Table, String)> {
        [
            (Table::Events, &self.accepted),
            (Table::FlightStates, &self.curated),
            (Table::LateEvents, &self.late),
            (Table::ServingChanges, &self.changes),
            (Table::Alerts, &self.alerts),
            (Table::Predictions, &self.predictions),
        ]
        .into_iter()
        .filter(|(_, topic)| !topic.trim().is_empty())
        .map(|(table, topic)| (table, topic.clone()))
        .collect()
    }
}

/// A batch (all tables together) is committed when the first of these is reached. Large batches
/// make few, large files (FACTS: committing every 10k rows gives 100 files per million rows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Records per batch.
    pub max_rows: usize,
    /// Record bytes per batch.
    pub max_bytes: usize,
    /// Longest time a record waits for its commit, ms (the history's freshness).
    pub max_latency_ms: u64,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            max_rows: 100_000,
            max_bytes: 128 * 1024 * 1024,
            max_latency_ms: 10_000,
        }
    }
}

impl BatchConfig {
    /// As thresholds.
    pub fn thresholds(&self) -> Thresholds {
        Thresholds {
            max_rows: self.max_rows,
            max_bytes: self.max_bytes,
            max_latency: Duration::from_millis(self.max_latency_ms),
        }
    }
}

/// Table settings applied when a table is created, and storage options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeltaConfig {
    /// `delta.checkpointInterval`: a checkpoint every N commits (written by the committing
    /// instance, no extra job).
    pub checkpoint_interval: u32,
    /// `delta.logRetentionDuration` in days: older log entries are cleaned up after checkpoints.
    pub log_retention_days: u32,
    /// Target size of a written Parquet file, MiB.
    pub target_file_mb: u64,
    /// object_store options for the root, e.g. for ADLS Gen2 `azure_storage_account_name`,
    /// `azure_client_id` + `azure_federated_token_file` + `azure_tenant_id` (workload identity)
    /// or `azure_storage_account_key`. Values are secrets: never printed. `AZURE_*` environment
    /// variables are honoured as well.
    pub storage_options: BTreeMap<String, Secret>,
}

impl Default for DeltaConfig {
    fn default() -> Self {
        DeltaConfig {
            checkpoint_interval: 10,
            log_retention_days: 30,
            target_file_mb: 128,
            storage_options: BTreeMap::new(),
        }
    }
}

/// Scheduled maintenance, run between batches by every instance (each table at most once per
/// interval per instance; Delta's optimistic concurrency makes concurrent runs safe).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MaintenanceConfig {
    /// Run it at all.
    pub enabled: bool,
    /// Seconds between runs.
    pub interval_s: u64,
    /// Compact a table partition (date) once it has at least this many files smaller than
    /// `delta.target_file_mb` (0 = never compact).
    pub compact_min_files: usize,
    /// Vacuum removes files unreferenced for longer than this (also the orphans of a crash
    /// between Parquet flush and commit). At least 3600: a shorter one could remove another
    /// instance's files between its flush and its commit.
    pub vacuum_retention_s: u64,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        MaintenanceConfig {
            enabled: true,
            interval_s: 3_600,
            compact_min_files: 16,
            vacuum_retention_s: 7 * 24 * 3_600,
        }
    }
}

/// Fault injection for tests.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TestingConfig {
    /// Sleep between writing a batch's Parquet files and committing them, ms (widens the window
    /// a `kill -9` must hit to leave orphan files).
    pub pause_before_commit_ms: u64,
}

impl DeltaArchiverConfig {
    /// Checks values the types cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.delta_root.trim().is_empty() {
            return Err("delta_root (CONTRAIL_DELTA_ROOT) is empty".to_owned());
        }
        if self.topics.tables().is_empty() {
            return Err("topics: every table's topic is empty, nothing to archive".to_owned());
        }
        if self.batch.max_rows == 0 || self.batch.max_bytes == 0 {
            return Err("batch.max_rows and batch.max_bytes must be at least 1".to_owned());
        }
        if self.delta.checkpoint_interval == 0 {
            return Err("delta.checkpoint_interval must be at least 1".to_owned());
        }
        if self.maintenance.vacuum_retention_s < 3_600 {
            return Err(format!(
                "maintenance.vacuum_retention_s = {} is below 3600: vacuum could delete files \
                 another instance has written but not yet committed",
                self.maintenance.vacuum_retention_s
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_name_every_table_but_predictions() {
        let config = DeltaArchiverConfig::default();
        config.validate().expect("defaults valid");
        let tables: Vec<Table> = config
            .topics
            .tables()
            .into_iter()
            .map(|(table, _)| table)
            .collect();
        let expected: Vec<Table> = Table::ALL
            .into_iter()
            .filter(|table| *table != Table::Predictions)
            .collect();
        assert_eq!(tables, expected);
    }

    #[test]
    fn a_short_vacuum_retention_is_refused_with_the_value() {
        let mut config = DeltaArchiverConfig::default();
        config.maintenance.vacuum_retention_s = 60;
        let error = config.validate().expect_err("refused");
        assert!(error.contains("vacuum_retention_s = 60"), "{error}");
    }

    #[test]
    fn storage_secrets_are_not_rendered() {
        let mut config = DeltaArchiverConfig::default();
        config
            .delta
            .storage_options
            .insert("azure_storage_account_key".to_owned(), Secret::new("hunter2"));
        let rendered = contrail_common::config::render_effective(&config);
        assert!(!rendered.contains("hunter2"), "{rendered}");
        assert!(rendered.contains("azure_storage_account_key"), "{rendered}");
    }

    /// The annotated example in deploy/config parses with the real loader and is valid.
    #[test]
    fn the_example_configuration_is_valid() {
        let path = std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo"))
            .join("../../deploy/config/delta-archiver.example.toml");
        let no_environment = figment::providers::Env::prefixed("CONTRAIL_EXAMPLE_TEST_UNSET_");
        let config: DeltaArchiverConfig =
            contrail_common::config::load_from(Some(&path), no_environment).expect("example parses");
        assert_eq!(config.validate(), Ok(()));
        assert!(config.delta_root.starts_with("abfss://"));
        assert_eq!(
            config.topics.tables().len(),
            Table::ALL.len() - 1,
            "predictions off by default"
        );
    }
}
