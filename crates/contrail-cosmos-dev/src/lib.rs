//! A local Azure Cosmos DB endpoint for development and tests — never a dependency of a production
//! stage.
//!
//! The real service and its Docker emulator are out of reach on a developer machine without Docker.
//! `azure_data_cosmos_driver` ships Microsoft's own in-memory emulator (feature
//! `__internal_in_memory_emulator`, pinned exactly with the client); it normally replaces the HTTP
//! transport inside one process. This crate puts it behind a small HTTP server instead: every
//! request is handed to [`InMemoryEmulatorHttpClient::execute_request`] and its response sent back.
//! The virtual region's gateway URL is the server's own address, so the account discovery at
//! `GET /` points clients back here, and separate processes using the ordinary client share one
//! account (the stages, their tests and the change feed reader all see the same store).
//!
//! One addition to the emulator: it keeps no per-document log sequence number, while the real
//! service puts `_lsn` into every document and change feed item (contrail identifies a change by
//! `(id, _lsn)`). This server stamps each document body it receives in a create, upsert or replace
//! with `_lsn` from a process-wide counter — unique and increasing per write, which is what the
//! pipeline relies on (the service's `_lsn` is increasing per physical partition).
//!
//! Limits (the emulator's): state is in memory only; the change feed keeps only the latest
//! version of each document (as the service's latest-version mode does between polls).

pub mod auth;
pub mod cli;
pub mod feed_cache;
pub mod store;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use anyhow::Context;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use azure_data_cosmos_driver::in_memory_emulator::{
    InMemoryEmulatorHttpClient, VirtualAccountConfig, VirtualRegion,
};

/// Largest request body accepted (Cosmos' own limit for a document is 2 MiB).
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Command-line options of `cosmos-dev`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Address to listen on. Loopback only by default: the client accepts plain http only for
    /// localhost / 127.0.0.1 / [::1].
    #[arg(long, default_value = "127.0.0.1:8900", env = "CONTRAIL_COSMOS_DEV_LISTEN")]
    pub listen: String,
    /// Name of the emulated region (clients route with `RoutingStrategy::ProximityTo`).
    #[arg(long, default_value = "East US")]
    pub region: String,
    /// Write the bound address (`127.0.0.1:PORT`) to this file once listening (useful with port 0).
    #[arg(long)]
    pub address_file: Option<std::path::PathBuf>,
    /// The account key (base64). When set, requests must be signed with it, as the service
    /// checks (`401` otherwise), and `POST /_dev/key` replaces it (a key regenerated in Azure).
    /// Unset: any key is accepted.
    #[arg(long, env = "CONTRAIL_COSMOS_DEV_KEY", hide_env_values = true)]
    pub key: Option<String>,
}

/// Request counters, shown at `GET /_dev/stats`.
#[derive(Default)]
struct Stats {
    requests: AtomicU64,
    writes: AtomicU64,
    errors: AtomicU64,
}

struct DevState {
    emulator: InMemoryEmulatorHttpClient,
    base: url::Url,
    lsn: AtomicU64,
    stats: Stats,
    /// The account key requests must be signed with (`None`: not checked).
    key: RwLock<Option<Vec<u8>>>,
    /// Held from stamping a document write's `_lsn` until the emulator applied it, so writes are
    /// applied — and appear in the change feed — in `_lsn` order, as in the service.
    write_order: tokio::sync::Mutex<()>,
    /// "Nothing new" answers to change feed reads, reused while their container is unchanged.
    feeds: feed_cache::FeedCache,
}

/// Binds, prints the endpoint and serves until SIGINT/SIGTERM.
pub async fn serve(options: Options) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(&options.listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.listen))?;
    let address: SocketAddr = listener.local_addr().context("local address")?;
    let base = url::Url::parse(&format!("http://{address}/")).context("endpoint URL")?;
    let region = VirtualRegion::new(&options.region, base.clone());
    let config = VirtualAccountConfig::new(vec![region])
        .map_err(|error| anyhow::anyhow!("emulator account: {error}"))?;
    let emulator =
        InMemoryEmulatorHttpClient::try_new(config).map_err(|error| anyhow::anyhow!("emulator: {error}"))?;
    let key = options
        .key
        .as_deref()
        .map(auth::decode_key)
        .transpose()
        .map_err(|error| anyhow::anyhow!("--key: {error}"))?;
    let state = Arc::new(DevState {
        emulator,
        base: base.clone(),
        lsn: AtomicU64::new(0),
        stats: Stats::default(),
        key: RwLock::new(key),
        write_order: tokio::sync::Mutex::new(()),
        feeds: feed_cache::FeedCache::default(),
    });
    let app = Router::new()
        .route("/_dev/healthz", get(|| async { "ok\n" }))
        .route("/_dev/stats", get(stats))
        .route("/_dev/split", axum::routing::post(split))
        .route("/_dev/key", axum::routing::post(replace_key))
        .fallback(forward)
        .with_state(state);
    if let Some(path) = &options.address_file {
        std::fs::write(path, address.to_string())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    tracing::info!(endpoint = %base, region = %options.region, "cosmos-dev serving the in-memory emulator");
    println!("cosmos-dev listening on {base}");
    let stopping = Arc::new(tokio::sync::Notify::new());
    let signalled = Arc::clone(&stopping);
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown_signal().await;
        signalled.notify_one();
    });
    // A graceful shutdown waits for every connection to close, and a client that stays up (the
    // board of `contrail up`) keeps its connections open: after the grace, exit anyway — the
    // store is in memory, there is nothing to flush.
    tokio::select! {
        result = server => result.context("serve"),
        () = async {
            stopping.notified().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            tracing::info!(grace = ?SHUTDOWN_GRACE, "connections still open after the signal: exiting");
            Ok(())
        }
    }
}

