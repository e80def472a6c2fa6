//! `cosmos-writer`: curated flight states into Azure Cosmos DB. See the `contrail_cosmos_writer`
//! crate docs.

use std::process::ExitCode;

use clap::Parser;
use contrail_cosmos_writer::CosmosWriterConfig;

/// Writes ops.flights.curated into the Cosmos DB container `flights` (one document per flight,
/// id = flight key). Within a batch only the newest version of each flight is written; a document
/// is never replaced by a lower version (read + If-Match replace, or create), so redeliveries and
/// replays are harmless. Kafka offsets are committed only after Cosmos DB acknowledged every write
/// before them; 429/503/408 are retried; undecodable records go to the dead-letter topic.
///
/// Configuration: built-in defaults < the TOML file given with --config < CONTRAIL_* environment
/// variables (CONTRAIL_COSMOS__ENDPOINT=https://ACCOUNT.documents.azure.com:443/,
/// CONTRAIL_COSMOS__KEY=…, CONTRAIL_KAFKA__BROKERS=host:9092). Unknown keys are errors.
#[derive(Parser)]
#[command(name = "cosmos-writer", version)]
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
