//! Configuration of the changefeed-sync stage (`CONTRAIL_…` variables, `--config` TOML).

use contrail_common::auth::AuthConfig;
use contrail_common::config::ListenConfig;
use contrail_common::kafka::KafkaConfig;
use contrail_common::telemetry::TelemetryConfig;
use contrail_common::topology::{self, topics};
use contrail_cosmos::CosmosConfig;
use serde::{Deserialize, Serialize};

/// Everything the changefeed-sync stage can be told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChangefeedSyncConfig {
    /// Instance name (pod name); the owner name written into leases. Defaults to `$HOSTNAME`.
    pub instance: String,
    /// HTTP (probes, metrics) and gRPC (admin) listen addresses.
    pub listen: ListenConfig,
    /// Logging.
    pub telemetry: TelemetryConfig,
    /// The broker.
    pub kafka: KafkaConfig,
    /// Topic names.
    pub topics: TopicsConfig,
    /// Lease timing and polling.
    pub leases: LeasesConfig,
    /// The Cosmos DB account (the `flights` container is read, `leases` written).
    pub cosmos: CosmosConfig,
    /// Authentication of the admin API.
    pub auth: AuthConfig,
}

impl Default for ChangefeedSyncConfig {
    fn default() -> Self {
        ChangefeedSyncConfig {
            instance: std::env::var("HOSTNAME").unwrap_or_else(|_| "changefeed-sync-0".to_owned()),
            listen: ListenConfig::of(topology::CHANGEFEED_SYNC),
            telemetry: TelemetryConfig::default(),
            kafka: KafkaConfig::default(),
            topics: TopicsConfig::default(),
            leases: LeasesConfig::default(),
            cosmos: CosmosConfig::default(),
            auth: AuthConfig::default(),
        }
    }
}

/// The output topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsConfig {
    /// One `ServingChange` per document change, keyed by flight key.
    pub changes: String,
    /// Create the topic when missing (local development; off against Event Hubs).
    pub create: bool,
    /// Partitions of a created topic.
    pub partitions: i32,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        TopicsConfig {
            changes: topics::CHANGES.to_owned(),
            create: true,
            partitions: 4,
        }
    }
}

/// Lease timing (the .NET/Java change feed processor's defaults, shortened for a local broker).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeasesConfig {
    /// How often owned leases are renewed and the balance is checked, ms.
    pub renew_interval_ms: u64,
    /// A lease not renewed for this long is free to take over, ms (several renew intervals).
    pub expiry_ms: u64,
    /// Pause between polls of a caught-up feed range, ms.
    pub poll_interval_ms: u64,
    /// Most changes per page.
    pub max_items_per_page: u32,
    /// How often every feed range is checked to have a lease (missing ones are created), ms; also
    /// checked at start.
    pub coverage_check_interval_ms: u64,
}

impl Default for LeasesConfig {
    fn default() -> Self {
        LeasesConfig {
            renew_interval_ms: 2_000,
            expiry_ms: 10_000,
            poll_interval_ms: 500,
            max_items_per_page: 1_000,
            coverage_check_interval_ms: 60_000,
        }
    }
}

impl ChangefeedSyncConfig {
    /// Checks values the types cannot.
    pub fn validate(&self) -> Result<(), String> {
        let leases = &self.leases;
        if leases.renew_interval_ms == 0 || leases.expiry_ms < 2 * leases.renew_interval_ms {
            return Err(format!(
                "leases.expiry_ms = {} must be at least twice leases.renew_interval_ms = {}",
                leases.expiry_ms, leases.renew_interval_ms
            ));
        }
        if leases.max_items_per_page == 0 {
            return Err("leases.max_items_per_page must be at least 1".to_owned());
        }
        if self.instance.trim().is_empty() {
            return Err("instance is empty: it names the lease owner".to_owned());
        }
        self.cosmos.validate().map_err(|error| error.to_string())
    }
}