/// How long requests in flight have to finish after SIGINT/SIGTERM.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// SIGINT, or SIGTERM on Unix.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! { _ = interrupt => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

async fn stats(State(state): State<Arc<DevState>>) -> impl IntoResponse {
    let body = serde_json::json!({
        "requests": state.stats.requests.load(Ordering::Relaxed),
        "writes": state.stats.writes.load(Ordering::Relaxed),
        "errors": state.stats.errors.load(Ordering::Relaxed),
        "lastLsn": state.lsn.load(Ordering::Relaxed),
        "feedReadsAnsweredUnchanged": state.feeds.hits(),
    });
    axum::Json(body)
}

/// `POST /_dev/split?db=DB&coll=COLL&partition=N`: splits physical partition N of a container in
/// two (as the service does when a partition grows), and answers when the split is complete.
async fn split(
    State(state): State<Arc<DevState>>,
    axum::extract::Query(params): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Response {
    let (Some(db), Some(coll), Some(partition)) = (
        params.get("db"),
        params.get("coll"),
        params
            .get("partition")
            .and_then(|value| value.parse::<u32>().ok()),
    ) else {
        return plain(
            http::StatusCode::BAD_REQUEST,
            "expected ?db=DB&coll=COLL&partition=N (N a physical partition id)".to_owned(),
        );
    };
    let store = state.emulator.store();
    state.feeds.written(None);
    store.split_partition(db, coll, partition, std::time::Duration::from_millis(50));
    store.wait_for_split(db, coll, partition).await;
    state.feeds.written(None);
    let children = store.child_partition_ids(db, coll, &[partition]);
    if children.is_empty() {
        return plain(
            http::StatusCode::NOT_FOUND,
            format!("nothing split: no physical partition {partition} in container {db}/{coll}"),
        );
    }
    tracing::info!(db, coll, partition, ?children, "partition split");
    plain(
        http::StatusCode::OK,
        format!("split {db}/{coll} partition {partition} into {children:?}\n"),
    )
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

/// `POST /_dev/key` (body: the new key, base64): requests signed with the old key get `401` from now
/// on, as after regenerating an account key in Azure.
async fn replace_key(State(state): State<Arc<DevState>>, body: String) -> Response {
    match auth::decode_key(&body) {
        Ok(key) => {
            if let Ok(mut current) = state.key.write() {
                *current = Some(key);
            }
            tracing::info!("account key replaced: requests signed with the old key are refused");
            plain(http::StatusCode::OK, "key replaced\n".to_owned())
        }
        Err(error) => plain(http::StatusCode::BAD_REQUEST, format!("{error}\n")),
    }
}

fn plain(status: http::StatusCode, message: String) -> Response {
    (status, message).into_response()
}

async fn forward(State(state): State<Arc<DevState>>, request: Request) -> Response {
    state.stats.requests.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = request.into_parts();
    let refusal = match state.key.read() {
        Ok(key) => key
            .as_deref()
            .and_then(|key| auth::check(key, parts.method.as_str(), parts.uri.path(), &parts.headers).err()),
        Err(_) => None,
    };
    if let Some(reason) = refusal {
        state.stats.errors.fetch_add(1, Ordering::Relaxed);
        let body = serde_json::json!({ "code": "Unauthorized", "message": reason });
        return (
            http::StatusCode::UNAUTHORIZED,
            [(http::header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
    }
    let Some(method) = method_of(&parts.method) else {
        return plain(
            http::StatusCode::METHOD_NOT_ALLOWED,
            format!("method {} is not part of the Cosmos DB API", parts.method),
        );
    };
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(body) => body,
        Err(error) => {
            return plain(
                http::StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body unreadable or over {MAX_BODY_BYTES} bytes: {error}"),
            );
        }
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
    let feed_read =
        feed_cache::is_change_feed_read(&parts.method, parts.uri.path(), &parts.headers).then(|| {
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
            state.stats.writes.fetch_add(1, Ordering::Relaxed);
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
            state.stats.errors.fetch_add(1, Ordering::Relaxed);
            return plain(http::StatusCode::BAD_GATEWAY, format!("emulator: {error}"));
        }
    };
    let raw = match response.try_into_raw_response().await {
        Ok(raw) => raw,
        Err(error) => {
            state.stats.errors.fetch_add(1, Ordering::Relaxed);
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
