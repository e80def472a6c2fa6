//! Azure Cosmos DB access shared by `cosmos-writer` and `changefeed-sync` (docs/CONTRACT.md,
//! "Stores"): the `[cosmos]` config section, building the `azure_data_cosmos` client (account key
//! or Entra ID), creating the database and containers when asked, and classifying errors into
//! what a stage does next (retry, guard conflict, give up); the version-guarded document write
//! ([`writer::DocumentWriter`]) that cosmos-writer and `contrail backfill serving` share.

#[cfg(feature = "fault-injection")]
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "fault-injection")]
use azure_data_cosmos::fault_injection::{
    FaultInjectionErrorType, FaultInjectionResultBuilder, FaultInjectionRuleBuilder,
};
use azure_data_cosmos::models::{ContainerProperties, PartitionKeyDefinition};
use azure_data_cosmos::options::{OperationOptions, ThrottlingRetryOptions};
use azure_data_cosmos::{
    AccountEndpoint, AccountReference, ContainerClient, CosmosClient, CosmosClientBuilder, CosmosError,
    RoutingStrategy,
};
use contrail_common::config::Secret;
use serde::{Deserialize, Serialize};

pub mod guard;
pub mod writer;

/// How the stage authenticates to Cosmos DB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CosmosAuth {
    /// The account key in `cosmos.key` (`CONTRAIL_COSMOS__KEY`).
    #[default]
    Key,
    /// Entra ID through AKS workload identity (`AZURE_CLIENT_ID`, `AZURE_TENANT_ID`,
    /// `AZURE_FEDERATED_TOKEN_FILE`, set by the workload identity webhook).
    WorkloadIdentity,
    /// Entra ID through the managed identity of the node / VM.
    ManagedIdentity,
}

/// Fault injection for resilience tests, through the SDK's own fault-injection layer. Off unless
/// a probability is set; a stage logs a warning at start when it is on. Only in builds with the
/// cargo feature `fault-injection` (test builds, not the images).
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct FaultInjectionConfig {
    /// Probability (0..=1) that a request is answered with an injected 429 Too Many Requests.
    pub throttle_probability: f32,
    /// Probability (0..=1) that a request is answered with an injected 503 Service Unavailable.
    pub unavailable_probability: f32,
}

/// The `[cosmos]` section of a stage's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CosmosConfig {
    /// Account endpoint, `https://ACCOUNT.documents.azure.com:443/` (plain http only for localhost).
    pub endpoint: String,
    /// How to authenticate.
    pub auth: CosmosAuth,
    /// Account key (with `auth = "key"`). Secret: never logged.
    pub key: Secret,
    /// The region to prefer (requests go to the nearest available region from here).
    pub region: String,
    /// Database name.
    pub database: String,
    /// Serving container (partition key `/flightKey`).
    pub flights_container: String,
    /// Lease container of changefeed-sync (partition key `/id`).
    pub leases_container: String,
    /// Create the database and containers when missing (for local use; off in production, where
    /// they are provisioned with their throughput by infrastructure code).
    pub create_if_missing: bool,
    /// Throughput (RU/s) for containers this stage creates; 0 = account default / serverless.
    pub create_throughput: u32,
    /// How often the SDK itself retries a 429 (honouring `x-ms-retry-after-ms`) before the stage
    /// sees it and backs off on its own.
    pub sdk_throttle_retries: u32,
    /// Test-only fault injection (cargo feature `fault-injection`; elsewhere an unknown key).
    #[cfg(feature = "fault-injection")]
    pub fault_injection: FaultInjectionConfig,
}

impl Default for CosmosConfig {
    fn default() -> Self {
        CosmosConfig {
            endpoint: "http://127.0.0.1:8900/".to_owned(),
            auth: CosmosAuth::Key,
            key: Secret::default(),
            region: "East US".to_owned(),
            database: "contrail".to_owned(),
            flights_container: "flights".to_owned(),
            leases_container: "leases".to_owned(),
            create_if_missing: true,
            create_throughput: 0,
            sdk_throttle_retries: 9,
            #[cfg(feature = "fault-injection")]
            fault_injection: FaultInjectionConfig::default(),
        }
    }
}

