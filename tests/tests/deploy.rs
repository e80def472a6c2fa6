//! The deployment files, validated with the real tools (no Docker engine or cluster here):
//! `tests/python/check_deploy.py` lints and renders the chart with helm (default, production and
//! every-option values), validates every rendered object against the Kubernetes schemas in strict
//! mode, applies our rules (non-root, seccomp, no service-account token, volumes under every path
//! a stage writes, separate token sets, NetworkPolicies), checks that the chart refuses unsafe
//! values, resolves the Dockerfile's builds with `cargo tree` (no test-only feature in an image),
//! and collects the `CONTRAIL_*` settings each stage gets; this test then starts every stage
//! binary with exactly those settings (`--print-config`), which fails on any key its config struct
//! does not have (`deny_unknown_fields`), and checks that every binary the Dockerfile builds is one
//! the workspace builds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use contrail_testkit::{test_dir, workspace_binary};

#[derive(Debug, serde::Deserialize)]
struct Report {
    problems: Vec<String>,
    env: BTreeMap<String, BTreeMap<String, Option<String>>>,
    binaries: Vec<String>,
    targets: Vec<String>,
    rendered: BTreeMap<String, usize>,
    runs: BTreeMap<String, String>,
}

fn repo_root() -> PathBuf {
    contrail_testkit::workspace_root()
}

fn check(root: &Path) -> Report {
    let script = contrail_testkit::workspace_root().join("tests/python/check_deploy.py");
    let output = std::process::Command::new("python3")
        .arg(&script)
        .arg(root)
        .output()
        .expect("python3 (PyYAML, kubernetes-validate) and helm: scripts/setup.sh installs them");
    assert!(
        output.status.success(),
        "check_deploy.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the checker's JSON")
}

/// A value of the right type for a setting whose value the chart computes at install time.
fn placeholder(key: &str) -> String {
    let value = match key {
        k if k.ends_with("LISTEN__HTTP") || k.ends_with("LISTEN__GRPC") => "0.0.0.0:1",
        "CONTRAIL_INSTANCE" => "stage-0",
        "CONTRAIL_KAFKA__EVENT_HUBS_CONNECTION_STRING" => {
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=not-a-key"
        }
        "CONTRAIL_CHECKPOINT__PEERS" => "[\"http://dedup-state-0.dedup-state-headless:9091\"]",
        "CONTRAIL_COSMOS__AUTH" => "workload_identity",
        k if k.ends_with("_MS") || k.ends_with("_S") || k.ends_with("PARTITIONS") => "1000",
        k if k.ends_with("CREATE") || k.ends_with("CREATE_IF_MISSING") || k.ends_with("COORDINATOR") => {
            "false"
        }
        k if k.ends_with("STATIC_MEMBERSHIP") => "true",
        _ => "placeholder",
    };
    value.to_owned()
}

