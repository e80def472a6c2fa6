//! A local Azure Cosmos DB endpoint for development and tests — never a dependency of a production
//! stage.
//!
//! The real service and its Docker emulator are out of reach on a developer machine without Docker.
//! This server answers the Cosmos DB REST API on a loopback address, so separate processes using
//! the ordinary `azure_data_cosmos` client share one account (the stages, their tests and the
//! change feed reader all see the same store); `GET /` names the server itself as the region's
//! gateway.
//!
//! Two engines answer (`--engine`): cosmos-dev's own store ([`store`], served by [`server`]; the
//! default), whose change feed is an index by `_lsn` so a poll costs the same at a million
//! documents as at a hundred, and Microsoft's in-memory emulator from `azure_data_cosmos_driver`
//! (`emulated`), the reference the own store was checked against, which slows as it fills.
//! Where the own store departs from the service and from the emulator is said in [`store`].
//!
//! Beyond the REST API: `GET /_dev/healthz`, `GET /_dev/stats`, `POST /_dev/split` (split a
//! physical partition), `POST /_dev/key` (a regenerated account key) and `POST /_dev/throttle`
//! (429 with retry-after for the next N document requests). State is in memory only.

pub mod auth;
pub mod cli;
mod emulated;
pub mod feed_cache;
pub mod server;
pub mod store;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use anyhow::Context;
use axum::Router;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

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
    /// Which store answers: `own` (cosmos-dev's store: a change feed read costs O(log n + page)
    /// however many documents it holds) or `emulator` (the SDK's in-memory emulator, the reference
    /// it was checked against; it slows as it fills).
    #[arg(long, value_enum, default_value_t = Engine::Own)]
    pub engine: Engine,
}

/// The store behind the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// cosmos-dev's own store ([`store`], served by [`server`]).
    Own,
    /// Microsoft's in-memory emulator from `azure_data_cosmos_driver`.
    Emulator,
}

/// Request counters, shown at `GET /_dev/stats`.
#[derive(Default)]
pub struct Stats {
    requests: AtomicU64,
    writes: AtomicU64,
    errors: AtomicU64,
}

struct DevState {
    stats: Stats,
    /// The account key requests must be signed with (`None`: not checked).
    key: RwLock<Option<Vec<u8>>>,
    engine: Served,
}

enum Served {
    Own(server::OwnStore),
    Emulator(emulated::Emulated),
}

/// Binds, prints the endpoint and serves until SIGINT/SIGTERM.
pub async fn serve(options: Options) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(&options.listen)
        .await
        .with_context(|| format!("cannot listen on {}", options.listen))?;
    let address: SocketAddr = listener.local_addr().context("local address")?;
    let base = url::Url::parse(&format!("http://{address}/")).context("endpoint URL")?;
    let engine = match options.engine {
        Engine::Own => Served::Own(server::OwnStore::new(base.clone(), options.region.clone())),
        Engine::Emulator => Served::Emulator(emulated::Emulated::new(&base, &options.region)?),
    };
    let key = options
        .key
        .as_deref()
        .map(auth::decode_key)
        .transpose()
        .map_err(|error| anyhow::anyhow!("--key: {error}"))?;
    let state = Arc::new(DevState {
        stats: Stats::default(),
        key: RwLock::new(key),
        engine,
    });
    let app = Router::new()
        .route("/_dev/healthz", get(|| async { "ok\n" }))
        .route("/_dev/stats", get(stats))
        .route("/_dev/split", axum::routing::post(split))
        .route("/_dev/key", axum::routing::post(replace_key))
        .route("/_dev/throttle", axum::routing::post(throttle))
        .fallback(cosmos)
        .with_state(state);
    if let Some(path) = &options.address_file {
        std::fs::write(path, address.to_string())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    tracing::info!(endpoint = %base, region = %options.region, engine = ?options.engine, "cosmos-dev serving");
    println!("cosmos-dev listening on {base}");
    let stopping = Arc::new(tokio::sync::Notify::new());
    let signalled = Arc::clone(&stopping);
    // Answers leave at once: without TCP_NODELAY a response written in two segments waits for the
    // client's delayed ACK (≈ 40 ms), which paced every change feed page.
    let listener = axum::serve::ListenerExt::tap_io(listener, |stream: &mut tokio::net::TcpStream| {
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
    });
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
    let (writes, last_lsn, unchanged, documents, throttled) = match &state.engine {
        Served::Own(own) => {
            let lsn = own.last_lsn();
            (
                lsn,
                lsn,
                own.unchanged_reads(),
                Some(own.document_count()),
                own.throttled_requests(),
            )
        }
        Served::Emulator(emulated) => (
            state.stats.writes.load(Ordering::Relaxed),
            emulated.last_lsn(),
            emulated.unchanged_reads(),
            None,
            0,
        ),
    };
    let body = serde_json::json!({
        "requests": state.stats.requests.load(Ordering::Relaxed),
        "writes": writes,
        "errors": state.stats.errors.load(Ordering::Relaxed),
        "lastLsn": last_lsn,
        "feedReadsAnsweredUnchanged": unchanged,
        "documents": documents,
        "throttled": throttled,
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
    let children = match &state.engine {
        Served::Own(own) => match own.split(db, coll, partition) {
            Ok((left, right)) => vec![left, right],
            Err(refusal) => {
                return plain(
                    http::StatusCode::NOT_FOUND,
                    format!("nothing split: {}", refusal.message),
                );
            }
        },
        Served::Emulator(emulated) => emulated.split(db, coll, partition).await,
    };
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

/// `POST /_dev/throttle?requests=N&retryAfterMs=M`: the next N document requests are answered
/// 429 with `x-ms-retry-after-ms: M`, as a container over its throughput is (own store only).
async fn throttle(
    State(state): State<Arc<DevState>>,
    axum::extract::Query(params): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Response {
    let requests = params.get("requests").and_then(|value| value.parse::<u64>().ok());
    let retry_after = params
        .get("retryAfterMs")
        .map_or(Some(100), |value| value.parse::<u64>().ok());
    let (Some(requests), Some(retry_after)) = (requests, retry_after) else {
        return plain(
            http::StatusCode::BAD_REQUEST,
            "expected ?requests=N[&retryAfterMs=M] (whole numbers; M defaults to 100)".to_owned(),
        );
    };
    match &state.engine {
        Served::Own(own) => {
            own.throttle(requests, retry_after);
            tracing::info!(
                requests,
                retry_after_ms = retry_after,
                "throttling document requests"
            );
            plain(
                http::StatusCode::OK,
                format!(
                    "the next {requests} document requests are answered 429 (retry after {retry_after} ms)\n"
                ),
            )
        }
        Served::Emulator(_) => plain(
            http::StatusCode::BAD_REQUEST,
            "throttling is served by the own store only (--engine own)".to_owned(),
        ),
    }
}

/// Every Cosmos REST request: authorized with the account key (when one is set), then answered by
/// the engine.
async fn cosmos(State(state): State<Arc<DevState>>, request: Request) -> Response {
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
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(body) => body,
        Err(error) => {
            return plain(
                http::StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body unreadable or over {MAX_BODY_BYTES} bytes: {error}"),
            );
        }
    };
    match &state.engine {
        Served::Own(own) => {
            let response = own.handle(&parts.method, parts.uri.path(), &parts.headers, &body);
            if response.status().is_server_error() {
                state.stats.errors.fetch_add(1, Ordering::Relaxed);
            }
            response
        }
        Served::Emulator(emulated) => emulated.forward(&state.stats, parts, body).await,
    }
}

fn plain(status: http::StatusCode, message: String) -> Response {
    (status, message).into_response()
}
