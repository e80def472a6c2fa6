//! The `cosmos-writer` command line: what `--help` says, and the process's `main` (the binary's
//! `main.rs` only passes the version text, so a new commit relinks it and recompiles nothing else).

use std::process::ExitCode;

use clap::Parser;

use crate::CosmosWriterConfig;

/// Writes ops.flights.curated into the Cosmos DB container `flights` (one document per flight,
/// id = flight key). Records are written as they arrive, up to batch.concurrency writes in flight
/// (one per flight); versions of a flight that arrive while it waits or is being written coalesce
/// to the newest. A document is never replaced by a lower version (read + If-Match replace, or
/// create), so redeliveries and replays are harmless. Each partition's offsets are committed (every
/// batch.commit_interval_ms) only up to its first record Cosmos DB has not acknowledged; 429/503/408
/// are retried; undecodable records go to the dead-letter topic.
///
/// With input = "predictions" (CONTRAIL_INPUT=predictions) a second deployment sets the rotation
/// processor's predictions (ops.flights.predictions) on the same documents — predictedOut,
/// knockOnFrom, … under their own guard predictionVersion — in the consumer group
/// contrail-cosmos-predictions unless group.id is set (--print-config shows the configured one).
///
/// Configuration: built-in defaults < the TOML file given with --config < CONTRAIL_* environment
/// variables (CONTRAIL_COSMOS__ENDPOINT=https://ACCOUNT.documents.azure.com:443/,
/// CONTRAIL_COSMOS__KEY=…, CONTRAIL_KAFKA__BROKERS=host:9092). Unknown keys are errors.
#[derive(Parser)]
#[command(name = "cosmos-writer")]
struct Cli {
    #[command(flatten)]
    stage: contrail_common::stage::StageArgs,
}

/// Parses the command line (`version` is `--version`'s text, given by the binary) and runs the
/// stage until it is told to stop.
pub fn main(version: &'static str) -> ExitCode {
    let cli: Cli = contrail_common::build_info::parse_args(version);
    contrail_common::stage::main(
        "cosmos-writer",
        &cli.stage,
        |config: &CosmosWriterConfig| &config.telemetry,
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