/// Errors of the Cosmos layer.
#[derive(Debug, thiserror::Error)]
pub enum CosmosStoreError {
    /// A configuration value is unusable; the message names it.
    #[error("cosmos config: {0}")]
    Config(String),
    /// The service (or the network) answered with an error.
    #[error("cosmos {operation}: {status} {message}")]
    Service {
        /// What was attempted.
        operation: String,
        /// HTTP status (0 = no response: transport failure).
        status: u16,
        /// Sub-status, when the service sent one.
        sub_status: Option<u32>,
        /// The SDK's message.
        message: String,
    },
    /// A document could not be (de)serialised.
    #[error("cosmos document {id}: {message}")]
    Document {
        /// Document id.
        id: String,
        /// What is wrong.
        message: String,
    },
}

/// What to do about a failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// 429, 503, 408, 449, 410, 500, transport failures: back off and retry.
    Retry,
    /// 412 Precondition Failed: someone wrote in between; re-read and decide again.
    PreconditionFailed,
    /// 409 Conflict: created concurrently; re-read and decide again.
    Conflict,
    /// 404 Not Found.
    NotFound,
    /// 401/403: the credentials were refused (a rotated key, a missing role assignment). An
    /// outage of the stage, not a fault of the record: back off, report not ready, say what to
    /// fix, and retry — never dead-letter or commit past it.
    Unauthorized,
    /// Anything else (400, 413 …): the service refuses the request on its own merits; retrying
    /// cannot help.
    Fatal,
}

/// What to check when Cosmos DB refuses the credentials.
pub const CREDENTIALS_HINT: &str = "check cosmos.key (CONTRAIL_COSMOS__KEY: a regenerated account key must be \
     redeployed), or with cosmos.auth = workload_identity / managed_identity that the identity holds the \
     \"Cosmos DB Built-in Data Contributor\" role on the account";

/// What to do when the container is missing.
pub const MISSING_CONTAINER_HINT: &str = "recreate the container and refill it from the history: \
     `contrail backfill serving --from-delta ROOT` (the writes waiting here go through the same version \
     guard once it exists)";

/// Classifies an HTTP status (0 = no response).
pub fn classify_status(status: u16) -> ErrorClass {
    match status {
        412 => ErrorClass::PreconditionFailed,
        409 => ErrorClass::Conflict,
        404 => ErrorClass::NotFound,
        0 | 408 | 410 | 429 | 449 | 500 | 502 | 503 | 504 => ErrorClass::Retry,
        401 | 403 => ErrorClass::Unauthorized,
        _ => ErrorClass::Fatal,
    }
}

impl CosmosStoreError {
    /// Wraps an SDK error for `operation`.
    pub fn service(operation: impl Into<String>, error: &CosmosError) -> CosmosStoreError {
        let status = error.status();
        let code = u16::from(status.status_code());
        CosmosStoreError::Service {
            operation: operation.into(),
            status: if error.is_from_wire() { code } else { 0 },
            sub_status: status.sub_status().map(|sub| u32::from(sub.value())),
            message: error.to_string().lines().next().unwrap_or_default().to_owned(),
        }
    }

    /// What to do about it.
    pub fn class(&self) -> ErrorClass {
        match self {
            CosmosStoreError::Service { status, .. } => classify_status(*status),
            CosmosStoreError::Config(_) | CosmosStoreError::Document { .. } => ErrorClass::Fatal,
        }
    }

    /// HTTP status, if the service answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            CosmosStoreError::Service { status, .. } if *status != 0 => Some(*status),
            _ => None,
        }
    }

    /// Whether retrying later can succeed.
    pub fn is_retryable(&self) -> bool {
        self.class() == ErrorClass::Retry
    }

    /// Whether the credentials were refused (401/403): an outage until someone fixes them.
    pub fn is_unauthorized(&self) -> bool {
        self.class() == ErrorClass::Unauthorized
    }
}

/// Refused credentials (401/403) and a missing container are outages of the stage: writes wait
/// and retry, the stage reports not ready, and an error says what to fix (every 30 s at most,
/// however many writes are waiting); the first write that succeeds ends it.
#[derive(Default)]
pub struct CredentialOutage {
    /// What waits ("writes", "change feed reads"), for the log.
    what: &'static str,
    health: Option<contrail_common::server::Health>,
    /// When the last error was logged (`None`: no outage).
    since: std::sync::Mutex<Option<std::time::Instant>>,
}

