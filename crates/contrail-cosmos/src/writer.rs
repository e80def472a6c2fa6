//! The guarded document write: never replace a document with a lower version.
//!
//! Cosmos DB has no conditional write on a document field, so the guard is optimistic
//! concurrency: read the stored version and ETag, decide ([`crate::guard::decide`]), then create
//! (409 → someone created it first: decide again) or replace under `If-Match` (412 → someone wrote
//! in between: decide again). The ETag and version of every write this process made are cached,
//! so the usual case — the next version of a flight this instance wrote before — is a single
//! If-Match replace without the read. A stale cache entry costs one 412 and a re-read. A flight's
//! version 1 is created without a read (a 409 falls back to read and decide).
//!
//! Two writers share a flight's document: the flight state's (`version`) and the
//! rotation processor's predictions (fields of their own, guarded by a version field of their
//! own, `predictionVersion`). Each guards its own version and keeps the other's fields: a state
//! replace carries over every stored field its document does not have (read, or cached with the
//! ETag of its own write — any other write changes the ETag, so a stale carry-over is a 412 and a
//! re-read), and fields are set on the document read, under If-Match. Fields of a flight whose
//! document does not exist yet create a stub (`id`, `flightKey`, `version` 0 and the fields): the
//! state's create then meets it (409), reads it and replaces it — version 0 is below every state —
//! carrying the fields over. Nothing waits on the other writer, and a missing container is the
//! same outage for both (a create answering 404).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use azure_core::http::Etag;
use azure_data_cosmos::ContainerClient;
use azure_data_cosmos::options::{ItemWriteOptions, Precondition};
use contrail_common::metrics::MetricsRegistry;
use prometheus::{Counter, Histogram, IntCounterVec};
use serde_json::{Map, Value};

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

/// What one guarded write puts into a flight's document.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// The flight's state: the whole document (of `version`), keeping the prediction fields.
    State {
        /// The state's version.
        version: u64,
        /// The document of the state.
        document: &'a Value,
    },
    /// Fields another writer owns (a prediction's), set on the flight's existing document unless
    /// its field `guard` holds `version` or a higher one (`fields` sets `guard` to `version`).
    Fields {
        /// The version of the fields.
        version: u64,
        /// The name of the field holding it.
        guard: &'a str,
        /// The fields, `guard` included.
        fields: &'a Map<String, Value>,
    },
}

/// A cached write: the version and ETag of this writer's last write of a flight, and the
/// other writers' fields that write carried over.
type Cached = (u64, Etag, Map<String, Value>);

/// A stored document: its flight version, ETag and content.
struct Stored {
    version: u64,
    etag: Etag,
    document: Value,
}

/// One decision + write.
enum Attempt {
    Done(Outcome),
    /// A concurrent writer won (409/412): decide again with a fresh read.
    Again,
}

/// Writes flight documents under the version guard.
pub struct DocumentWriter {
    container: ContainerClient,
    cache: Mutex<HashMap<String, Cached>>,
    cache_limit: usize,
    metrics: WriteMetrics,
    outage: CredentialOutage,
}

fn version_of(document: &Value) -> Option<u64> {
    document.get("version").and_then(Value::as_u64)
}

/// The fields of `stored` that `document` does not have: other writers' (system properties
/// left out).
fn others(stored: &Value, document: &Value) -> Map<String, Value> {
    match stored {
        Value::Object(map) => map
            .iter()
            .filter(|(name, _)| !name.starts_with('_') && document.get(name.as_str()).is_none())
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect(),
        _ => Map::new(),
    }
}

