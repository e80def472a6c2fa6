//! `ingest`: the front door of contrail. See the `contrail_ingest` crate docs.

/// mimalloc: ingest is allocation-heavy (JSON values per record); see docs/BENCHMARKS.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::Parser;
use contrail_ingest::IngestConfig;

/// Accepts operational events over HTTP and gRPC, pulls them from configured sources, validates
/// them and produces them to ops.events.raw (rejected records to ops.events.dlq).
///
/// Configuration: built-in defaults < the TOML file given with --config < CONTRAIL_* environment
/// variables (CONTRAIL_KAFKA__BROKERS=host:9092 sets kafka.brokers). Unknown keys are errors.
#[derive(Parser)]
#[command(name = "ingest", version = contrail_common::version_text!())]
struct Cli {
    #[command(flatten)]
    stage: contrail_common::stage::StageArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    contrail_common::stage::main(
        "ingest",
        &cli.stage,
        |config: &IngestConfig| &config.telemetry,
        contrail_ingest::run,
    )
}