impl CredentialOutage {
    /// An outage tracker for `what` waits, that also drives `health` (readiness).
    pub fn with_health(what: &'static str, health: contrail_common::server::Health) -> CredentialOutage {
        CredentialOutage {
            what,
            health: Some(health),
            since: std::sync::Mutex::new(None),
        }
    }

    /// `error` refused the credentials: not ready, and an error log (every 30 s at most).
    pub fn refused(&self, error: &CosmosStoreError) {
        if self.begins_or_reminds() {
            tracing::error!(%error, hint = CREDENTIALS_HINT, waiting = self.what, "Cosmos DB refuses the credentials: nothing is dead-lettered or committed until they are fixed");
        }
    }

    /// `error` says the container (or its database) does not exist — deleted, or never created:
    /// not ready, and an error log (every 30 s at most).
    pub fn container_missing(&self, error: &CosmosStoreError) {
        if self.begins_or_reminds() {
            tracing::error!(%error, hint = MISSING_CONTAINER_HINT, waiting = self.what, "the Cosmos DB container does not exist: nothing is dead-lettered or committed until it is back");
        }
    }

    /// Marks the stage not ready; true when the outage begins or was last logged 30 s ago.
    fn begins_or_reminds(&self) -> bool {
        if let Some(health) = &self.health {
            health.set_ready(false);
        }
        let mut since = self.since.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let log = since.is_none_or(|logged| logged.elapsed() >= std::time::Duration::from_secs(30));
        if log {
            *since = Some(std::time::Instant::now());
        }
        log
    }

    /// A request succeeded: the outage, if any, is over.
    pub fn succeeded(&self) {
        let mut since = self.since.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if since.take().is_some() {
            tracing::info!(resuming = self.what, "Cosmos DB accepts requests again");
            if let Some(health) = &self.health {
                health.set_ready(true);
            }
        }
    }
}

/// The database's containers a stage uses.
#[derive(Clone)]
pub struct Containers {
    /// The client (keeps the driver alive).
    pub client: CosmosClient,
    /// `flights`.
    pub flights: ContainerClient,
    /// `leases`.
    pub leases: ContainerClient,
}

impl CosmosConfig {
    /// Checks values that would otherwise fail later with a vaguer message.
    pub fn validate(&self) -> Result<(), CosmosStoreError> {
        if self.endpoint.trim().is_empty() {
            return Err(CosmosStoreError::Config("cosmos.endpoint is empty".to_owned()));
        }
        if self.auth == CosmosAuth::Key && self.key.is_empty() {
            return Err(CosmosStoreError::Config(
                "cosmos.key is empty: set CONTRAIL_COSMOS__KEY (account key) or cosmos.auth = \
                 \"workload_identity\" / \"managed_identity\""
                    .to_owned(),
            ));
        }
        #[cfg(feature = "fault-injection")]
        for (name, probability) in [
            ("throttle_probability", self.fault_injection.throttle_probability),
            (
                "unavailable_probability",
                self.fault_injection.unavailable_probability,
            ),
        ] {
            if !(0.0..=1.0).contains(&probability) {
                return Err(CosmosStoreError::Config(format!(
                    "cosmos.fault_injection.{name} = {probability}: must be between 0 and 1"
                )));
            }
        }
        Ok(())
    }

    #[cfg(feature = "fault-injection")]
    fn fault_rules(&self) -> Vec<Arc<azure_data_cosmos::fault_injection::FaultInjectionRule>> {
        let mut rules = Vec::new();
        let faults = [
            (
                "contrail-throttle",
                FaultInjectionErrorType::TooManyRequests,
                self.fault_injection.throttle_probability,
            ),
            (
                "contrail-unavailable",
                FaultInjectionErrorType::ServiceUnavailable,
                self.fault_injection.unavailable_probability,
            ),
        ];
        for (id, error, probability) in faults {
            if probability > 0.0 {
                let result = FaultInjectionResultBuilder::new()
                    .with_error(error)
                    .with_probability(probability)
                    .build();
                rules.push(Arc::new(FaultInjectionRuleBuilder::new(id, result).build()));
            }
        }
        rules
    }

