//! The crate map of docs/ARCHITECTURE.md holds: every crate's contrail dependencies (normal, build
//! and dev) are among those its layer may use, read from `cargo metadata`, and every crate of the
//! workspace is on the map.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

/// What each crate may depend on (contrail crates only), as docs/ARCHITECTURE.md's map says.
fn allowed() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    const CONTRACT: [&str; 3] = ["contrail-proto", "contrail-events", "contrail-history"];
    const DOMAIN: [&str; 4] = [
        "contrail-flight",
        "contrail-state",
        "contrail-cosmos",
        "contrail-flightdata",
    ];
    const STAGES: [&str; 6] = [
        "contrail-ingest",
        "contrail-dedup-state",
        "contrail-cosmos-writer",
        "contrail-changefeed-sync",
        "contrail-delta-archiver",
        "contrail-cosmos-dev",
    ];
    let below_stages: Vec<&str> = CONTRACT
        .iter()
        .chain(["contrail-common"].iter())
        .chain(DOMAIN.iter())
        .copied()
        .collect();
    let runtime = ["contrail-proto", "contrail-common"];
    let with_runtime = |own: &[&'static str]| -> BTreeSet<&'static str> {
        runtime.iter().chain(own.iter()).copied().collect()
    };
    let mut map = BTreeMap::new();
    map.insert("contrail-proto", BTreeSet::new());
    map.insert("contrail-events", BTreeSet::from(["contrail-proto"]));
    map.insert("contrail-history", BTreeSet::new());
    map.insert("contrail-common", BTreeSet::from(["contrail-proto"]));
    map.insert(
        "contrail-flight",
        BTreeSet::from(["contrail-proto", "contrail-events"]),
    );
    map.insert("contrail-state", BTreeSet::new());
    map.insert("contrail-cosmos", BTreeSet::from(["contrail-common"]));
    map.insert("contrail-flightdata", BTreeSet::from(["contrail-events"]));
    map.insert(
        "contrail-ingest",
        with_runtime(&["contrail-events", "contrail-flightdata"]),
    );
    // events for the plausible-time rule; flightdata as a dev-dependency only: the benchmarks
    // replay real flights through the engine (docs/BENCHMARKS.md).
    map.insert(
        "contrail-dedup-state",
        with_runtime(&[
            "contrail-flight",
            "contrail-state",
            "contrail-events",
            "contrail-flightdata",
        ]),
    );
    map.insert(
        "contrail-cosmos-writer",
        with_runtime(&["contrail-flight", "contrail-cosmos"]),
    );
    map.insert("contrail-changefeed-sync", with_runtime(&["contrail-cosmos"]));
    map.insert(
        "contrail-delta-archiver",
        with_runtime(&["contrail-history", "contrail-events"]),
    );
    map.insert("contrail-cosmos-dev", BTreeSet::new());
    map.insert(
        "contrail-cli",
        with_runtime(&[
            "contrail-history",
            "contrail-cosmos",
            "contrail-flight",
            "contrail-flightdata",
            "contrail-events",
        ]),
    );
    map.insert("contrail-testkit", below_stages.iter().copied().collect());
    let mut bench: BTreeSet<&str> = below_stages.iter().copied().collect();
    bench.extend(STAGES);
    bench.insert("contrail-testkit");
    map.insert("contrail-bench", bench);
    let mut tests: BTreeSet<&str> = below_stages.iter().copied().collect();
    tests.insert("contrail-testkit");
    map.insert("contrail-integration-tests", tests);
    map
}

fn workspace_root() -> PathBuf {
    contrail_testkit::workspace_root()
}

/// Every workspace package and its contrail dependencies (any kind).
fn actual() -> BTreeMap<String, BTreeSet<String>> {
    packages()
        .iter()
        .map(|package| {
            let name = package["name"].as_str().expect("a name").to_owned();
            let deps = package["dependencies"]
                .as_array()
                .expect("a dependencies list")
                .iter()
                .filter_map(|dep| dep["name"].as_str())
                .filter(|dep| dep.starts_with("contrail-"))
                .map(str::to_owned)
                .collect();
            (name, deps)
        })
        .collect()
}

/// The workspace's packages as `cargo metadata` describes them.
fn packages() -> Vec<serde_json::Value> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(&cargo)
        .args(["metadata", "--no-deps", "--format-version", "1", "--offline"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    metadata["packages"].as_array().expect("a packages list").clone()
}

#[test]
fn dedup_state_uses_the_flight_data_only_in_its_benchmark() {
    // The map allows dedup-state flightdata for its benchmarks: it must stay a dev-dependency,
    // out of the stage's binary (events is a dependency of its own: the plausible-time rule).
    let packages = packages();
    let dedup = packages
        .iter()
        .find(|package| package["name"] == "contrail-dedup-state")
        .expect("contrail-dedup-state");
    let beyond_dev: Vec<&str> = dedup["dependencies"]
        .as_array()
        .expect("a dependencies list")
        .iter()
        .filter(|dep| dep["name"] == "contrail-flightdata")
        .filter(|dep| dep["kind"] != "dev")
        .filter_map(|dep| dep["name"].as_str())
        .collect();
    assert!(
        beyond_dev.is_empty(),
        "dedup-state depends on {beyond_dev:?} beyond its dev-dependencies"
    );
}

#[test]
fn every_crate_depends_only_on_what_its_layer_may_use() {
    let allowed = allowed();
    let actual = actual();
    assert!(
        actual.len() >= 18,
        "cargo metadata listed only {} packages: {:?}",
        actual.len(),
        actual.keys().collect::<Vec<_>>()
    );
    let mut violations = Vec::new();
    for (crate_name, deps) in &actual {
        let Some(may) = allowed.get(crate_name.as_str()) else {
            violations.push(format!(
                "{crate_name} is not on the crate map (docs/ARCHITECTURE.md and this test)"
            ));
            continue;
        };
        for dep in deps {
            if !may.contains(dep.as_str()) {
                violations.push(format!("{crate_name} → {dep} is not allowed by its layer"));
            }
        }
    }
    for listed in allowed.keys() {
        if !actual.contains_key(*listed) {
            violations.push(format!(
                "{listed} is on the map but not in the workspace (remove it from the map)"
            ));
        }
    }
    assert!(violations.is_empty(), "layering: {violations:#?}");
}

#[test]
fn the_architecture_map_names_every_crate() {
    let text =
        std::fs::read_to_string(workspace_root().join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md");
    let missing: Vec<String> = actual()
        .into_keys()
        .filter(|name| {
            !text
                .lines()
                .any(|line| line.split_whitespace().any(|word| word == name))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "crates missing from docs/ARCHITECTURE.md's map: {missing:?}"
    );
}

#[test]
fn the_rule_itself_rejects_a_stage_depending_on_another_stage() {
    // The map is not vacuous: a stage using another stage, or the pure engine using anything, is
    // refused.
    let allowed = allowed();
    assert!(!allowed["contrail-cosmos-writer"].contains("contrail-dedup-state"));
    assert!(!allowed["contrail-ingest"].contains("contrail-delta-archiver"));
    assert!(allowed["contrail-state"].is_empty());
    assert!(!allowed["contrail-integration-tests"].contains("contrail-dedup-state"));
    assert!(!allowed["contrail-common"].contains("contrail-flight"));
}
