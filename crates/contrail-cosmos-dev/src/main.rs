//! `cosmos-dev`: a local Azure Cosmos DB endpoint for development and tests. See the crate's
//! library docs ([`contrail_cosmos_dev`]).

use clap::Parser;

/// A local Azure Cosmos DB endpoint for development and tests (never for production).
///
/// Serves Microsoft's in-memory Cosmos DB emulator (from azure_data_cosmos_driver) over plain HTTP
/// on a loopback address, so separate processes using the ordinary azure_data_cosmos client share
/// one account: point them at http://127.0.0.1:PORT/ with any key (the endpoint does not check
/// signatures). State lives in memory only and is gone when the process exits.
///
/// Beyond the Cosmos REST API it answers GET /_dev/healthz, GET /_dev/stats (request counts) and
/// POST /_dev/split?db=DB&coll=COLL&partition=N (splits a physical partition in two and answers
/// when done, to exercise feed-range splits).
#[derive(Parser)]
#[command(name = "cosmos-dev", version = version_text())]
struct Cli {
    #[command(flatten)]
    options: contrail_cosmos_dev::Options,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match contrail_cosmos_dev::serve(cli.options).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cosmos-dev: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `--version` as the stages print it (`contrail_common::build_info`), without depending on the
/// stages' crates: the package version and the commit from `CONTRAIL_GIT_COMMIT` at build time.
fn version_text() -> &'static str {
    let version = env!("CARGO_PKG_VERSION");
    let text = match option_env!("CONTRAIL_GIT_COMMIT")
        .filter(|commit| !commit.is_empty() && *commit != "unknown")
    {
        Some(commit) => format!("{version} (commit {commit})"),
        None => format!("{version} (commit not recorded: built without CONTRAIL_GIT_COMMIT)"),
    };
    Box::leak(text.into_boxed_str())
}