    /// Builds the client. `stage` names the application in the user agent.
    pub async fn connect(&self, stage: &str) -> Result<CosmosClient, CosmosStoreError> {
        self.validate()?;
        tracing::debug!(stage, endpoint = %self.endpoint, auth = ?self.auth, "connecting to Cosmos DB");
        let endpoint: AccountEndpoint = self.endpoint.parse().map_err(|error| {
            CosmosStoreError::Config(format!("cosmos.endpoint {:?}: {error}", self.endpoint))
        })?;
        let account = match self.auth {
            CosmosAuth::Key => AccountReference::with_authentication_key(
                endpoint,
                azure_core::credentials::Secret::new(self.key.expose().to_owned()),
            ),
            CosmosAuth::WorkloadIdentity => {
                let credential = azure_identity::WorkloadIdentityCredential::new(None)
                    .map_err(|error| CosmosStoreError::Config(format!("workload identity: {error}")))?;
                AccountReference::with_credential(endpoint, credential)
            }
            CosmosAuth::ManagedIdentity => {
                let credential = azure_identity::ManagedIdentityCredential::new(None)
                    .map_err(|error| CosmosStoreError::Config(format!("managed identity: {error}")))?;
                AccountReference::with_credential(endpoint, credential)
            }
        };
        let mut throttling = ThrottlingRetryOptions::default();
        throttling.max_retry_count = Some(self.sdk_throttle_retries);
        throttling.max_retry_wait_time = Some(Duration::from_secs(30));
        let mut operation = OperationOptions::default();
        operation.throttling_retry_options = Some(throttling);
        #[cfg_attr(not(feature = "fault-injection"), allow(unused_mut))]
        let mut builder = CosmosClientBuilder::new().with_default_operation_options(operation);
        #[cfg(feature = "fault-injection")]
        let rules = self.fault_rules();
        #[cfg(feature = "fault-injection")]
        if !rules.is_empty() {
            tracing::warn!(
                stage,
                throttle_probability = self.fault_injection.throttle_probability,
                unavailable_probability = self.fault_injection.unavailable_probability,
                "cosmos fault injection is ON (test setting)"
            );
            builder = builder
                .with_fault_injection_rules(rules)
                .map_err(|error| CosmosStoreError::service("fault injection rules", &error))?;
        }
        let region = azure_data_cosmos::options::Region::from(self.region.clone());
        builder
            .build(account, RoutingStrategy::ProximityTo(region))
            .await
            .map_err(|error| CosmosStoreError::service(format!("connect to {}", self.endpoint), &error))
    }

    /// Connects, creates what is missing when `create_if_missing`, and opens the containers;
    /// retryable failures (throttling, a service still starting) are retried for up to a minute.
    pub async fn open(&self, stage: &str) -> Result<Containers, CosmosStoreError> {
        retry_setup("cosmos setup", || self.open_once(stage)).await
    }

    async fn open_once(&self, stage: &str) -> Result<Containers, CosmosStoreError> {
        let client = self.connect(stage).await?;
        if self.create_if_missing {
            self.create_missing(&client).await?;
        }
        let database = client.database_client(self.database.as_str());
        let flights = database
            .container_client(self.flights_container.as_str(), None)
            .await
            .map_err(|error| {
                CosmosStoreError::service(format!("open container {}", self.flights_container), &error)
            })?;
        let leases = database
            .container_client(self.leases_container.as_str(), None)
            .await
            .map_err(|error| {
                CosmosStoreError::service(format!("open container {}", self.leases_container), &error)
            })?;
        Ok(Containers {
            client,
            flights,
            leases,
        })
    }

