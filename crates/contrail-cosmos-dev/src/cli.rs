//! The `cosmos-dev` command line: what `--help` says, and the process's `main` (the binary's
//! `main.rs` only passes the version text, so a new commit relinks it and recompiles nothing else).

use clap::{CommandFactory, FromArgMatches, Parser};

/// A local Azure Cosmos DB endpoint for development and tests (never for production).
///
/// Answers the Cosmos DB REST API over plain HTTP on a loopback address, so separate processes
/// using the ordinary azure_data_cosmos client share one account: point them at
/// http://127.0.0.1:PORT/ with any key, or, with `--key`, signed with that key as the service
/// checks. The default engine is cosmos-dev's own store (a change feed poll costs the same however
/// many documents it holds); `--engine emulator` serves Microsoft's in-memory emulator instead.
/// State lives in memory only and is gone when the process exits.
///
/// Beyond the Cosmos REST API it answers GET /_dev/healthz, GET /_dev/stats (request counts),
/// POST /_dev/split?db=DB&coll=COLL&partition=N (splits a physical partition in two and answers
/// when done, to exercise feed-range splits), POST /_dev/key (body: a new base64 key, as after
/// regenerating it in Azure) and POST /_dev/throttle?requests=N&retryAfterMs=M (the next N
/// document requests are answered 429).
#[derive(Parser)]
#[command(name = "cosmos-dev")]
struct Cli {
    #[command(flatten)]
    options: crate::Options,
}

/// Parses the command line (`version` is `--version`'s text, given by the binary) and serves until
/// the process is stopped.
pub fn main(version: &'static str) -> std::process::ExitCode {
    let mut command = Cli::command().version(version);
    let matches = command.get_matches_mut();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.format(&mut command).exit());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cosmos-dev: cannot start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(crate::serve(cli.options)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cosmos-dev: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// The command line clap builds at run time, with the version the binary passes, is valid.
    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command()
            .version("0.1.0 (commit c6e0edb1234a)")
            .debug_assert();
    }
}
