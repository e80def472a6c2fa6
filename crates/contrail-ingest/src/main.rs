//! `ingest`: the front door of contrail. See the `contrail_ingest` crate docs.

/// mimalloc: ingest is allocation-heavy (JSON values per record); see docs/BENCHMARKS.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use contrail_common::config;
use contrail_common::shutdown::Shutdown;
use contrail_ingest::IngestConfig;

/// Accepts operational events over HTTP and gRPC, pulls them from configured sources, validates
/// them and produces them to ops.events.raw (rejected records to ops.events.dlq).
///
/// Configuration: built-in defaults < the TOML file given with --config < CONTRAIL_* environment
/// variables (CONTRAIL_KAFKA__BROKERS=host:9092 sets kafka.brokers). Unknown keys are errors.
#[derive(Parser)]
#[command(name = "ingest", version)]
struct Cli {
    /// TOML configuration file.
    #[arg(long, env = "CONTRAIL_CONFIG_FILE")]
    config: Option<PathBuf>,
    /// Print the effective configuration (secrets redacted) and exit.
    #[arg(long)]
    print_config: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config: IngestConfig = match config::load(cli.config.as_deref()) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("ingest: {error}");
            return ExitCode::from(2);
        }
    };
    if cli.print_config {
        print!("{}", config::render_effective(&config));
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("ingest: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let _telemetry = match contrail_common::telemetry::init("ingest", &config.telemetry) {
            Ok(guard) => guard,
            Err(error) => {
                eprintln!("ingest: {error}");
                return ExitCode::from(2);
            }
        };
        tracing::info!(config = %config::render_effective(&config), "effective configuration");
        let shutdown = Shutdown::new();
        shutdown.install_signal_handlers();
        match contrail_ingest::run(config, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!(%error, retryable = error.is_retryable(), "ingest failed");
                ExitCode::FAILURE
            }
        }
    })
}