    async fn create_missing(&self, client: &CosmosClient) -> Result<(), CosmosStoreError> {
        match client.create_database(&self.database, None).await {
            Ok(_) => tracing::info!(database = %self.database, "database created"),
            Err(error) if u16::from(error.status().status_code()) == 409 => {}
            Err(error) => {
                return Err(CosmosStoreError::service(
                    format!("create database {}", self.database),
                    &error,
                ));
            }
        }
        let database = client.database_client(self.database.as_str());
        for (name, key_path) in [
            (&self.flights_container, "/flightKey"),
            (&self.leases_container, "/id"),
        ] {
            let partition_key = PartitionKeyDefinition::from(key_path);
            let properties = ContainerProperties::new(name.clone(), partition_key);
            let options = (self.create_throughput > 0).then(|| {
                azure_data_cosmos::options::CreateContainerOptions::default().with_throughput(
                    azure_data_cosmos::models::ThroughputProperties::manual(u64::from(
                        self.create_throughput,
                    )),
                )
            });
            match database.create_container(properties, options).await {
                Ok(_) => tracing::info!(container = %name, partition_key = key_path, "container created"),
                Err(error) if u16::from(error.status().status_code()) == 409 => {}
                Err(error) => {
                    return Err(CosmosStoreError::service(
                        format!("create container {name}"),
                        &error,
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Runs a start-up step, retrying retryable failures (throttling, a service still starting) for
/// up to about a minute with short backoff, and refused credentials (401/403) until they are
/// fixed — logged as errors that say what to fix, every 30 s at most; other failures and the last
/// retryable one are returned. (The caller races it against shutdown.)
pub async fn retry_setup<T, F, Fut>(what: &str, mut step: F) -> Result<T, CosmosStoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CosmosStoreError>>,
{
    let mut attempt = 0;
    let mut refused: u32 = 0;
    loop {
        match step().await {
            Err(error) if error.is_retryable() && attempt < 60 => {
                let delay = backoff(attempt.min(3));
                tracing::warn!(%error, attempt, delay_ms = delay.as_millis() as u64, "{what} failed; retrying");
                tokio::time::sleep(delay).await;
                attempt += 1;
            }
            Err(error) if error.is_unauthorized() => {
                let delay = backoff(refused)
                    .max(Duration::from_secs(1))
                    .min(Duration::from_secs(30));
                tracing::error!(%error, attempts = refused + 1, retry_in_ms = delay.as_millis() as u64, hint = CREDENTIALS_HINT, "{what}: Cosmos DB refused the credentials; waiting for them to be fixed");
                tokio::time::sleep(delay).await;
                refused = refused.saturating_add(1);
            }
            result => return result,
        }
    }
}

/// Exponential backoff for the stage's own retries: 100 ms doubling to at most 10 s.
pub fn backoff(attempt: u32) -> Duration {
    let millis = 100u64.saturating_mul(1u64 << attempt.min(7));
    Duration::from_millis(millis.min(10_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_actions() {
        assert_eq!(classify_status(429), ErrorClass::Retry);
        assert_eq!(classify_status(503), ErrorClass::Retry);
        assert_eq!(classify_status(408), ErrorClass::Retry);
        assert_eq!(classify_status(0), ErrorClass::Retry);
        assert_eq!(classify_status(412), ErrorClass::PreconditionFailed);
        assert_eq!(classify_status(409), ErrorClass::Conflict);
        assert_eq!(classify_status(404), ErrorClass::NotFound);
        assert_eq!(classify_status(400), ErrorClass::Fatal);
        assert_eq!(
            classify_status(401),
            ErrorClass::Unauthorized,
            "an outage, not poison"
        );
        assert_eq!(classify_status(403), ErrorClass::Unauthorized);
        assert_eq!(classify_status(413), ErrorClass::Fatal);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(0), Duration::from_millis(100));
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert!(backoff(30) <= Duration::from_secs(10));
    }

    #[test]
    fn config_errors_name_the_value() {
        let config = CosmosConfig::default();
        let error = config.validate().expect_err("no key");
        assert!(error.to_string().contains("CONTRAIL_COSMOS__KEY"), "{error}");
        #[cfg(feature = "fault-injection")]
        {
            let config = CosmosConfig {
                key: Secret::new("k"),
                fault_injection: FaultInjectionConfig {
                    throttle_probability: 1.5,
                    unavailable_probability: 0.0,
                },
                ..CosmosConfig::default()
            };
            let error = config.validate().expect_err("probability");
            assert!(
                error.to_string().contains("throttle_probability = 1.5"),
                "{error}"
            );
        }
        let config = CosmosConfig {
            auth: CosmosAuth::WorkloadIdentity,
            ..CosmosConfig::default()
        };
        config.validate().expect("entra needs no key");
    }

    #[test]
    fn key_never_printed() {
        let config = CosmosConfig {
            key: Secret::new("c2VjcmV0a2V5"),
            ..CosmosConfig::default()
        };
        assert!(!format!("{config:?}").contains("c2VjcmV0a2V5"));
    }
}
