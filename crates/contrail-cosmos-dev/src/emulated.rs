//! The SDK's in-memory emulator behind this server (`--engine emulator`), the reference
//! cosmos-dev's own store was checked against. Every request is handed to
//! [`InMemoryEmulatorHttpClient::execute_request`] and its response sent back; the virtual
//! region's gateway URL is the server's own address, so separate processes share one account.
//!
//! One addition: the emulator keeps no per-document log sequence number, while the service puts
//! `_lsn` into every document and change feed item (contrail identifies a change by
//! `(id, _lsn)`). Each document body received in a create, upsert or replace is stamped with
//! `_lsn` from a process-wide counter, and writes are applied one at a time in that order.
//! Its change feed read copies and sorts every document of a partition on each poll, so it slows
//! as it fills (why the own store exists).

use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::response::Response;
use azure_data_cosmos_driver::in_memory_emulator::{
    InMemoryEmulatorHttpClient, VirtualAccountConfig, VirtualRegion,
};

use crate::{Stats, feed_cache, plain};

/// The SDK's emulator behind this server, with what it lacks added in front of it.
pub struct Emulated {
    emulator: InMemoryEmulatorHttpClient,
    base: url::Url,
    lsn: AtomicU64,
    /// Held from stamping a document write's `_lsn` until the emulator applied it, so writes are
    /// applied — and appear in the change feed — in `_lsn` order, as in the service.
    write_order: tokio::sync::Mutex<()>,
    /// "Nothing new" answers to change feed reads, reused while their container is unchanged.
    feeds: feed_cache::FeedCache,
}

impl Emulated {
    /// The emulator for one region whose gateway is this server.
    pub fn new(base: &url::Url, region: &str) -> anyhow::Result<Emulated> {
        let region = VirtualRegion::new(region, base.clone());
        let config = VirtualAccountConfig::new(vec![region])
            .map_err(|error| anyhow::anyhow!("emulator account: {error}"))?;
        let emulator = InMemoryEmulatorHttpClient::try_new(config)
            .map_err(|error| anyhow::anyhow!("emulator: {error}"))?;
        Ok(Emulated {
            emulator,
            base: base.clone(),
            lsn: AtomicU64::new(0),
            write_order: tokio::sync::Mutex::new(()),
            feeds: feed_cache::FeedCache::default(),
        })
    }

    /// The newest `_lsn` stamped.
    pub fn last_lsn(&self) -> u64 {
        self.lsn.load(Ordering::Relaxed)
    }

    /// Change feed reads answered from the "nothing new" cache.
    pub fn unchanged_reads(&self) -> u64 {
        self.feeds.hits()
    }

    /// Splits physical partition `partition` and waits for the split; the children's ids.
    pub async fn split(&self, db: &str, coll: &str, partition: u32) -> Vec<u32> {
        let store = self.emulator.store();
        self.feeds.written(None);
        store.split_partition(db, coll, partition, std::time::Duration::from_millis(50));
        store.wait_for_split(db, coll, partition).await;
        self.feeds.written(None);
        store.child_partition_ids(db, coll, &[partition])
    }

