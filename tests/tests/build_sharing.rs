//! `scripts/up.sh` builds only the binaries (`cargo build --workspace --bins`); `scripts/test.sh`
//! builds every target on top of them. That reuses the binaries' artifacts only if both builds
//! resolve the same features for every package: a feature that only a dev-dependency enables
//! (resolver 2 leaves dev-dependencies out of a `--bins` build) gives that package, and every
//! package above it, a second build — minutes of recompiling tokio, serde, tonic and the stages.
//! And the packages the dev profile builds at opt-level 0 to save build time run only while
//! building: none of them is linked into a binary the tests and `contrail up` run.
//! Every clone of the same sources shares one build (scripts/tree_mtimes.py): nothing compiled
//! may carry the path of the clone it was compiled in. The images' build of the stages (and CI's
//! lint of it) differs from the workspace's only in the test-only features, so it checks a few
//! crates again, not every dependency.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

fn workspace_root() -> PathBuf {
    contrail_testkit::workspace_root()
}

/// Each package (`name version`) and its features as `cargo tree` resolves them, with (`--edges
/// normal,build,dev`, what `--all-targets` builds) or without (`--edges normal,build`, what
/// `--bins` builds) dev-dependencies.
fn resolved(edges: &str) -> BTreeMap<String, BTreeSet<String>> {
    resolved_for(&["--workspace"], edges)
}

/// The same for the packages and feature flags in `selection` (`-p …`, `--no-default-features`).
fn resolved_for(selection: &[&str], edges: &str) -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(&cargo)
        .args(["tree", "--offline", "--locked", "--prefix", "none"])
        .args(selection)
        .args(["--edges", edges, "--format", "{p}|{f}"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo tree runs");
    assert!(
        output.status.success(),
        "cargo tree --edges {edges} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    parse(&String::from_utf8_lossy(&output.stdout))
}

/// Lines `name vX.Y.Z (source)?|feature,feature` → package → features (`(*)` marks repeats).
fn parse(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut packages: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let (package, features) = line.split_once('|').unwrap_or((line, ""));
        let mut words = package.split_whitespace();
        let id = format!(
            "{} {}",
            words.next().unwrap_or_default(),
            words.next().unwrap_or_default()
        );
        let features = features.trim().trim_end_matches("(*)").trim();
        packages.entry(id).or_default().extend(
            features
                .split(',')
                .map(str::trim)
                .filter(|feature| !feature.is_empty())
                .map(str::to_owned),
        );
    }
    packages
}

#[test]
fn the_binaries_build_resolves_the_same_features_as_the_tests_build() {
    let bins = resolved("normal,build");
    let all = resolved("normal,build,dev");
    assert!(
        bins.len() > 300 && bins.keys().any(|id| id.starts_with("tokio ")),
        "cargo tree listed only {} packages",
        bins.len()
    );
    let differing: Vec<String> = bins
        .iter()
        .filter_map(|(id, features)| {
            let with_dev = all.get(id)?;
            (with_dev != features).then(|| {
                let only_with_dev: Vec<&String> = with_dev.difference(features).collect();
                let only_without: Vec<&String> = features.difference(with_dev).collect();
                format!("{id}: only with dev-dependencies {only_with_dev:?}, only without {only_without:?}")
            })
        })
        .collect();
    assert!(
        differing.is_empty(),
        "these packages would build twice (once for `--bins`, once for `--all-targets`); name the \
         features in the workspace's [workspace.dependencies]: {differing:#?}"
    );
}

/// The arguments of each `cargo build` in the Dockerfile (continuation lines joined), and of CI's
/// lint of the images' feature sets (`cargo clippy … --bins`, before the `--` of clippy's flags).
fn invocations(file: &str, command: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(workspace_root().join(file)).expect(file);
    let joined = text.replace("\\\n", " ");
    joined
        .lines()
        .filter_map(|line| line.split_once(command).map(|(_, rest)| rest))
        .map(|rest| {
            let rest = rest.split("&&").next().unwrap_or_default();
            let rest = rest.split(" -- ").next().unwrap_or_default();
            rest.split_whitespace().map(str::to_owned).collect()
        })
        .collect()
}

/// `-p` packages and feature flags of an invocation (what `cargo tree` needs to resolve it).
fn selection(args: &[String]) -> Vec<String> {
    let mut selection = Vec::new();
    for (index, arg) in args.iter().enumerate() {
        if arg == "-p" {
            selection.push(arg.clone());
            selection.push(args.get(index + 1).cloned().unwrap_or_default());
        }
        if arg == "--no-default-features" || arg == "--all-features" {
            selection.push(arg.clone());
        }
    }
    selection
}

/// The images' build of the stages (and CI's lint of it) differs from the workspace build only in
/// the test-only features: every other dependency resolves the same features, so it reuses the
/// workspace's artifacts instead of building (or, for the lint, checking) a second time.
#[test]
fn the_images_build_resolves_the_workspace_features_but_the_test_only_ones() {
    let all = resolved("normal,build,dev");
    let builds = invocations("deploy/docker/Dockerfile", "cargo build ");
    let stages: Vec<Vec<String>> = builds
        .iter()
        .map(|args| selection(args))
        .filter(|selection| !selection.iter().any(|arg| arg == "contrail-cosmos-dev"))
        .collect();
    assert_eq!(
        stages.len(),
        1,
        "the Dockerfile should build the stages in one invocation (and cosmos-dev in its own): {builds:?}"
    );
    let lints: Vec<Vec<String>> = invocations(".ci/run", "cargo clippy ")
        .iter()
        .map(|args| selection(args))
        .filter(|selection| selection.iter().any(|arg| arg == "--no-default-features"))
        .collect();
    assert_eq!(
        lints, stages,
        "CI lints another set of packages or flags than the Dockerfile builds"
    );
    // Test-only features (tests/python/check_deploy.py keeps them out of the images), and the
    // driver's `default`, which only cosmos-dev asks for.
    let test_only = ["fault_injection", "__internal_in_memory_emulator", "default"];
    let selection: Vec<&str> = stages[0].iter().map(String::as_str).collect();
    let image = resolved_for(&selection, "normal,build");
    let differing: Vec<String> = image
        .iter()
        .filter(|(id, _)| !id.starts_with("contrail"))
        .filter_map(|(id, features)| {
            let workspace = all.get(id).filter(|workspace| *workspace != features)?;
            let only_in_workspace: Vec<&String> = workspace.difference(features).collect();
            let only_in_image: Vec<&String> = features.difference(workspace).collect();
            let allowed = only_in_image.is_empty()
                && id.starts_with("azure_data_cosmos")
                && only_in_workspace
                    .iter()
                    .all(|feature| test_only.contains(&feature.as_str()));
            (!allowed).then(|| {
                format!(
                    "{id}: only in the workspace {only_in_workspace:?}, only in the images {only_in_image:?}"
                )
            })
        })
        .collect();
    assert!(
        image.len() > 300 && differing.is_empty(),
        "the images' build ({selection:?}, {} packages) would build these packages a second time; \
         name their features in [workspace.dependencies] (as the feature pins there): {differing:#?}",
        image.len()
    );
}

/// The packages the workspace's `[profile.dev.package]` table sets to opt-level 0
/// (`name.opt-level = 0` lines).
fn at_opt_level_0() -> BTreeSet<String> {
    let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).expect("Cargo.toml");
    manifest
        .lines()
        .filter_map(|line| line.trim().strip_suffix(".opt-level = 0"))
        .map(|name| name.trim_matches('"').to_owned())
        .collect()
}

