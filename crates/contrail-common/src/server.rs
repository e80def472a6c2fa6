//! The HTTP server (health, readiness, metrics, plus a stage's routes) and the gRPC server (health,
//! reflection, plus a stage's services) every stage runs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::CommonError;
use crate::metrics::MetricsRegistry;
use crate::shutdown::Shutdown;

/// Liveness and readiness of a stage. `/healthz` answers 200 while the process serves; `/readyz`
/// answers 200 only while the stage says it is ready (connected, not draining) and holds no
/// partition at a gap ([`crate::consume::Gaps`]).
#[derive(Clone, Default)]
pub struct Health {
    ready: Arc<AtomicBool>,
    held_gaps: Arc<AtomicUsize>,
}

impl Health {
    /// Not ready yet.
    pub fn new() -> Health {
        Health::default()
    }

    /// Marks the stage ready or not.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether the stage is ready: it says so and holds no partition at a gap.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && self.held_gaps() == 0
    }

    /// How many partitions the stage holds at a gap (kept by [`crate::consume::Gaps`]).
    pub fn set_held_gaps(&self, held: usize) {
        self.held_gaps.store(held, Ordering::Relaxed);
    }

    /// Partitions held at a gap.
    pub fn held_gaps(&self) -> usize {
        self.held_gaps.load(Ordering::Relaxed)
    }
}

#[derive(Clone)]
struct ProbeState {
    health: Health,
    metrics: MetricsRegistry,
}

/// The `/healthz`, `/readyz` and `/metrics` routes. They are never behind authentication.
pub fn probe_routes(health: Health, metrics: MetricsRegistry) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(state): State<ProbeState>| async move {
                let held = state.health.held_gaps();
                if state.health.is_ready() {
                    (StatusCode::OK, "ready\n".to_owned())
                } else if held > 0 {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "not ready: {held} partition(s) held at a gap (`contrail admin status`, \
                             then `contrail admin accept-gap`)\n"
                        ),
                    )
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_owned())
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(state): State<ProbeState>| async move {
                (
                    [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    state.metrics.render(),
                )
            }),
        )
        .with_state(ProbeState { health, metrics })
}

/// Binds a TCP listener, with an error naming the address.
pub async fn bind(address: &str, what: &'static str) -> Result<TcpListener, CommonError> {
    TcpListener::bind(address)
        .await
        .map_err(|error| CommonError::Serve {
            what,
            address: address.to_owned(),
            message: error.to_string(),
        })
}

/// Serves `stage_routes` merged with the probe routes until shutdown; in-flight requests finish.
pub async fn serve_http(
    listener: TcpListener,
    stage_routes: Router,
    health: Health,
    metrics: MetricsRegistry,
    shutdown: Shutdown,
) -> Result<(), CommonError> {
    let address = local_address(&listener);
    let app = stage_routes.merge(probe_routes(health, metrics));
    tracing::info!(%address, "http server listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.triggered())
        .await
        .map_err(|error| CommonError::Serve {
            what: "HTTP",
            address: address.clone(),
            message: error.to_string(),
        })
}

fn local_address(listener: &TcpListener) -> String {
    listener
        .local_addr()
        .map(|address: SocketAddr| address.to_string())
        .unwrap_or_else(|_| "?".to_owned())
}

/// Serves the stage's gRPC `routes` plus `grpc.health.v1` (reporting `serving_names` as SERVING)
/// and server reflection for every contrail proto, until shutdown.
pub async fn serve_grpc(
    listener: TcpListener,
    routes: tonic::service::Routes,
    serving_names: &[&str],
    shutdown: Shutdown,
) -> Result<(), CommonError> {
    let address = local_address(&listener);
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    for name in serving_names {
        health_reporter
            .set_service_status(*name, tonic_health::ServingStatus::Serving)
            .await;
    }
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(contrail_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|error| CommonError::Serve {
            what: "gRPC",
            address: address.clone(),
            message: format!("reflection: {error}"),
        })?;
    let routes = routes.add_service(health_service).add_service(reflection);
    tracing::info!(%address, "grpc server listening");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tonic::transport::Server::builder()
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown.triggered())
        .await
        .map_err(|error| CommonError::Serve {
            what: "gRPC",
            address,
            message: error.to_string(),
        })
}

/// The two listeners of a stage, bound before anything else starts (a port in use fails early).
pub struct Listeners {
    /// HTTP: probes, metrics and the stage's HTTP API.
    pub http: TcpListener,
    /// gRPC: admin and the stage's services.
    pub grpc: TcpListener,
}

impl Listeners {
    /// Binds `listen.http` and `listen.grpc`.
    pub async fn bind(listen: &crate::config::ListenConfig) -> Result<Listeners, CommonError> {
        Ok(Listeners {
            http: bind(&listen.http, "HTTP").await?,
            grpc: bind(&listen.grpc, "gRPC").await?,
        })
    }
}

/// A stage's running HTTP and gRPC servers.
pub struct Servers {
    http: tokio::task::JoinHandle<Result<(), CommonError>>,
    grpc: tokio::task::JoinHandle<Result<(), CommonError>>,
}

impl Servers {
    /// Serves `http_routes` (plus the probes) and `grpc_routes` (plus health and reflection, with
    /// `serving_names` reported SERVING) until `shutdown`.
    pub fn spawn(
        listeners: Listeners,
        http_routes: Router,
        grpc_routes: tonic::service::Routes,
        serving_names: &'static [&'static str],
        health: &Health,
        metrics: MetricsRegistry,
        shutdown: &Shutdown,
    ) -> Servers {
        let grpc_shutdown = shutdown.clone();
        let grpc = shutdown.spawn(async move {
            serve_grpc(listeners.grpc, grpc_routes, serving_names, grpc_shutdown).await
        });
        let http = shutdown.spawn(serve_http(
            listeners.http,
            http_routes,
            health.clone(),
            metrics,
            shutdown.clone(),
        ));
        Servers { http, grpc }
    }

    /// Waits until both have stopped (after the shutdown was triggered); failures are logged.
    pub async fn join(self) {
        for (name, task) in [("grpc", self.grpc), ("http", self.http)] {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::error!(server = name, %error, "server failed"),
                Err(error) => tracing::error!(server = name, %error, "server task panicked"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn probes_answer_and_readiness_follows_the_flag() {
        let health = Health::new();
        let metrics = MetricsRegistry::new();
        let counter = prometheus::IntCounter::new("contrail_test_total", "a test counter").expect("valid");
        metrics.register(&counter);
        counter.inc();
        let listener = bind("127.0.0.1:0", "HTTP").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let shutdown = Shutdown::new();
        let server = tokio::spawn(serve_http(
            listener,
            Router::new(),
            health.clone(),
            metrics,
            shutdown.clone(),
        ));
        let get = |path: &'static str| async move {
            let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.expect("write");
            let mut response = String::new();
            stream.read_to_string(&mut response).await.expect("read");
            response
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/readyz").await.starts_with("HTTP/1.1 503"));
        health.set_ready(true);
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/metrics").await.contains("contrail_test_total 1"));
        shutdown.trigger();
        server.await.expect("join").expect("clean shutdown");
    }
}
