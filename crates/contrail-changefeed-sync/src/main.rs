//! `changefeed-sync`: the Cosmos DB change feed onto `ops.flights.changes`. See the
//! `contrail_changefeed_sync` crate docs.

fn main() -> std::process::ExitCode {
    contrail_changefeed_sync::cli::main(contrail_common::version_text!())
}