#[test]
fn packages_at_opt_level_0_only_run_while_building() {
    let slow = at_opt_level_0();
    assert!(
        slow.contains("syn"),
        "Cargo.toml sets no build-time package to opt-level 0 (read {slow:?})"
    );
    // What the binaries and the tests link: every edge but build scripts and proc macros.
    let linked: BTreeSet<String> = resolved("normal,dev,no-proc-macro")
        .into_keys()
        .filter_map(|id| id.split_whitespace().next().map(str::to_owned))
        .collect();
    let built_everywhere: BTreeSet<String> = resolved("normal,build,dev")
        .into_keys()
        .filter_map(|id| id.split_whitespace().next().map(str::to_owned))
        .collect();
    let unknown: Vec<&String> = slow.difference(&built_everywhere).collect();
    assert!(
        unknown.is_empty(),
        "Cargo.toml names packages the workspace does not build: {unknown:?}"
    );
    let linked_slow: Vec<&String> = slow.intersection(&linked).collect();
    assert!(
        linked_slow.is_empty(),
        "these packages are linked into binaries but built at opt-level 0 in the dev profile \
         (remove them from that list in Cargo.toml): {linked_slow:?}"
    );
}

#[test]
fn the_feature_list_parser_reads_what_cargo_tree_prints() {
    let parsed = parse(
        "serde v1.0.229|alloc,default,derive,std\n\
         contrail-proto v0.1.0 (/work/crates/contrail-proto)|\n\
         serde v1.0.229|alloc,default,derive,std (*)\n",
    );
    assert_eq!(parsed.len(), 2);
    assert_eq!(
        parsed["serde v1.0.229"],
        BTreeSet::from(["alloc", "default", "derive", "std"].map(str::to_owned))
    );
    assert!(parsed["contrail-proto v0.1.0"].is_empty());
}

/// A clone reuses what another clone of the same sources compiled (scripts/tree_mtimes.py gives
/// unchanged files their recorded times), and cargo does not rebuild a crate whose directory moved:
/// `env!("CARGO_MANIFEST_DIR")` would bake in the first clone's path, maybe deleted since. The
/// clone is found at run time instead (`contrail_testkit::workspace_root`, the `CARGO_MANIFEST_DIR`
/// cargo sets when it runs a test).
#[test]
fn no_source_compiles_in_the_path_of_its_clone() {
    let root = workspace_root();
    let listed = Command::new("git")
        .args(["ls-files", "-z", "--", "*.rs"])
        .current_dir(&root)
        .output()
        .expect("git ls-files");
    assert!(listed.status.success(), "git ls-files: {listed:?}");
    let forbidden = concat!("env!(", "\"CARGO_MANIFEST_DIR\")");
    let mut offenders = Vec::new();
    let mut scanned = 0;
    for file in String::from_utf8_lossy(&listed.stdout)
        .split('\0')
        .filter(|f| !f.is_empty())
    {
        let text = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        scanned += 1;
        offenders.extend(
            text.lines()
                .enumerate()
                .filter(|(_, line)| line.contains(forbidden) && !line.trim_start().starts_with("//"))
                .map(|(number, line)| format!("{file}:{}: {}", number + 1, line.trim())),
        );
    }
    assert!(
        scanned > 100,
        "only {scanned} Rust files listed under {}",
        root.display()
    );
    assert!(
        offenders.is_empty(),
        "compiled-in clone paths:\n{}",
        offenders.join("\n")
    );
}
