//! The stage catalog (`contrail_common::topology`: every stage's name, binary and default ports)
//! is what the CLI, `contrail up` and `contrail admin` read; the deployment files spell the same
//! stages out in YAML. This test reads the chart's values and the compose file (PyYAML, which
//! `scripts/setup.sh` installs) and fails on any stage, binary or port that disagrees.

use std::collections::BTreeMap;

use contrail_common::topology::{ROTATION_STAGES, STAGES, StageSpec};
use serde_json::Value;

/// The YAML file at `path` (from the workspace root) as JSON.
fn yaml(path: &str) -> Value {
    let file = contrail_testkit::workspace_root().join(path);
    let output = std::process::Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
        ])
        .arg(&file)
        .output()
        .expect("python3 with PyYAML: scripts/setup.sh installs it");
    assert!(
        output.status.success(),
        "reading {}: {}",
        file.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON")
}

/// (binary, http, grpc) of each stage the catalog names.
fn catalog() -> BTreeMap<String, (String, u64, u64)> {
    STAGES
        .iter()
        .chain(ROTATION_STAGES.iter())
        .map(
            |StageSpec {
                 name,
                 binary,
                 http,
                 grpc,
             }| {
                (
                    (*name).to_owned(),
                    ((*binary).to_owned(), u64::from(*http), u64::from(*grpc)),
                )
            },
        )
        .collect()
}

/// Where the chart's `stages` values disagree with `catalog`.
fn chart_problems(values: &Value, catalog: &BTreeMap<String, (String, u64, u64)>) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(stages) = values["stages"].as_object() else {
        return vec!["values.yaml has no `stages` map".to_owned()];
    };
    for name in stages.keys().filter(|name| !catalog.contains_key(*name)) {
        problems.push(format!("the chart's stage {name} is not in the catalog"));
    }
    for (name, (binary, http, grpc)) in catalog {
        let Some(stage) = stages.get(name) else {
            problems.push(format!("the catalog's stage {name} is not in the chart"));
            continue;
        };
        let found = (
            stage["binary"].as_str().unwrap_or_default(),
            stage["ports"]["http"].as_u64().unwrap_or_default(),
            stage["ports"]["grpc"].as_u64().unwrap_or_default(),
        );
        if found != (binary.as_str(), *http, *grpc) {
            problems.push(format!(
                "{name}: the chart says binary {} ports {}/{}, the catalog {binary} {http}/{grpc}",
                found.0, found.1, found.2
            ));
        }
    }
    problems
}

/// Where the compose file's stage services disagree with the catalog's pipeline stages (compose
/// runs the five stages, not the extension): build target, listen ports, published ports.
fn compose_problems(compose: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for StageSpec {
        name,
        binary,
        http,
        grpc,
    } in STAGES
    {
        let service = &compose["services"][name];
        if service.is_null() {
            problems.push(format!("compose has no service {name}"));
            continue;
        }
        let environment = &service["environment"];
        let expected = [
            (
                "build target",
                service["build"]["target"].as_str().map(str::to_owned),
                binary.to_owned(),
            ),
            (
                "CONTRAIL_LISTEN__HTTP",
                environment["CONTRAIL_LISTEN__HTTP"].as_str().map(str::to_owned),
                format!("0.0.0.0:{http}"),
            ),
            (
                "CONTRAIL_LISTEN__GRPC",
                environment["CONTRAIL_LISTEN__GRPC"].as_str().map(str::to_owned),
                format!("0.0.0.0:{grpc}"),
            ),
            (
                "ports",
                service["ports"].as_array().map(|ports| {
                    ports
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(",")
                }),
                format!("{http}:{http},{grpc}:{grpc}"),
            ),
        ];
        for (what, found, expected) in expected {
            if found.as_deref() != Some(expected.as_str()) {
                problems.push(format!(
                    "compose {name}: {what} is {found:?}, the catalog says {expected}"
                ));
            }
        }
    }
    problems
}

#[test]
fn the_chart_and_compose_run_the_stages_of_the_catalog_on_its_ports() {
    let catalog = catalog();
    let mut problems = chart_problems(&yaml("deploy/helm/contrail/values.yaml"), &catalog);
    problems.extend(compose_problems(&yaml("docker-compose.yml")));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The checks fail on a port moved, a stage missing and a stage the catalog does not know.
#[test]
fn the_checks_catch_a_moved_port_a_missing_stage_and_an_unknown_one() {
    let catalog = catalog();
    let mut values = yaml("deploy/helm/contrail/values.yaml");
    values["stages"]["cosmos-writer"]["ports"]["grpc"] = Value::from(9092);
    let stages = values["stages"].as_object_mut().expect("stages");
    stages.remove("rotation");
    stages.insert("router".to_owned(), serde_json::json!({"binary": "router"}));
    let problems = chart_problems(&values, &catalog).join("\n");
    for expected in [
        "cosmos-writer: the chart says binary cosmos-writer ports 8082/9092",
        "the catalog's stage rotation is not in the chart",
        "the chart's stage router is not in the catalog",
    ] {
        assert!(problems.contains(expected), "{expected} not in:\n{problems}");
    }
    let mut compose = yaml("docker-compose.yml");
    compose["services"]["delta-archiver"]["environment"]["CONTRAIL_LISTEN__GRPC"] =
        Value::from("0.0.0.0:9094");
    let problems = compose_problems(&compose).join("\n");
    assert!(
        problems.contains("compose delta-archiver: CONTRAIL_LISTEN__GRPC is Some(\"0.0.0.0:9094\")"),
        "{problems}"
    );
}
