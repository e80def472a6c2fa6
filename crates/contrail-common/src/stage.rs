//! The `main` of every stage binary: load the layered config (exit 2 on a bad value), optionally
//! print it, start the runtime, telemetry and signal handling, run the stage, and map the outcome
//! to an exit code. Each stage's `main.rs` is its CLI definition plus one call to [`main`].

use std::future::Future;
use std::process::ExitCode;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config;
use crate::shutdown::Shutdown;
use crate::telemetry::TelemetryConfig;

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
