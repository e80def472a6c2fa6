//! The guarded document write: never replace a document with a lower version.
//!
//! Cosmos DB has no conditional write on a document field, so the guard is optimistic
//! concurrency: read the stored version and ETag, decide ([`crate::guard::decide`]), then create
//! (409 → someone created it first: decide again) or replace under `If-Match` (412 → someone wrote
//! in between: decide again). The ETag and version of every write this process made are cached,
//! so the usual case — the next version of a flight this instance wrote before — is a single
//! If-Match replace without the read. A stale cache entry costs one 412 and a re-read. A flight's
//! version 1 is created without a read (a 409 falls back to read and decide).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use azure_core::http::Etag;
use azure_data_cosmos::ContainerClient;
use azure_data_cosmos::options::{ItemWriteOptions, Precondition};
use contrail_common::metrics::MetricsRegistry;
use prometheus::{Counter, Histogram, IntCounterVec};

use crate::guard::{Decision, decide};
use crate::{CosmosStoreError, CredentialOutage, ErrorClass, backoff};

/// What the guarded writes report: request units, retries by cause, latency.
#[derive(Clone)]
pub struct WriteMetrics {
    /// Request units charged by Cosmos DB.
    pub request_units: Counter,
    /// Retries by cause (`429`, `503`, `412`, `409`, `404` for a missing container, …).
    pub retries: IntCounterVec,
    /// Latency of one guarded document write (read + replace/create, retries included).
    pub write_seconds: Histogram,
}

impl WriteMetrics {
    /// Creates and registers the metrics under these names (request units, retries by cause,
    /// write latency); literal names at the call site keep them findable (the deploy check
    /// matches dashboards and alerts against the names the code exports).
    pub fn new(registry: &MetricsRegistry, names: [&str; 3]) -> WriteMetrics {
        let [request_units, retries, write_seconds] = names;
        WriteMetrics {
            request_units: registry.float_counter(request_units, "Request units charged by Cosmos DB"),
            retries: registry.counter_vec(retries, "Cosmos DB request retries by cause", &["cause"]),
            write_seconds: registry.histogram(
                write_seconds,
                "Latency of one guarded document write, retries included",
                &[
                    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                ],
            ),
        }
    }

    /// Retries of every cause together.
    pub fn total_retries(&self) -> f64 {
        use prometheus::core::Collector;
        self.retries
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .map(|metric| metric.get_counter().get_value())
            .sum()
    }
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The document now holds this version.
    Written,
    /// The stored document already had this or a higher version.
    Stale,
}

/// Why a write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Cosmos DB refuses this document on its own merits (400, 413 …): retrying cannot help, the
    /// record goes to the dead-letter topic. (Refused credentials are an outage, retried.)
    #[error(transparent)]
    Fatal(CosmosStoreError),
    /// The stage is stopping; the batch is not committed and will be redelivered.
    #[error("stopping")]
    Stopping,
}

/// Writes flight documents under the version guard.
pub struct DocumentWriter {
    container: ContainerClient,
    cache: Mutex<HashMap<String, (u64, Etag)>>,
    cache_limit: usize,
    metrics: WriteMetrics,
    outage: CredentialOutage,
}

fn version_of(document: &serde_json::Value) -> Option<u64> {
    document.get("version").and_then(serde_json::Value::as_u64)
}

impl DocumentWriter {
    /// A writer for `container` remembering up to `cache_limit` ETags.
    pub fn new(container: ContainerClient, cache_limit: usize, metrics: WriteMetrics) -> DocumentWriter {
        DocumentWriter {
            container,
            outage: CredentialOutage::default(),
            cache: Mutex::new(HashMap::new()),
            cache_limit,
            metrics,
        }
    }

    /// Reports refused credentials through `outage` (readiness, error logs).
    pub fn with_outage(mut self, outage: CredentialOutage) -> DocumentWriter {
        self.outage = outage;
        self
    }

    fn cached(&self, key: &str) -> Option<(u64, Etag)> {
        self.cache.lock().ok().and_then(|cache| cache.get(key).cloned())
    }

    fn remember(&self, key: &str, version: u64, etag: Option<&Etag>) {
        let Ok(mut cache) = self.cache.lock() else { return };
        match etag {
            Some(etag) => {
                if cache.len() >= self.cache_limit && !cache.contains_key(key) {
                    cache.clear();
                }
                cache.insert(key.to_owned(), (version, etag.clone()));
            }
            None => {
                cache.remove(key);
            }
        }
    }