/// `document` with `fields` set, without the service's system properties (`_rid`, `_etag`, …).
fn with_fields(document: &Value, fields: &Map<String, Value>) -> Value {
    let mut merged: Map<String, Value> = match document {
        Value::Object(map) => map
            .iter()
            .filter(|(name, _)| !name.starts_with('_'))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect(),
        _ => Map::new(),
    };
    merged.extend(fields.iter().map(|(name, value)| (name.clone(), value.clone())));
    Value::Object(merged)
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

    fn cached(&self, key: &str) -> Option<Cached> {
        self.cache.lock().ok().and_then(|cache| cache.get(key).cloned())
    }

    fn remember(&self, key: &str, version: u64, etag: Option<&Etag>, carried: Map<String, Value>) {
        let Ok(mut cache) = self.cache.lock() else { return };
        match etag {
            Some(etag) => {
                if cache.len() >= self.cache_limit && !cache.contains_key(key) {
                    cache.clear();
                }
                cache.insert(key.to_owned(), (version, etag.clone(), carried));
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

    /// The stored document of `key`, or `None` when there is none.
    async fn read(&self, key: &str) -> Result<Option<Stored>, CosmosStoreError> {
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
                Ok(Some(Stored {
                    version,
                    etag,
                    document,
                }))
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
        document: &Value,
        stopping: &(dyn Fn() -> bool + Sync),
    ) -> Result<Outcome, WriteError> {
        self.apply(key, Change::State { version, document }, stopping)
            .await
    }

    /// Writes `change` to flight `key`'s document under its version guard, retrying retryable
    /// failures with backoff until `stopping` returns true.
    pub async fn apply(
        &self,
        key: &str,
        change: Change<'_>,
        stopping: &(dyn Fn() -> bool + Sync),
    ) -> Result<Outcome, WriteError> {
        let started = Instant::now();
        let mut attempt: u32 = 0;
        // A flight's first version is almost always new: try to create it without reading first
        // (one request instead of two). A 409 turns that off for the rest of this write.
        let mut optimistic = matches!(change, Change::State { version: 1, .. });
        let result = loop {
            let outcome = match change {
                Change::State { version, document } => self.attempt(key, version, document, optimistic).await,
                Change::Fields {
                    version,
                    guard,
                    fields,
                } => self.attempt_fields(key, version, guard, fields).await,
            };
            let error = match outcome {
                Ok(Attempt::Done(outcome)) => {
                    self.outage.succeeded();
                    break Ok(outcome);
                }
                // Lost a race (409/412): decide again right away with a fresh read.
                Ok(Attempt::Again) => {
                    self.forget(key);
                    optimistic = false;
                    continue;
                }
                Err(error) => Some(error),
            };
            let delay = backoff(attempt);
            if let Some(error) = error {
                match error.class() {
                    ErrorClass::Retry => {}
                    ErrorClass::Unauthorized => self.outage.refused(&error),
                    // Reads and replaces of a missing document answer `Ok`: a 404 here is a
                    // create, so the container (or database) itself is missing — deleted,
                    // or not created yet. An outage, not a fault of the record.
                    ErrorClass::NotFound => self.outage.container_missing(&error),
                    _ => break Err(WriteError::Fatal(error)),
                }
                let cause = error
                    .status()
                    .map_or_else(|| "transport".to_owned(), |status| status.to_string());
                self.metrics.retries.with_label_values(&[&cause]).inc();
                tracing::debug!(flight_key = key, %error, attempt, delay_ms = delay.as_millis() as u64, "retrying write");
            }
            if stopping() {
                break Err(WriteError::Stopping);
            }
            tokio::time::sleep(delay).await;
            attempt = attempt.saturating_add(1);
        };
        self.metrics
            .write_seconds
            .observe(started.elapsed().as_secs_f64());
        result
    }

    /// One decision + fields write: the fields set on the document read, under If-Match, unless
    /// its `guard` field holds `version` or a higher one.
    async fn attempt_fields(
        &self,
        key: &str,
        version: u64,
        guard: &str,
        fields: &Map<String, Value>,
    ) -> Result<Attempt, CosmosStoreError> {
        let Some(stored) = self.read(key).await? else {
            // No state yet: a stub the state's write replaces (version 0), keeping the fields.
            let mut stub = Map::new();
            stub.insert("id".to_owned(), Value::String(key.to_owned()));
            stub.insert("flightKey".to_owned(), Value::String(key.to_owned()));
            stub.insert("version".to_owned(), Value::from(0u64));
            let stub = with_fields(&Value::Object(stub), fields);
            return match self.container.create_item(key.to_owned(), key, &stub, None).await {
                Ok(response) => {
                    self.charge(response.headers());
                    tracing::debug!(flight_key = key, "fields written into a stub document");
                    Ok(Attempt::Done(Outcome::Written))
                }
                Err(error) => {
                    self.lost_create_race(CosmosStoreError::service(format!("create stub {key}"), &error))
                }
            };
        };
        let stored_version = stored.document.get(guard).and_then(Value::as_u64);
        if stored_version.is_some_and(|stored| stored >= version) {
            return Ok(Attempt::Done(Outcome::Stale));
        }
        let document = with_fields(&stored.document, fields);
        let options = ItemWriteOptions::default().with_precondition(Precondition::if_match(stored.etag));
        match self
            .container
            .replace_item(key.to_owned(), key, &document, Some(options))
            .await
        {
            Ok(response) => {
                self.charge(response.headers());
                Ok(Attempt::Done(Outcome::Written))
            }
            Err(error) => self.lost_race(CosmosStoreError::service(format!("replace {key}"), &error)),
        }
    }

    /// A failed create: a 409 (someone created the document first) is a lost race, anything else
    /// an error.
    fn lost_create_race(&self, error: CosmosStoreError) -> Result<Attempt, CosmosStoreError> {
        if error.class() == ErrorClass::Conflict {
            self.metrics.retries.with_label_values(&["409"]).inc();
            Ok(Attempt::Again)
        } else {
            Err(error)
        }
    }

    /// A failed replace: a 412 (or 404: deleted meanwhile) is a lost race, anything else an error.
    fn lost_race(&self, error: CosmosStoreError) -> Result<Attempt, CosmosStoreError> {
        match error.class() {
            ErrorClass::PreconditionFailed | ErrorClass::NotFound => {
                let cause = error.status().unwrap_or(412).to_string();
                self.metrics.retries.with_label_values(&[&cause]).inc();
                Ok(Attempt::Again)
            }
            _ => Err(error),
        }
    }

    /// One decision + state write.
    async fn attempt(
        &self,
        key: &str,
        version: u64,
        document: &Value,
        optimistic: bool,
    ) -> Result<Attempt, CosmosStoreError> {
        // The cache may only save the read before a replace (a stale entry costs a 412); a skip
        // is decided on a fresh read, never on the cache alone. `optimistic`: assume no document
        // (a create; 409 if there is one).
        let stored = match self.cached(key) {
            Some(entry) if entry.0 < version => Some(entry),
            None if optimistic => None,
            _ => self
                .read(key)
                .await?
                .map(|stored| (stored.version, stored.etag, others(&stored.document, document))),
        };
        let decision = decide(stored.as_ref().map(|(stored, _, _)| *stored), version);
        tracing::debug!(flight_key = key, version, stored = ?stored.as_ref().map(|(stored, _, _)| *stored), ?decision, "guard");
        match decision {
            Decision::SkipStale => Ok(Attempt::Done(Outcome::Stale)),
            Decision::Create => match self
                .container
                .create_item(key.to_owned(), key, document, None)
                .await
            {
                Ok(response) => {
                    self.charge(response.headers());
                    self.remember(key, version, response.headers().etag(), Map::new());
                    Ok(Attempt::Done(Outcome::Written))
                }
                Err(error) => {
                    self.lost_create_race(CosmosStoreError::service(format!("create {key}"), &error))
                }
            },
            Decision::Replace => {
                let Some((_, etag, carried)) = stored else {
                    return Ok(Attempt::Again);
                };
                // The other writers' fields stay (the ETag proves they are current).
                let merged = (!carried.is_empty()).then(|| with_fields(document, &carried));
                let options = ItemWriteOptions::default().with_precondition(Precondition::if_match(etag));
                match self
                    .container
                    .replace_item(
                        key.to_owned(),
                        key,
                        merged.as_ref().unwrap_or(document),
                        Some(options),
                    )
                    .await
                {
                    Ok(response) => {
                        self.charge(response.headers());
                        self.remember(key, version, response.headers().etag(), carried);
                        Ok(Attempt::Done(Outcome::Written))
                    }
                    Err(error) => self.lost_race(CosmosStoreError::service(format!("replace {key}"), &error)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_state_replace_keeps_the_other_writers_fields_and_drops_system_properties() {
        let stored = json!({"id": "F", "version": 2, "gate": "B1", "predictedOut": "x",
                            "predictionVersion": 5, "_etag": "\"1\"", "_ts": 9});
        let state = json!({"id": "F", "version": 3, "gate": "B2"});
        let carried = others(&stored, &state);
        assert_eq!(
            Value::Object(carried.clone()),
            json!({"predictedOut": "x", "predictionVersion": 5})
        );
        assert_eq!(
            with_fields(&state, &carried),
            json!({"id": "F", "version": 3, "gate": "B2", "predictedOut": "x", "predictionVersion": 5})
        );
        let fields: Map<String, Value> =
            serde_json::from_value(json!({"predictedOut": "y", "predictionVersion": 6})).expect("an object");
        assert_eq!(
            with_fields(&stored, &fields),
            json!({"id": "F", "version": 2, "gate": "B1", "predictedOut": "y", "predictionVersion": 6})
        );
    }
}
