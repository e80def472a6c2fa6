//! The `delta-archiver` command line: what `--help` says, and the process's `main` (the binary's
//! `main.rs` only passes the version text, so a new commit relinks it and recompiles nothing else).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::DeltaArchiverConfig;

/// Archives ops.events.accepted → events, ops.flights.curated → flight_states, ops.events.late →
/// late_events, ops.flights.changes → serving_changes, ops.alerts → alerts (and, when configured,
/// the knock-on predictions → predictions) as Delta Lake tables under
/// CONTRAIL_DELTA_ROOT, partitioned by date. Exactly once: every commit stores the last offset of
/// each source partition as a Delta txn action; a restarted or rebalanced instance resumes after
/// it, and redelivered copies are dropped by identity. Undecodable records go to the dead-letter
/// topic. Compaction and vacuum run on a schedule; checkpoints with the commits.
///
/// Configuration: built-in defaults < the TOML file given with --config < CONTRAIL_* environment
/// variables (CONTRAIL_DELTA_ROOT=abfss://history@ACCOUNT.dfs.core.windows.net/contrail,
/// CONTRAIL_KAFKA__BROKERS=host:9092, CONTRAIL_BATCH__MAX_ROWS=100000). Unknown keys are errors.
#[derive(Parser)]
#[command(name = "delta-archiver")]
struct Cli {
    #[command(flatten)]
    stage: contrail_common::stage::StageArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Compact and vacuum every table once, print what was done, and exit (no archiving).
    Maintain {
        /// Vacuum files unreferenced for longer than this many seconds instead of the configured
        /// maintenance.vacuum_retention_s. Below an hour only while no archiver is writing: a
        /// running archiver's files between their write and their commit look unreferenced.
        #[arg(long)]
        vacuum_retention_s: Option<u64>,
    },
}

/// Parses the command line (`version` is `--version`'s text, given by the binary) and runs the
/// stage until it is told to stop.
pub fn main(version: &'static str) -> ExitCode {
    let cli: Cli = contrail_common::build_info::parse_args(version);
    match cli.command {
        None => contrail_common::stage::main(
            "delta-archiver",
            &cli.stage,
            |config: &DeltaArchiverConfig| &config.telemetry,
            crate::run,
        ),
        Some(Command::Maintain { vacuum_retention_s }) => contrail_common::stage::main(
            "delta-archiver",
            &cli.stage,
            |config: &DeltaArchiverConfig| &config.telemetry,
            move |config, _shutdown| crate::maintain_once(config, vacuum_retention_s),
        ),
    }
}

#[cfg(test)]
mod tests {
    /// The command line clap builds at run time, with the version the binary passes, is valid.
    #[test]
    fn the_command_line_is_consistent() {
        contrail_common::build_info::command::<super::Cli>("0.1.0 (commit c6e0edb1234a)").debug_assert();
    }
}
