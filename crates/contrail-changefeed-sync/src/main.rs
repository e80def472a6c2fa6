//! `changefeed-sync`: the Cosmos DB change feed onto `ops.flights.changes`. See the
//! `contrail_changefeed_sync` crate docs.

use std::process::ExitCode;

use clap::Parser;
use contrail_changefeed_sync::ChangefeedSyncConfig;

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
#[command(name = "changefeed-sync", version = contrail_common::version_text!())]
struct Cli {
    #[command(flatten)]
    stage: contrail_common::stage::StageArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    contrail_common::stage::main(
        "changefeed-sync",
        &cli.stage,
        |config: &ChangefeedSyncConfig| &config.telemetry,
        contrail_changefeed_sync::run,
    )
}
