//! `cosmos-writer`: curated flight states into Azure Cosmos DB. See the `contrail_cosmos_writer`
//! crate docs.

use std::process::ExitCode;

use clap::Parser;
use contrail_cosmos_writer::CosmosWriterConfig;

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
#[command(name = "cosmos-writer", version = contrail_common::version_text!())]
struct Cli {
    #[command(flatten)]
    stage: contrail_common::stage::StageArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    contrail_common::stage::main(
        "cosmos-writer",
        &cli.stage,
        |config: &CosmosWriterConfig| &config.telemetry,
        contrail_cosmos_writer::run,
    )
}