    fn forget(&self, key: &str) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.remove(key);
        }
    }

    fn charge(&self, headers: &azure_data_cosmos::models::ResponseHeaders) {
        if let Some(charge) = headers.request_charge() {
            self.metrics.request_units.inc_by(charge.value());
            // On the write's span, when it has one (cosmos-writer's span of a traced record).
            tracing::Span::current().record("cosmos.request_charge", charge.value());
        }
    }

    /// The stored version and ETag of `key`, or `None` when there is no document.
    async fn read(&self, key: &str) -> Result<Option<(u64, Etag)>, CosmosStoreError> {
        match self.container.read_item(key.to_owned(), key, None).await {
            Ok(response) => {
                self.charge(response.headers());
                let etag = response.headers().etag().cloned();
                let document: serde_json::Value =
                    response
                        .into_model()
                        .map_err(|error| CosmosStoreError::Document {
                            id: key.to_owned(),
                            message: format!("stored document is not JSON: {error}"),
                        })?;
                let version = version_of(&document).ok_or_else(|| CosmosStoreError::Document {
                    id: key.to_owned(),
                    message: "stored document has no numeric `version`".to_owned(),
                })?;
                let etag = etag.ok_or_else(|| CosmosStoreError::Document {
                    id: key.to_owned(),
                    message: "read returned no ETag".to_owned(),
                })?;
                Ok(Some((version, etag)))
            }
            Err(error) => {
                let error = CosmosStoreError::service(format!("read {key}"), &error);
                if error.class() == ErrorClass::NotFound {
                    Ok(None)
                } else {
                    Err(error)
                }
            }
        }
    }

    /// Writes `document` (whose `version` is `version`) for flight `key` unless the stored version
    /// is the same or higher. Retryable failures are retried with backoff until `stopping`
    /// returns true.
    pub async fn write(
        &self,
        key: &str,
        version: u64,
        document: &serde_json::Value,
        stopping: &(dyn Fn() -> bool + Sync),
    ) -> Result<Outcome, WriteError> {
        let started = Instant::now();
        let mut attempt: u32 = 0;
        // A flight's first version is almost always new: try to create it without reading first
        // (one request instead of two). A 409 turns that off for the rest of this write.
        let mut optimistic = version == 1;
        let result = loop {
            match self.attempt(key, version, document, optimistic).await {
                Ok(Some(outcome)) => {
                    self.outage.succeeded();
                    break Ok(outcome);
                }
                // Lost a race (409/412): decide again right away with a fresh read.
                Ok(None) => {
                    self.forget(key);
                    optimistic = false;
                    continue;
                }
                Err(error) => {
                    let cause = error
                        .status()
                        .map_or_else(|| "transport".to_owned(), |status| status.to_string());
                    match error.class() {
                        ErrorClass::Retry => {}
                        ErrorClass::Unauthorized => self.outage.refused(&error),
                        // Reads and replaces of a missing document answer `Ok`: a 404 here is a
                        // create, so the container (or database) itself is missing — deleted,
                        // or not created yet. An outage, not a fault of the record.
                        ErrorClass::NotFound => self.outage.container_missing(&error),
                        _ => break Err(WriteError::Fatal(error)),
                    }
                    self.metrics.retries.with_label_values(&[&cause]).inc();
                    if stopping() {
                        break Err(WriteError::Stopping);
                    }
                    let delay = backoff(attempt);
                    tracing::debug!(flight_key = key, %error, attempt, delay_ms = delay.as_millis() as u64, "retrying write");
                    tokio::time::sleep(delay).await;
                    attempt = attempt.saturating_add(1);
                }
            }
        };
        self.metrics
            .write_seconds
            .observe(started.elapsed().as_secs_f64());
        result
    }

    /// One decision + write. `Ok(None)`: a concurrent writer won (409/412), decide again.
    async fn attempt(
        &self,
        key: &str,
        version: u64,
        document: &serde_json::Value,
        optimistic: bool,
    ) -> Result<Option<Outcome>, CosmosStoreError> {
        // The cache may only save the read before a replace (a stale entry costs a 412); a skip
        // is decided on a fresh read, never on the cache alone. `optimistic`: assume no document
        // (a create; 409 if there is one).
        let stored = match self.cached(key) {
            Some(entry) if entry.0 < version => Some(entry),
            None if optimistic => None,
            _ => self.read(key).await?,
        };
        let decision = decide(stored.as_ref().map(|(stored, _)| *stored), version);
        tracing::debug!(flight_key = key, version, stored = ?stored.as_ref().map(|(stored, _)| *stored), ?decision, "guard");
        match decision {
            Decision::SkipStale => Ok(Some(Outcome::Stale)),
            Decision::Create => match self
                .container
                .create_item(key.to_owned(), key, document, None)
                .await
            {
                Ok(response) => {
                    self.charge(response.headers());
                    self.remember(key, version, response.headers().etag());
                    Ok(Some(Outcome::Written))
                }
                Err(error) => {
                    let error = CosmosStoreError::service(format!("create {key}"), &error);
                    if error.class() == ErrorClass::Conflict {
                        self.metrics.retries.with_label_values(&["409"]).inc();
                        Ok(None)
                    } else {
                        Err(error)
                    }
                }
            },
            Decision::Replace => {
                let Some((_, etag)) = stored else {
                    return Ok(None);
                };
                let options = ItemWriteOptions::default().with_precondition(Precondition::if_match(etag));
                match self
                    .container
                    .replace_item(key.to_owned(), key, document, Some(options))
                    .await
                {
                    Ok(response) => {
                        self.charge(response.headers());
                        self.remember(key, version, response.headers().etag());
                        Ok(Some(Outcome::Written))
                    }
                    Err(error) => {
                        let error = CosmosStoreError::service(format!("replace {key}"), &error);
                        match error.class() {
                            ErrorClass::PreconditionFailed | ErrorClass::NotFound => {
                                let cause = error.status().unwrap_or(412).to_string();
                                self.metrics.retries.with_label_values(&[&cause]).inc();
                                Ok(None)
                            }
                            _ => Err(error),
                        }
                    }
                }
            }
        }
    }
}
