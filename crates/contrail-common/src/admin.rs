//! The admin API (`contrail.admin.v1.AdminService`), implemented once ([`AdminApi`]) for every
//! stage. A stage supplies what only it knows ([`StageAdmin`]: its status; dedup-state also its
//! checkpoints, key state and which gaps it refuses); pause/resume go through a shared flag, drain
//! through the shutdown, accepting gaps through the frame's [`Gaps`] ([`AdminControls`]). A stage
//! without checkpoints or key state (cosmos-writer, changefeed-sync, delta-archiver, ingest)
//! answers those calls `UNIMPLEMENTED` with its reason ([`NoCheckpoints`]).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use contrail_proto::admin::v1 as admin;
use tonic::{Request, Response, Status};

use crate::auth::BearerTokens;
use crate::consume::Gaps;
use crate::consume::gaps::Held;
use crate::metrics::MetricsRegistry;
use crate::server::{Health, Listeners, Servers};
use crate::shutdown::Shutdown;

/// What a stage reports in `Status`.
#[tonic::async_trait]
pub trait StageStatus: Send + Sync + 'static {
    /// The stage's status; `stage`, `version`, `ready` and `paused` are filled in by the admin.
    async fn status(&self) -> Result<admin::StatusResponse, Status>;
}

/// What only the stage knows, for [`AdminApi`]: its status and, where it has them, its
/// checkpoints and key state (those calls answer `UNIMPLEMENTED` unless the stage answers them),
/// and which held gaps it refuses to accept.
#[tonic::async_trait]
pub trait StageAdmin: StageStatus {
    /// Why the checkpoint and key-state calls are `UNIMPLEMENTED` here (where the stage's progress
    /// lives instead).
    fn no_checkpoints(&self) -> &'static str {
        "this stage keeps no checkpoints or key state"
    }

    /// `TriggerCheckpoint`.
    async fn trigger_checkpoint(&self) -> Result<admin::TriggerCheckpointResponse, Status> {
        Err(Status::unimplemented(self.no_checkpoints()))
    }

    /// `ListCheckpoints`.
    async fn list_checkpoints(&self) -> Result<admin::ListCheckpointsResponse, Status> {
        Err(Status::unimplemented(self.no_checkpoints()))
    }

    /// `RestoreCheckpoint`.
    async fn restore_checkpoint(
        &self,
        _request: admin::RestoreCheckpointRequest,
    ) -> Result<admin::RestoreCheckpointResponse, Status> {
        Err(Status::unimplemented(self.no_checkpoints()))
    }

    /// `ReadKeyState`.
    async fn read_key_state(
        &self,
        _request: admin::ReadKeyStateRequest,
    ) -> Result<admin::ReadKeyStateResponse, Status> {
        Err(Status::unimplemented(self.no_checkpoints()))
    }

    /// Refuses an `AcceptGap` of some of the gaps `held` (an error naming them); by default every
    /// held gap may be accepted.
    fn refuse_gap(&self, _held: &[Held], _request: &admin::AcceptGapRequest) -> Result<(), Status> {
        Ok(())
    }
}

/// A stage with no checkpoints and no key state: its status, and `reason` as the answer to those
/// calls.
pub struct NoCheckpoints<S> {
    /// Where the stage's progress lives instead.
    pub reason: &'static str,
    /// The stage's status.
    pub status: S,
}

#[tonic::async_trait]
impl<S: StageStatus> StageStatus for NoCheckpoints<S> {
    async fn status(&self) -> Result<admin::StatusResponse, Status> {
        self.status.status().await
    }
}

impl<S: StageStatus> StageAdmin for NoCheckpoints<S> {
    fn no_checkpoints(&self) -> &'static str {
        self.reason
    }
}

/// The operator controls every stage's admin API shares: pause and resume (a flag the stage's
/// loop reads), drain (not ready, then the process shutdown), accepting gaps (the partitions the
/// stage's loop holds at one, [`Gaps`]), and the fields every `Status` carries (stage, version,
/// readiness, pause, uptime, gaps held). Clones share the flag and the gaps.
#[derive(Clone)]
pub struct AdminControls {
    stage: &'static str,
    paused: Arc<AtomicBool>,
    health: Health,
    gaps: Gaps,
    shutdown: Shutdown,
    started: Instant,
}

impl AdminControls {
    /// Controls of `stage`, not paused.
    pub fn new(stage: &'static str, health: Health, shutdown: Shutdown) -> AdminControls {
        AdminControls {
            stage,
            paused: Arc::default(),
            gaps: Gaps::new(stage, health.clone()),
            health,
            shutdown,
            started: Instant::now(),
        }
    }

    /// The same controls over a pause flag the stage already owns (ingest's pipeline).
    pub fn with_pause_flag(mut self, paused: Arc<AtomicBool>) -> AdminControls {
        self.paused = paused;
        self
    }

    /// The pause flag, for the stage's loop.
    pub fn pause_flag(&self) -> Arc<AtomicBool> {
        self.paused.clone()
    }

