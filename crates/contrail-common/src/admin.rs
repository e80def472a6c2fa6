//! The admin API (`contrail.admin.v1.AdminService`) of a streaming stage that has no checkpoints
//! and no per-key state of its own. Its users: cosmos-writer, changefeed-sync and delta-archiver
//! (whose progress lives in the Delta tables). ingest and dedup-state serve their own admin
//! services (sources; shards, checkpoints and key state). Status comes from the stage,
//! pause/resume through a shared flag, drain through the shutdown; the checkpoint and key-state
//! calls answer `UNIMPLEMENTED` with the stage's reason.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use contrail_proto::admin::v1 as admin;
use tonic::{Request, Response, Status};

use crate::auth::BearerTokens;
use crate::metrics::MetricsRegistry;
use crate::server::{Health, Listeners, Servers};
use crate::shutdown::Shutdown;

/// What a stage reports in `Status`.
#[tonic::async_trait]
pub trait StageStatus: Send + Sync + 'static {
    /// The stage's status; `stage`, `version`, `ready` and `paused` are filled in by the admin.
    async fn status(&self) -> Result<admin::StatusResponse, Status>;
}

/// The admin service of a streaming stage.
pub struct StreamAdmin<S> {
    stage: &'static str,
    no_checkpoints: &'static str,
    source: S,
    paused: Arc<AtomicBool>,
    health: Health,
    shutdown: Shutdown,
}

impl<S: StageStatus> StreamAdmin<S> {
    /// `no_checkpoints` is the answer to the checkpoint and key-state calls (say where the stage's
    /// progress lives instead).
    pub fn new(
        stage: &'static str,
        no_checkpoints: &'static str,
        source: S,
        paused: Arc<AtomicBool>,
        health: Health,
        shutdown: Shutdown,
    ) -> StreamAdmin<S> {
        StreamAdmin {
            stage,
            no_checkpoints,
            source,
            paused,
            health,
            shutdown,
        }
    }

    /// Serves this admin API (behind `tokens`) with gRPC health and reflection, and the probes
    /// and `metrics` over HTTP, on `listeners` until the shutdown.
    pub fn serve(self, listeners: Listeners, tokens: &BearerTokens, metrics: MetricsRegistry) -> Servers {
        let health = self.health.clone();
        let shutdown = self.shutdown.clone();
        let routes =
            tonic::service::Routes::new(admin::admin_service_server::AdminServiceServer::with_interceptor(
                self,
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
        status.stage = self.stage.to_owned();
        status.version = env!("CARGO_PKG_VERSION").to_owned();
        status.ready = self.health.is_ready();
        status.paused = self.paused.load(Ordering::Relaxed);
        Ok(Response::new(status))
    }

    async fn pause(&self, _: Request<admin::PauseRequest>) -> Result<Response<admin::PauseResponse>, Status> {
        self.paused.store(true, Ordering::Relaxed);
        tracing::info!(stage = self.stage, "paused by admin request");
        Ok(Response::new(admin::PauseResponse { paused: true }))
    }

    async fn resume(
        &self,
        _: Request<admin::ResumeRequest>,
    ) -> Result<Response<admin::ResumeResponse>, Status> {
        self.paused.store(false, Ordering::Relaxed);
        tracing::info!(stage = self.stage, "resumed by admin request");
        Ok(Response::new(admin::ResumeResponse { paused: false }))
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
        tracing::info!(stage = self.stage, "drain requested by admin");
        self.health.set_ready(false);
        self.shutdown.trigger();
        Ok(Response::new(admin::DrainResponse { draining: true }))
    }
}