    /// Hands an (authorized) request to the emulator and its answer back.
    pub async fn forward(&self, stats: &Stats, parts: http::request::Parts, body: bytes::Bytes) -> Response {
        let state = self;
        let Some(method) = method_of(&parts.method) else {
            return plain(
                http::StatusCode::METHOD_NOT_ALLOWED,
                format!("method {} is not part of the Cosmos DB API", parts.method),
            );
        };
        let path_and_query = parts.uri.path_and_query().map(|pq| pq.as_str()).unwrap_or("/");
        let url = match state.base.join(path_and_query.trim_start_matches('/')) {
            Ok(url) => url,
            Err(error) => {
                return plain(
                    http::StatusCode::BAD_REQUEST,
                    format!("bad request path {path_and_query:?}: {error}"),
                );
            }
        };
        let container = feed_cache::container_of(parts.uri.path());
        let feed_read = feed_cache::is_change_feed_read(&parts.method, parts.uri.path(), &parts.headers)
            .then(|| {
                let question = feed_cache::question(path_and_query, &parts.headers);
                let stamp = state.feeds.stamp(container.as_deref().unwrap_or_default());
                (question, stamp)
            });
        if let Some((question, stamp)) = &feed_read
            && let Some(headers) = state.feeds.answer(question, *stamp)
        {
            return not_modified(headers, parts.headers.get("x-ms-activity-id"));
        }
        let mut core_request = azure_core::http::Request::new(url, method);
        for (name, value) in &parts.headers {
            if let Ok(value) = value.to_str() {
                core_request.insert_header(name.as_str().to_owned(), value.to_owned());
            }
        }
        let mut payload = body.to_vec();
        let write = is_document_write(&parts.method, parts.uri.path(), &parts.headers);
        // The service's `_lsn` is the order of its change feed; contrail relies on that (history
        // drops a change whose `_lsn` is not above what it applied from its feed range). Concurrent
        // writes are therefore stamped and applied one at a time.
        let _in_lsn_order = if write {
            Some(state.write_order.lock().await)
        } else {
            None
        };
        if write {
            let lsn = state.lsn.fetch_add(1, Ordering::Relaxed) + 1;
            if let Some(stamped) = stamp_lsn(&payload, lsn) {
                payload = stamped;
                stats.writes.fetch_add(1, Ordering::Relaxed);
            }
        }
        core_request.set_body(payload);
        let executed = state.emulator.execute_request(&core_request).await;
        if !feed_cache::only_reads(&parts.method, &parts.headers) {
            // Applied (or refused): answers computed before it may be stale.
            state.feeds.written(container.as_deref());
        }
        let response = match executed {
            Ok(response) => response,
            Err(error) => {
                stats.errors.fetch_add(1, Ordering::Relaxed);
                return plain(http::StatusCode::BAD_GATEWAY, format!("emulator: {error}"));
            }
        };
        let raw = match response.try_into_raw_response().await {
            Ok(raw) => raw,
            Err(error) => {
                stats.errors.fetch_add(1, Ordering::Relaxed);
                return plain(http::StatusCode::BAD_GATEWAY, format!("emulator body: {error}"));
            }
        };
        let status = http::StatusCode::from_u16(u16::from(raw.status()))
            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        if let Some((question, stamp)) = feed_read
            && status == http::StatusCode::NOT_MODIFIED
        {
            let headers = raw
                .headers()
                .iter()
                .map(|(name, value)| (name.as_str().to_owned(), value.as_str().to_owned()))
                .collect();
            state.feeds.keep(question, stamp, headers);
        }
        let mut builder = Response::builder().status(status);
        for (name, value) in raw.headers().iter() {
            if is_framing(name.as_str()) {
                continue;
            }
            builder = builder.header(name.as_str(), value.as_str());
        }
        let body: bytes::Bytes = raw.into_body().into();
        builder
            .body(Body::from(body))
            .unwrap_or_else(|error| plain(http::StatusCode::INTERNAL_SERVER_ERROR, error.to_string()))
    }
}

/// Whether a request writes a whole document: create/upsert (`POST …/docs`) or replace
/// (`PUT …/docs/{id}`). Queries (also `POST …/docs`) and batches carry other bodies.
fn is_document_write(method: &http::Method, path: &str, headers: &http::HeaderMap) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let is_query = feed_cache::is_query(headers);
    let is_batch = headers.contains_key("x-ms-cosmos-is-batch-request");
    match *method {
        http::Method::POST => {
            segments.len() == 5 && segments[0] == "dbs" && segments[4] == "docs" && !is_query && !is_batch
        }
        http::Method::PUT => segments.len() == 6 && segments[0] == "dbs" && segments[4] == "docs",
        _ => false,
    }
}