    /// The partitions held at a gap, for the stage's loop.
    pub fn gaps(&self) -> Gaps {
        self.gaps.clone()
    }

    /// Whether an operator paused the stage.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// Seconds since start, at least 1 (a rate's denominator).
    pub fn uptime_seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64().max(1.0)
    }

    /// Fills the fields every stage reports the same way.
    pub fn stamp(&self, status: &mut admin::StatusResponse) {
        status.stage = self.stage.to_owned();
        status.version = env!("CARGO_PKG_VERSION").to_owned();
        status.ready = self.health.is_ready();
        status.paused = self.is_paused();
        status.gaps = self.gaps.held().iter().map(|held| held.to_status()).collect();
        if status.uptime_seconds == 0 {
            status.uptime_seconds = self.uptime_seconds() as i64;
        }
    }

    /// `Pause`: the stage stops taking new work; work in flight finishes.
    pub fn pause(&self) -> Response<admin::PauseResponse> {
        self.paused.store(true, Ordering::Relaxed);
        tracing::info!(stage = self.stage, "paused by admin request");
        Response::new(admin::PauseResponse { paused: true })
    }

    /// `Resume`.
    pub fn resume(&self) -> Response<admin::ResumeResponse> {
        self.paused.store(false, Ordering::Relaxed);
        tracing::info!(stage = self.stage, "resumed by admin request");
        Response::new(admin::ResumeResponse { paused: false })
    }

    /// `AcceptGap`: the partition named (or, with `all`, every partition held) goes on from its
    /// topic's first offset. `NOT_FOUND` when this instance holds no such gap.
    pub fn accept_gap(
        &self,
        request: &admin::AcceptGapRequest,
    ) -> Result<Response<admin::AcceptGapResponse>, Status> {
        let partition = if request.all {
            None
        } else if request.topic.is_empty() {
            return Err(Status::invalid_argument(
                "name the partition (topic and partition) or accept every gap held (all)",
            ));
        } else {
            Some((request.topic.as_str(), request.partition))
        };
        let accepted = self.gaps.accept(partition);
        if accepted.is_empty() {
            let held: Vec<String> = self
                .gaps
                .held()
                .iter()
                .map(|held| format!("{}/{}", held.topic, held.partition))
                .collect();
            let what = match partition {
                Some((topic, partition)) => format!("{topic}/{partition}"),
                None => "any partition".to_owned(),
            };
            return Err(Status::not_found(format!(
                "{} instance holds no gap at {what} (held here: {})",
                self.stage,
                if held.is_empty() {
                    "none".to_owned()
                } else {
                    held.join(", ")
                }
            )));
        }
        Ok(Response::new(admin::AcceptGapResponse {
            accepted: accepted.iter().map(|held| held.to_status()).collect(),
        }))
    }

    /// `Drain`: not ready (traffic goes elsewhere), then the graceful shutdown: the batch in
    /// flight finishes and commits, consumers leave their group.
    pub fn drain(&self) -> Response<admin::DrainResponse> {
        tracing::info!(stage = self.stage, "drain requested by admin");
        self.health.set_ready(false);
        self.shutdown.trigger();
        Response::new(admin::DrainResponse { draining: true })
    }
}

/// How often the consumer-lag gauge is refreshed.
pub const LAG_INTERVAL: Duration = Duration::from_secs(10);

/// Keeps `contrail_consumer_partitions_owned` (how many input partitions or leases this instance
/// owns: a stage whose instances own none is starved, as a broker's failed group coordinator left
/// every group in the large chaos run) and `contrail_consumer_lag_records{topic,partition}` — the records between the stage's
/// position and the end of each input partition it owns (-1: unknown) — current from `status`,
/// every `interval` until the shutdown. Partitions the stage no longer owns, or owns without a
/// position yet, have no series. The series
/// the lag alert (deploy/helm/contrail/files/prometheus-rules.yaml) reads, the same for every
/// consuming stage.
pub fn spawn_lag_metrics<F, Fut>(
    registry: &MetricsRegistry,
    shutdown: &Shutdown,
    interval: Duration,
    status: F,
) where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = Result<admin::StatusResponse, Status>> + Send,
{
    let gauge = registry.gauge_vec(
        "contrail_consumer_lag_records",
        "Records between the stage's position and the end of an input partition it owns (-1: unknown)",
        &["topic", "partition"],
    );
    let owned = registry.gauge(
        "contrail_consumer_partitions_owned",
        "Input partitions (changefeed-sync: feed-range leases) this instance owns; a stage whose \
         instances together own none is not consuming at all",
    );
    let stop = shutdown.clone();
    shutdown.spawn(async move {
        loop {
            let answer = tokio::select! {
                answer = status() => answer,
                () = stop.triggered() => break,
            };
            if let Ok(status) = answer {
                let partitions = status.partitions.iter().filter(|p| !p.topic.is_empty()).count();
                owned.set(i64::try_from(partitions + status.leases.len()).unwrap_or(i64::MAX));
                gauge.reset();
                // A partition without a position yet (nothing committed since it was assigned)
                // has no lag to report: its whole history would read as backlog.
                let known = status
                    .partitions
                    .iter()
                    .filter(|p| !p.topic.is_empty() && p.committed_offset >= 0);
                for partition in known {
                    gauge
                        .with_label_values(&[partition.topic.as_str(), &partition.partition.to_string()])
                        .set(partition.lag);
                }
            }
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = stop.triggered() => break,
            }
        }
    });
}

