//! `dedup-state`: the stateful stage of contrail. See the `contrail_dedup_state` crate docs.

/// mimalloc: protobuf decoding and encoding allocate per record.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::Parser;
use contrail_dedup_state::DedupStateConfig;

/// The stateful stage: deduplicates ops.events.raw by event id, sends late events to
/// ops.events.late, orders each flight's events by event time, folds them into FlightState
/// (ops.flights.curated, version = accepted count), forwards accepted events (ops.events.accepted)
/// and raises DEPARTURE_OVERDUE alerts (ops.alerts). State lives in one RocksDB shard per input
/// partition under state_dir, checkpointed to checkpoint_url; a restarted or rescheduled instance
/// resumes exactly where its shards left off.
///
/// Configuration: built-in defaults < the TOML file given with --config < CONTRAIL_* environment
/// variables (CONTRAIL_STATE_DIR=/data/shards sets state_dir, CONTRAIL_KAFKA__BROKERS=host:9092 sets
/// kafka.brokers). Unknown keys are errors.
#[derive(Parser)]
#[command(name = "dedup-state", version = contrail_common::version_text!())]
struct Cli {
    #[command(flatten)]
    stage: contrail_common::stage::StageArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    contrail_common::stage::main(
        "dedup-state",
        &cli.stage,
        |config: &DedupStateConfig| &config.telemetry,
        contrail_dedup_state::run,
    )
}