/// Stamps `_lsn` into a document body — text JSON or Cosmos binary JSON (the client's default
/// encoding), answered in the same encoding; other bodies are returned unchanged (`None`).
fn stamp_lsn(body: &[u8], lsn: u64) -> Option<Vec<u8>> {
    use azure_data_cosmos_driver::binary_json;
    let binary = binary_json::is_binary(body);
    let mut value: serde_json::Value = if binary {
        binary_json::decode(body).ok()?
    } else if body.first() == Some(&b'{') {
        serde_json::from_slice(body).ok()?
    } else {
        return None;
    };
    value
        .as_object_mut()?
        .insert("_lsn".to_owned(), serde_json::Value::from(lsn));
    if binary {
        Some(binary_json::encode(&value))
    } else {
        serde_json::to_vec(&value).ok()
    }
}

fn method_of(method: &http::Method) -> Option<azure_core::http::Method> {
    Some(match *method {
        http::Method::GET => azure_core::http::Method::Get,
        http::Method::POST => azure_core::http::Method::Post,
        http::Method::PUT => azure_core::http::Method::Put,
        http::Method::DELETE => azure_core::http::Method::Delete,
        http::Method::PATCH => azure_core::http::Method::Patch,
        http::Method::HEAD => azure_core::http::Method::Head,
        _ => return None,
    })
}

/// Whether a response header frames the body: the server re-frames what it sends, so these
/// hop-by-hop headers of the emulator's response must not be copied.
fn is_framing(name: &str) -> bool {
    name.eq_ignore_ascii_case("content-length") || name.eq_ignore_ascii_case("transfer-encoding")
}

/// A kept "nothing new" answer, carrying this request's activity id as the emulator would.
fn not_modified(headers: Vec<(String, String)>, activity_id: Option<&http::HeaderValue>) -> Response {
    let mut builder = Response::builder().status(http::StatusCode::NOT_MODIFIED);
    for (name, value) in headers {
        if is_framing(&name) {
            continue;
        }
        if name.eq_ignore_ascii_case("x-ms-activity-id")
            && let Some(activity_id) = activity_id
        {
            builder = builder.header(name, activity_id.clone());
            continue;
        }
        builder = builder.header(name, value);
    }
    builder
        .body(Body::empty())
        .unwrap_or_else(|error| plain(http::StatusCode::INTERNAL_SERVER_ERROR, error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_writes_are_recognised() {
        let none = http::HeaderMap::new();
        let post = http::Method::POST;
        let put = http::Method::PUT;
        assert!(is_document_write(
            &post,
            "/dbs/contrail/colls/flights/docs",
            &none
        ));
        assert!(is_document_write(
            &put,
            "/dbs/contrail/colls/flights/docs/AA-1",
            &none
        ));
        assert!(!is_document_write(
            &http::Method::GET,
            "/dbs/contrail/colls/flights/docs/AA-1",
            &none
        ));
        assert!(!is_document_write(&post, "/dbs/contrail/colls", &none));
        let mut query = http::HeaderMap::new();
        query.insert("x-ms-documentdb-isquery", http::HeaderValue::from_static("True"));
        assert!(!is_document_write(
            &post,
            "/dbs/contrail/colls/flights/docs",
            &query
        ));
        let mut batch = http::HeaderMap::new();
        batch.insert(
            "x-ms-cosmos-is-batch-request",
            http::HeaderValue::from_static("True"),
        );
        assert!(!is_document_write(
            &post,
            "/dbs/contrail/colls/flights/docs",
            &batch
        ));
    }

    #[test]
    fn lsn_is_stamped_into_objects_only() {
        let stamped = stamp_lsn(br#"{"id":"a","version":3}"#, 42).expect("object");
        let value: serde_json::Value = serde_json::from_slice(&stamped).expect("json");
        assert_eq!(value["_lsn"], 42);
        assert_eq!(value["version"], 3);
        assert!(stamp_lsn(b"[1,2]", 1).is_none());
        let binary =
            azure_data_cosmos_driver::binary_json::encode(&serde_json::json!({"id": "b", "version": 2}));
        let stamped = stamp_lsn(&binary, 7).expect("binary object");
        let value = azure_data_cosmos_driver::binary_json::decode(&stamped).expect("binary");
        assert_eq!(value["_lsn"], 7);
        assert_eq!(value["id"], "b");
        assert!(stamp_lsn(b"{not json", 1).is_none());
    }
}
