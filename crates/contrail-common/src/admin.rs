//! The admin API (`contrail.admin.v1.AdminService`) of a streaming stage that has no checkpoints
//! and no per-key state of its own. Its users: cosmos-writer, changefeed-sync and delta-archiver
//! (whose progress lives in the Delta tables). ingest and dedup-state serve their own admin
//! services (sources; shards, checkpoints and key state). Status comes from the stage,
//! pause/resume through a shared flag, drain through the shutdown; the checkpoint and key-state
//! calls answer `UNIMPLEMENTED` with the stage's reason.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use contrail_proto::admin::v1 as admin;
use tonic::{Request, Response, Status};

use crate::auth::BearerTokens;
use crate::consume::Gaps;
use crate::metrics::MetricsRegistry;
use crate::server::{Health, Listeners, Servers};
use crate::shutdown::Shutdown;

/// What a stage reports in `Status`.
#[tonic::async_trait]
pub trait StageStatus: Send + Sync + 'static {
    /// The stage's status; `stage`, `version`, `ready` and `paused` are filled in by the admin.
    async fn status(&self) -> Result<admin::StatusResponse, Status>;
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

/// The admin service of a streaming stage.
pub struct StreamAdmin<S> {
    no_checkpoints: &'static str,
    source: S,
    controls: AdminControls,
}

impl<S: StageStatus> StreamAdmin<S> {
    /// `no_checkpoints` is the answer to the checkpoint and key-state calls (say where the stage's
    /// progress lives instead).
    pub fn new(no_checkpoints: &'static str, source: S, controls: AdminControls) -> StreamAdmin<S> {
        StreamAdmin {
            no_checkpoints,
            source,
            controls,
        }
    }

    /// Serves this admin API (behind `tokens`) with gRPC health and reflection, and the probes
    /// and `metrics` over HTTP, on `listeners` until the shutdown; keeps the consumer-lag gauge
    /// current from the stage's status ([`spawn_lag_metrics`]).
    pub fn serve(self, listeners: Listeners, tokens: &BearerTokens, metrics: MetricsRegistry) -> Servers {
        let health = self.controls.health.clone();
        let shutdown = self.controls.shutdown.clone();
        let admin = Arc::new(self);
        let source = admin.clone();
        spawn_lag_metrics(&metrics, &shutdown, LAG_INTERVAL, move || {
            let source = source.clone();
            async move { source.source.status().await }
        });
        let routes = tonic::service::Routes::new(tonic::service::interceptor::InterceptedService::new(
            admin::admin_service_server::AdminServiceServer::from_arc(admin),
            tokens.grpc_interceptor(),
        ));
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
impl<S: StageStatus> admin::admin_service_server::AdminService for StreamAdmin<S> {
    async fn status(
        &self,
        _: Request<admin::StatusRequest>,
    ) -> Result<Response<admin::StatusResponse>, Status> {
        let mut status = self.source.status().await?;
        self.controls.stamp(&mut status);
        Ok(Response::new(status))
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
        Err(Status::unimplemented(self.no_checkpoints))
    }

    async fn list_checkpoints(
        &self,
        _: Request<admin::ListCheckpointsRequest>,
    ) -> Result<Response<admin::ListCheckpointsResponse>, Status> {
        Err(Status::unimplemented(self.no_checkpoints))
    }

    async fn restore_checkpoint(
        &self,
        _: Request<admin::RestoreCheckpointRequest>,
    ) -> Result<Response<admin::RestoreCheckpointResponse>, Status> {
        Err(Status::unimplemented(self.no_checkpoints))
    }

    async fn read_key_state(
        &self,
        _: Request<admin::ReadKeyStateRequest>,
    ) -> Result<Response<admin::ReadKeyStateResponse>, Status> {
        Err(Status::unimplemented(self.no_checkpoints))
    }

    async fn drain(&self, _: Request<admin::DrainRequest>) -> Result<Response<admin::DrainResponse>, Status> {
        Ok(self.controls.drain())
    }

    async fn accept_gap(
        &self,
        request: Request<admin::AcceptGapRequest>,
    ) -> Result<Response<admin::AcceptGapResponse>, Status> {
        self.controls.accept_gap(request.get_ref())
    }
}