/// Runs `stage --print-config` with `env` (and nothing else of ours); the error on failure.
fn print_config(stage: &str, env: &BTreeMap<String, Option<String>>) -> Result<String, String> {
    let mut command = std::process::Command::new(workspace_binary(stage).expect("stage binary"));
    command.arg("--print-config");
    for (key, _) in std::env::vars() {
        if key.starts_with("CONTRAIL_") {
            command.env_remove(key);
        }
    }
    for (key, value) in env {
        command.env(key, value.clone().unwrap_or_else(|| placeholder(key)));
    }
    let output = command.output().expect("run the stage");
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// Copies directory `from` to `to`, recursively.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("dir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

#[test]
fn compose_chart_and_dockerfile_use_only_settings_and_binaries_that_exist() {
    let report = check(&repo_root());
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    // The five stages and the knock-on delay extension's two deployments.
    assert_eq!(report.env.len(), 7, "{:?}", report.env.keys());
    assert_eq!(report.runs["rotation"], "dedup-state");
    assert_eq!(report.runs["cosmos-predictions"], "cosmos-writer");
    // helm rendered every values file into the objects of five stages (and more).
    for (values, objects) in &report.rendered {
        assert!(*objects >= 20, "{values} rendered {objects} objects");
    }
    assert_eq!(report.rendered.len(), 4, "{:?}", report.rendered);
    for (stage, env) in &report.env {
        // The extension is off in values.yaml and docker-compose.yml: it is seen with Event Hubs.
        assert!(
            env.contains_key("CONTRAIL_KAFKA__BROKERS")
                || env.contains_key("CONTRAIL_KAFKA__EVENT_HUBS_CONNECTION_STRING"),
            "{stage}: {env:?}"
        );
        assert!(env.contains_key("CONTRAIL_AUTH__TOKENS_FILE"), "{stage}: {env:?}");
        let effective = print_config(&report.runs[stage], env).unwrap_or_else(|error| {
            panic!("{stage} refuses the settings the deployment files give it: {error}")
        });
        // The secrets the chart passes are never printed.
        assert!(
            !effective.contains("not-a-key"),
            "{stage} printed a secret:\n{effective}"
        );
    }
    assert!(report.env["dedup-state"].contains_key("CONTRAIL_CHECKPOINT__PEERS"));
    // With the extension on, the flight deployment feeds it and delta-archiver archives it.
    let setting = |stage: &str, key: &str| report.env[stage].get(key).cloned().flatten();
    assert_eq!(
        setting("dedup-state", "CONTRAIL_TOPICS__BY_TAIL").as_deref(),
        Some("ops.flights.by-tail")
    );
    assert_eq!(
        setting("rotation", "CONTRAIL_TOPICS__RAW").as_deref(),
        Some("ops.flights.by-tail")
    );
    assert_eq!(
        setting("rotation", "CONTRAIL_PROCESSOR").as_deref(),
        Some("rotation")
    );
    assert!(report.env["rotation"].contains_key("CONTRAIL_CHECKPOINT__PEERS"));
    assert_eq!(
        setting("cosmos-predictions", "CONTRAIL_INPUT").as_deref(),
        Some("predictions")
    );
    assert_eq!(
        setting("delta-archiver", "CONTRAIL_TOPICS__PREDICTIONS").as_deref(),
        Some("ops.flights.predictions")
    );
    assert!(
        !report.env["ingest"].contains_key("CONTRAIL_COSMOS__KEY"),
        "only the Cosmos stages get the key"
    );
    for binary in &report.binaries {
        workspace_binary(binary).unwrap_or_else(|error| panic!("the Dockerfile builds {binary}: {error}"));
    }
    for target in [
        "ingest",
        "dedup-state",
        "cosmos-writer",
        "changefeed-sync",
        "delta-archiver",
        "contrail",
    ] {
        assert!(
            report.targets.iter().any(|t| t == target),
            "Dockerfile target {target}"
        );
    }
}

#[test]
fn the_checks_catch_an_unknown_setting_and_a_value_the_chart_does_not_define() {
    let root = test_dir("deploy-broken");
    let copy = |relative: &str| {
        let target = root.join(relative);
        std::fs::create_dir_all(target.parent().expect("parent")).expect("dir");
        std::fs::copy(repo_root().join(relative), &target).expect("copy");
    };
    for file in ["docker-compose.yml", ".dockerignore", "deploy/docker/Dockerfile"] {
        copy(file);
    }
    copy_tree(
        &repo_root().join("deploy/helm/contrail"),
        &root.join("deploy/helm/contrail"),
    );
    // A misspelled setting in the values, and a template reading a value nobody defined.
    let values = root.join("deploy/helm/contrail/values.yaml");
    let text = std::fs::read_to_string(&values).expect("values");
    let text = text.replacen(
        "    env:\n      CONTRAIL_TOPICS__CREATE: \"false\"\n",
        "    env:\n      CONTRAIL_TOPICS__CREATE: \"false\"\n      CONTRAIL_TOPICS__PARTITONS: \"8\"\n",
        1,
    );
    std::fs::write(&values, text).expect("write");
    let secret = root.join("deploy/helm/contrail/templates/secret.yaml");
    let text = std::fs::read_to_string(&secret).expect("template");
    std::fs::write(
        &secret,
        text.replace(".Values.secrets.cosmosKey", ".Values.secrets.cosmosKye"),
    )
    .expect("write");

    // A stage that writes its checkpoints where no volume is mounted (the defect of the first
    // chart: read-only root, the volume only with an existing claim).
    let stages = root.join("deploy/helm/contrail/templates/stages.yaml");
    let text = std::fs::read_to_string(&stages).expect("template");
    let broken: String = text
        .lines()
        .filter(|line| !line.contains("- { name: checkpoints, mountPath"))
        .map(|line| format!("{line}\n"))
        .collect();
    assert_ne!(broken, text, "the checkpoint mount was found");
    std::fs::write(&stages, broken).expect("write");

    let report = check(&root);
    for expected in [
        ".Values.secrets.cosmosKye",
        "writes CONTRAIL_CHECKPOINT_URL=/var/lib/contrail-checkpoints, which is on no writable volume",
    ] {
        assert!(
            report.problems.iter().any(|problem| problem.contains(expected)),
            "{expected}: {:#?}",
            report.problems
        );
    }
    let error = print_config("ingest", &report.env["ingest"]).expect_err("an unknown key");
    assert!(error.contains("partitons"), "the error names the key: {error}");
}

/// Every shipped binary (and the dev Cosmos endpoint) answers `--version` with its name, the
/// package version and the commit it was built from — or says the build did not record one.
#[test]
fn every_binary_names_its_version_and_commit() {
    let recorded = std::env::var("CONTRAIL_GIT_COMMIT")
        .ok()
        .filter(|commit| !commit.is_empty() && commit != "unknown");
    for binary in [
        "contrail",
        "ingest",
        "dedup-state",
        "cosmos-writer",
        "changefeed-sync",
        "delta-archiver",
        "cosmos-dev",
    ] {
        let output = std::process::Command::new(workspace_binary(binary).expect(binary))
            .arg("--version")
            .output()
            .expect("runs");
        assert!(output.status.success(), "{binary} --version");
        let text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        let prefix = format!("{binary} {} (commit ", env!("CARGO_PKG_VERSION"));
        assert!(
            text.starts_with(&prefix) && text.ends_with(')'),
            "{binary}: {text}"
        );
        // Built by the scripts (CI): the commit is the one the tests run with.
        if let Some(commit) = &recorded {
            assert!(
                text.contains(commit.as_str()),
                "{binary}: {text}, built from {commit}"
            );
        }
    }
}
