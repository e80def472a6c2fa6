//! What `--version` prints: the package version and the git commit the binary was built from.
//!
//! The commit comes from `CONTRAIL_GIT_COMMIT` at build time (`scripts/setup.sh` exports it from
//! `git describe`, the Dockerfile takes it as a build argument). Each binary reads it with
//! `option_env!` in its own `main.rs` and passes it to its library's command line
//! ([`parse_args`]); `main.rs` holds nothing else, so a new commit recompiles a few lines per binary
//! and relinks them, and rebuilds no library (cargo recompiles a whole crate when an environment
//! variable it reads changes, and every crate that depends on it).

/// `VERSION (commit COMMIT)`, or a note that the build did not record the commit.
pub fn version_text(version: &'static str, commit: Option<&'static str>) -> &'static str {
    let text = match commit
        .map(str::trim)
        .filter(|commit| !commit.is_empty() && *commit != "unknown")
    {
        Some(commit) => format!("{version} (commit {commit})"),
        None => format!("{version} (commit not recorded: built without CONTRAIL_GIT_COMMIT)"),
    };
    // Once per process, for clap's `--version`.
    Box::leak(text.into_boxed_str())
}

/// Parses the command line into `P`, with `version` as the text `--version` prints: the command
/// line's definition lives in a library, the commit only in the binary.
pub fn parse_args<P: clap::Parser>(version: &'static str) -> P {
    let mut command = command::<P>(version);
    let matches = command.get_matches_mut();
    P::from_arg_matches(&matches).unwrap_or_else(|error| error.format(&mut command).exit())
}

/// `P`'s command with `version` as its `--version` text (and its subcommands', where `P` propagates
/// the version): what a binary whose command line lives in a library uses instead of
/// `CommandFactory::command` (e.g. for shell completions), which lacks the version.
pub fn command<P: clap::CommandFactory>(version: &'static str) -> clap::Command {
    P::command().version(version)
}

/// The `--version` text of the binary whose `main.rs` expands it.
#[macro_export]
macro_rules! version_text {
    () => {
        $crate::build_info::version_text(env!("CARGO_PKG_VERSION"), option_env!("CONTRAIL_GIT_COMMIT"))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    #[command(name = "stage", propagate_version = true)]
    struct Cli {
        #[command(subcommand)]
        command: Option<Sub>,
    }

    #[derive(clap::Subcommand)]
    enum Sub {
        /// A subcommand.
        Maintain,
    }

    /// What the binary passes is what `--version` prints, on the command and its subcommands.
    #[test]
    fn the_version_text_given_at_run_time_is_what_version_prints() {
        for args in [vec!["stage", "--version"], vec!["stage", "maintain", "--version"]] {
            let error = command::<Cli>("0.1.0 (commit c6e0edb1234a)")
                .try_get_matches_from(&args)
                .expect_err("--version stops parsing");
            assert_eq!(error.kind(), clap::error::ErrorKind::DisplayVersion);
            assert!(
                error.to_string().ends_with("0.1.0 (commit c6e0edb1234a)\n"),
                "{args:?} printed {:?}",
                error.to_string()
            );
        }
        let parsed = command::<Cli>("0.1.0").try_get_matches_from(["stage", "maintain"]);
        let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&parsed.expect("parses")).expect("matches");
        assert!(matches!(cli.command, Some(Sub::Maintain)));
    }

    #[test]
    fn the_version_names_the_commit_or_says_it_is_missing() {
        assert_eq!(
            version_text("0.1.0", Some("c6e0edb1234a")),
            "0.1.0 (commit c6e0edb1234a)"
        );
        assert_eq!(
            version_text("0.1.0", Some("c6e0edb1234a-dirty")),
            "0.1.0 (commit c6e0edb1234a-dirty)"
        );
        for missing in [None, Some(""), Some("unknown")] {
            assert_eq!(
                version_text("0.1.0", missing),
                "0.1.0 (commit not recorded: built without CONTRAIL_GIT_COMMIT)"
            );
        }
    }
}
