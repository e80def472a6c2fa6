//! The `changefeed-sync` command line: what `--help` says, and the process's `main` (the binary's
//! `main.rs` only passes the version text, so a new commit relinks it and recompiles nothing else).

use std::process::ExitCode;

use clap::Parser;

use crate::ChangefeedSyncConfig;

/// Reads the change feed of the Cosmos DB container `flights` and publishes every change as a
/// contrail.v1.ServingChange to ops.flights.changes, keyed by flight key. Progress is kept in the
/// `leases` container: one lease per feed range with its owner, renewal time and continuation
/// token, written only after the broker acknowledged the changes before it. Instances share the
/// leases evenly; a lease whose owner stops renewing is taken over.
///
/// Configuration: built-in defaults < the TOML file given with --config < CONTRAIL_* environment
/// variables (CONTRAIL_COSMOS__ENDPOINT, CONTRAIL_COSMOS__KEY, CONTRAIL_KAFKA__BROKERS). Unknown keys
/// are errors.
#[derive(Parser)]
#[command(name = "changefeed-sync")]
struct Cli {
    #[command(flatten)]
    stage: contrail_common::stage::StageArgs,
}

/// Parses the command line (`version` is `--version`'s text, given by the binary) and runs the
/// stage until it is told to stop.
pub fn main(version: &'static str) -> ExitCode {
    let cli: Cli = contrail_common::build_info::parse_args(version);
    contrail_common::stage::main(
        "changefeed-sync",
        &cli.stage,
        |config: &ChangefeedSyncConfig| &config.telemetry,
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
