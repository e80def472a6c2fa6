//! `cosmos-dev`: a local Azure Cosmos DB endpoint for development and tests. See the crate's
//! library docs ([`contrail_cosmos_dev`]).

fn main() -> std::process::ExitCode {
    contrail_cosmos_dev::cli::main(version_text())
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
