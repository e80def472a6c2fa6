//! What `--version` prints: the package version and the git commit the binary was built from.
//!
//! The commit comes from `CONTRAIL_GIT_COMMIT` at build time (`scripts/setup.sh` exports it from
//! `git describe`, the Dockerfile takes it as a build argument). Each binary reads it with
//! `option_env!` in its own `main.rs`, so a new commit relinks the binaries and rebuilds no
//! library.

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
