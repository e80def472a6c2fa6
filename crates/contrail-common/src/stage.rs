//! The `main` of every stage binary: load the layered config (exit 2 on a bad value), optionally
//! print it, start the runtime, telemetry and signal handling, run the stage, and map the outcome
//! to an exit code. Each stage's `main.rs` is its CLI definition plus one call to [`main`]; its
//! library's `run` begins with a [`StageContext`].

use std::future::Future;
use std::process::ExitCode;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::CommonError;
use crate::admin::{AdminApi, AdminControls, NoCheckpoints, StageStatus};
use crate::auth::{AuthConfig, AuthDecision, BearerTokens};
use crate::config::{self, ListenConfig};
use crate::kafka::KafkaConfig;
use crate::metrics::MetricsRegistry;
use crate::server::{Health, Listeners, Servers};
use crate::shutdown::Shutdown;
use crate::telemetry::TelemetryConfig;
use crate::topology::StageSpec;

/// The command-line options every stage binary has (flatten into its `clap` parser).
#[derive(Debug, clap::Args)]
pub struct StageArgs {
    /// TOML configuration file.
    #[arg(long, env = "CONTRAIL_CONFIG_FILE")]
    pub config: Option<std::path::PathBuf>,
    /// Print the effective configuration (secrets redacted) and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// How a stage's error reports itself.
pub trait StageError: std::fmt::Display {
    /// Whether retrying (restarting) later can succeed.
    fn is_retryable(&self) -> bool;
}

/// Runs stage `name` with the config from `args.config` and the environment.
pub fn main<C, E, F, Fut>(
    name: &'static str,
    args: &StageArgs,
    telemetry: fn(&C) -> &TelemetryConfig,
    run: F,
) -> ExitCode
where
    C: DeserializeOwned + Serialize + Default,
    E: StageError,
    F: FnOnce(C, Shutdown) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let config: C = match config::load(args.config.as_deref()) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{name}: {error}");
            return ExitCode::from(2);
        }
    };
    if args.print_config {
        print!("{}", config::render_effective(&config));
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("{name}: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let _telemetry = match crate::telemetry::init(name, telemetry(&config)) {
            Ok(guard) => guard,
            Err(error) => {
                eprintln!("{name}: {error}");
                return ExitCode::from(2);
            }
        };
        tracing::info!(config = %config::render_effective(&config), "effective configuration");
        let shutdown = Shutdown::new();
        shutdown.install_signal_handlers();
        match run(config, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!(%error, retryable = error.is_retryable(), "{name} failed");
                ExitCode::FAILURE
            }
        }
    })
}

/// The start-up every stage's `run` shares, in one place: the config validated (a bad value stops
/// the stage with the message), one metrics registry, the health flags, the operator controls
/// (pause, resume, drain) and the shutdown. A stage builds its own clients and loops on top.
pub struct StageContext {
    /// The stage's name and default ports.
    pub spec: StageSpec,
    /// The process's metrics registry (served at `/metrics`).
    pub registry: MetricsRegistry,
    /// Liveness and readiness (served at `/healthz` and `/readyz`).
    pub health: Health,
    /// Pause, resume and drain for the admin API.
    pub controls: AdminControls,
    /// The process shutdown.
    pub shutdown: Shutdown,
}

impl StageContext {
    /// Starts stage `spec` once its config's `validation` passed.
    pub fn start(
        spec: StageSpec,
        validation: Result<(), String>,
        shutdown: Shutdown,
    ) -> Result<StageContext, CommonError> {
        validation.map_err(CommonError::Config)?;
        let health = Health::new();
        let registry = MetricsRegistry::new();
        // When this process started: restarts show as changes of it (the restart alert).
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64());
        registry
            .float_gauge_vec(
                "contrail_process_start_time_seconds",
                "Start time of this stage process, seconds since the Unix epoch",
                &["stage"],
            )
            .with_label_values(&[spec.name])
            .set(started);
        let controls = AdminControls::new(spec.name, health.clone(), shutdown.clone());
        controls.gaps().register_metrics(&registry);
        Ok(StageContext {
            spec,
            registry,
            controls,
            health,
            shutdown,
        })
    }

    /// Loads the bearer tokens of `section` (e.g. `auth`) guarding `guarded` (e.g. "the admin
    /// API"). Fails closed: with no tokens, a stage that `listen`s beyond loopback refuses to start
    /// unless the section says `disabled = true` ([`crate::auth::decide`]).
    pub fn tokens(
        &self,
        auth: &AuthConfig,
        section: &str,
        guarded: &str,
        listen: &ListenConfig,
    ) -> Result<BearerTokens, CommonError> {
        let tokens = auth.load()?;
        let exposed = listen.beyond_loopback();
        let env = format!("CONTRAIL_{}__TOKENS_FILE", section.to_ascii_uppercase());
        match crate::auth::decide(tokens.enabled(), auth.disabled, exposed.is_none()) {
            AuthDecision::Enforce => {}
            AuthDecision::OpenOnLoopback => tracing::warn!(
                stage = self.spec.name,
                "no {section}.tokens configured: {guarded} accepts unauthenticated requests (loopback only)"
            ),
            AuthDecision::OpenByChoice => tracing::warn!(
                stage = self.spec.name,
                listen = exposed.unwrap_or("loopback"),
                "{section}.disabled = true: {guarded} accepts unauthenticated requests"
            ),
            AuthDecision::RefuseNoTokens => {
                return Err(CommonError::Config(format!(
                    "no {section} tokens configured while {} listens on {} (beyond loopback), so \
                     {guarded} would accept anyone: set {section}.tokens_file ({env}) or \
                     {section}.tokens, or {section}.disabled = true to run without authentication",
                    self.spec.name,
                    exposed.unwrap_or_default()
                )));
            }
            AuthDecision::RefuseContradiction => {
                return Err(CommonError::Config(format!(
                    "{section}.disabled = true while {section} tokens are configured: remove one"
                )));
            }
        }
        Ok(tokens)
    }

    /// Creates `names` with `partitions` partitions when `create` is set (the stage's
    /// `topics.create`; off where topics are provisioned, as on Event Hubs).
    pub async fn create_topics(
        &self,
        kafka: &KafkaConfig,
        create: bool,
        names: &[&str],
        partitions: i32,
    ) -> Result<(), CommonError> {
        if !create {
            return Ok(());
        }
        crate::kafka::create_topics(kafka, self.spec.name, names, partitions).await
    }

    /// Binds `listen` and serves the admin API of a stage without checkpoints or key state
    /// ([`AdminApi`] over [`NoCheckpoints`]) behind `tokens`, with the probes and metrics; then marks the stage ready.
    pub async fn serve_stream_admin<S: StageStatus>(
        &self,
        listen: &ListenConfig,
        tokens: &BearerTokens,
        no_checkpoints: &'static str,
        status: S,
    ) -> Result<Servers, CommonError> {
        let listeners = Listeners::bind(listen).await?;
        let stage = NoCheckpoints {
            reason: no_checkpoints,
            status,
        };
        let admin = AdminApi::new(stage, self.controls.clone());
        Ok(admin.serve(listeners, tokens, self.registry.clone()))
    }

    /// Runs `body` unless the shutdown comes first (`None` then): for start-up steps that wait on
    /// an outside service (Cosmos DB, the Delta storage).
    pub async fn unless_shutdown<T>(&self, body: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            value = body => Some(value),
            () = self.shutdown.triggered() => None,
        }
    }
}
