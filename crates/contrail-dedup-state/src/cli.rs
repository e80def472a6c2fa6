//! The `dedup-state` command line: what `--help` says, and the process's `main` (the binary's
//! `main.rs` only passes the version text, so a new commit relinks it and recompiles nothing else).

use std::process::ExitCode;

use clap::Parser;

use crate::DedupStateConfig;

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
#[command(name = "dedup-state")]
struct Cli {
    #[command(flatten)]
    stage: contrail_common::stage::StageArgs,
}

/// Parses the command line (`version` is `--version`'s text, given by the binary) and runs the
/// stage until it is told to stop.
pub fn main(version: &'static str) -> ExitCode {
    let cli: Cli = contrail_common::build_info::parse_args(version);
    contrail_common::stage::main(
        "dedup-state",
        &cli.stage,
        |config: &DedupStateConfig| &config.telemetry,
        crate::run,
    )
}

#[cfg(test)]
mod tests {
    /// The command line clap builds at run time, with the version the binary passes, is valid.
    #[test]
    fn the_command_line_is_consistent() {
        contrail_common::build_info::command::<super::Cli>("0.1.0 (commit c6e0edb1234a)").debug_assert();
    }
}
