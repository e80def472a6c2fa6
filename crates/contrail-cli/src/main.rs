//! `contrail`: the command-line tool of the contrail platform.

/// mimalloc: ingest is allocation-heavy (JSON values per record); see docs/BENCHMARKS.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod replay;

/// contrail — real-time airline-operations data platform.
///
/// Today this tool replays real flights (nycflights13: all 336,776 flights that left New York in
/// 2013) into a running ingest stage. `contrail up`, `contrail admin` and `contrail flights` come
/// with the later stages.
#[derive(Parser)]
#[command(name = "contrail", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Turn nycflights13 into operational events (with seeded duplicates, disorder and stragglers)
    /// and post them to ingest, or write them as NDJSON.
    Replay(replay::ReplayArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("contrail: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Replay(args) => replay::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("contrail: {error:#}");
            ExitCode::FAILURE
        }
    }
}