/// The admin service (`contrail.admin.v1.AdminService`) of a stage: its [`StageAdmin`] and the
/// [`AdminControls`] every stage shares.
pub struct AdminApi<S> {
    stage: S,
    controls: AdminControls,
}

impl<S: StageAdmin> AdminApi<S> {
    /// The admin service of `stage`, with `controls`.
    pub fn new(stage: S, controls: AdminControls) -> AdminApi<S> {
        AdminApi { stage, controls }
    }

    /// The stage's status, with the fields every stage reports stamped in.
    pub async fn status(&self) -> Result<admin::StatusResponse, Status> {
        let mut status = self.stage.status().await?;
        self.controls.stamp(&mut status);
        Ok(status)
    }

    /// The gRPC service behind `tokens`. With `lag_metrics` (a consuming stage), keeps the
    /// consumer-lag gauges of that registry current from the status ([`spawn_lag_metrics`]) until
    /// the shutdown; ingest, which consumes nothing, passes `None`.
    pub fn service(
        self,
        tokens: &BearerTokens,
        lag_metrics: Option<&MetricsRegistry>,
    ) -> tonic::service::interceptor::InterceptedService<
        admin::admin_service_server::AdminServiceServer<AdminApi<S>>,
        impl tonic::service::Interceptor + Clone + use<S>,
    > {
        let shutdown = self.controls.shutdown.clone();
        let admin = Arc::new(self);
        if let Some(metrics) = lag_metrics {
            let source = admin.clone();
            spawn_lag_metrics(metrics, &shutdown, LAG_INTERVAL, move || {
                let source = source.clone();
                async move { source.status().await }
            });
        }
        tonic::service::interceptor::InterceptedService::new(
            admin::admin_service_server::AdminServiceServer::from_arc(admin),
            tokens.grpc_interceptor(),
        )
    }

    /// Serves this admin API (behind `tokens`) with gRPC health and reflection, and the probes
    /// and `metrics` over HTTP, on `listeners` until the shutdown; keeps the consumer-lag gauge
    /// current ([`AdminApi::service`]).
    pub fn serve(self, listeners: Listeners, tokens: &BearerTokens, metrics: MetricsRegistry) -> Servers {
        let health = self.controls.health.clone();
        let shutdown = self.controls.shutdown.clone();
        let routes = tonic::service::Routes::new(self.service(tokens, Some(&metrics)));
        Servers::spawn(
            listeners,
            axum::Router::new(),
            routes,
            &["contrail.admin.v1.AdminService"],
            &health,
            metrics,
            &shutdown,
        )
    }
}

#[tonic::async_trait]
impl<S: StageAdmin> admin::admin_service_server::AdminService for AdminApi<S> {
    async fn status(
        &self,
        _: Request<admin::StatusRequest>,
    ) -> Result<Response<admin::StatusResponse>, Status> {
        AdminApi::status(self).await.map(Response::new)
    }

    async fn pause(&self, _: Request<admin::PauseRequest>) -> Result<Response<admin::PauseResponse>, Status> {
        Ok(self.controls.pause())
    }

    async fn resume(
        &self,
        _: Request<admin::ResumeRequest>,
    ) -> Result<Response<admin::ResumeResponse>, Status> {
        Ok(self.controls.resume())
    }

    async fn trigger_checkpoint(
        &self,
        _: Request<admin::TriggerCheckpointRequest>,
    ) -> Result<Response<admin::TriggerCheckpointResponse>, Status> {
        self.stage.trigger_checkpoint().await.map(Response::new)
    }

    async fn list_checkpoints(
        &self,
        _: Request<admin::ListCheckpointsRequest>,
    ) -> Result<Response<admin::ListCheckpointsResponse>, Status> {
        self.stage.list_checkpoints().await.map(Response::new)
    }

    async fn restore_checkpoint(
        &self,
        request: Request<admin::RestoreCheckpointRequest>,
    ) -> Result<Response<admin::RestoreCheckpointResponse>, Status> {
        self.stage
            .restore_checkpoint(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn read_key_state(
        &self,
        request: Request<admin::ReadKeyStateRequest>,
    ) -> Result<Response<admin::ReadKeyStateResponse>, Status> {
        self.stage
            .read_key_state(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn drain(&self, _: Request<admin::DrainRequest>) -> Result<Response<admin::DrainResponse>, Status> {
        Ok(self.controls.drain())
    }

    async fn accept_gap(
        &self,
        request: Request<admin::AcceptGapRequest>,
    ) -> Result<Response<admin::AcceptGapResponse>, Status> {
        let request = request.get_ref();
        self.stage.refuse_gap(&self.controls.gaps.held(), request)?;
        self.controls.accept_gap(request)
    }
}
