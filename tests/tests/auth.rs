//! Authentication fails closed: every stage that listens beyond loopback refuses to start without
//! tokens (and says which setting to give), unless authentication is explicitly disabled; ingest
//! wants the operators' tokens apart from the producers'.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use contrail_testkit::{
    StageProcess, answers_200, free_port, shared_broker, test_dir, unique, workspace_binary,
};

const STAGES: [&str; 5] = [
    "ingest",
    "dedup-state",
    "cosmos-writer",
    "changefeed-sync",
    "delta-archiver",
];

/// Runs `stage` with `env` (and no other CONTRAIL_* setting) until it exits; its status and output.
fn run_to_exit(stage: &str, env: &[(&str, String)]) -> (Option<i32>, String) {
    let dir = test_dir(&format!("auth-{stage}"));
    let mut command = Command::new(workspace_binary(stage).expect("stage binary"));
    for (key, _) in std::env::vars() {
        if key.starts_with("CONTRAIL_") {
            command.env_remove(key);
        }
    }
    // Each stage takes only its own settings (unknown variables are refused).
    let own: Vec<(&str, String)> = match stage {
        "ingest" => vec![("CONTRAIL_CURSOR_DIR", dir.join("cursors").display().to_string())],
        "dedup-state" => vec![
            ("CONTRAIL_STATE_DIR", dir.join("state").display().to_string()),
            (
                "CONTRAIL_CHECKPOINT_URL",
                dir.join("checkpoints").display().to_string(),
            ),
        ],
        "delta-archiver" => vec![("CONTRAIL_DELTA_ROOT", dir.join("delta").display().to_string())],
        // The Cosmos stages check their config (a key) before their tokens.
        _ => vec![("CONTRAIL_COSMOS__KEY", "not-a-key".to_owned())],
    };
    command
        .current_dir(&dir)
        .env("CONTRAIL_KAFKA__BROKERS", "127.0.0.1:1")
        .envs(own)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("spawn");
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let output = child.wait_with_output().expect("output");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            return (status.code(), text);
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let output = child.wait_with_output().expect("output");
            return (
                None,
                format!(
                    "still running after 30 s:\n{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn beyond_loopback() -> Vec<(&'static str, String)> {
    vec![
        ("CONTRAIL_LISTEN__HTTP", format!("0.0.0.0:{}", free_port())),
        ("CONTRAIL_LISTEN__GRPC", format!("0.0.0.0:{}", free_port())),
    ]
}

#[test]
fn every_stage_listening_beyond_loopback_refuses_to_start_without_tokens() {
    for stage in STAGES {
        let (status, output) = run_to_exit(stage, &beyond_loopback());
        assert_eq!(status, Some(1), "{stage} must refuse to start:\n{output}");
        assert!(
            output.contains("beyond loopback") && output.contains("CONTRAIL_AUTH__TOKENS_FILE"),
            "{stage}'s error names the cause and the setting:\n{output}"
        );
        assert!(
            output.contains("0.0.0.0:"),
            "{stage} names the address:\n{output}"
        );
    }
    // ingest with only the producers' tokens: the admin API would be open, so it refuses too.
    let mut env = beyond_loopback();
    env.push(("CONTRAIL_AUTH__TOKENS", "[\"producer-token\"]".to_owned()));
    let (status, output) = run_to_exit("ingest", &env);
    assert_eq!(status, Some(1), "{output}");
    assert!(
        output.contains("admin_auth") && output.contains("CONTRAIL_ADMIN_AUTH__TOKENS_FILE"),
        "{output}"
    );
    // One token in both sets: a producer could pause ingest, refused.
    let mut env = beyond_loopback();
    env.push(("CONTRAIL_AUTH__TOKENS", "[\"same-token\"]".to_owned()));
    env.push((
        "CONTRAIL_ADMIN_AUTH__TOKENS",
        "[\"other\", \"same-token\"]".to_owned(),
    ));
    let (status, output) = run_to_exit("ingest", &env);
    assert_eq!(status, Some(1), "{output}");
    assert!(output.contains("auth and admin_auth share a token"), "{output}");
    // Tokens and `disabled` at once is a contradiction, refused.
    let mut env = beyond_loopback();
    env.push(("CONTRAIL_AUTH__TOKENS", "[\"operator-token\"]".to_owned()));
    env.push(("CONTRAIL_AUTH__DISABLED", "true".to_owned()));
    let (status, output) = run_to_exit("cosmos-writer", &env);
    assert_eq!(status, Some(1), "{output}");
    assert!(
        output.contains("auth.disabled = true while auth tokens"),
        "{output}"
    );
    // An empty tokens file is no tokens.
    let empty = test_dir("auth-empty-tokens").join("tokens");
    std::fs::write(&empty, "\n  \n").expect("write");
    let mut env = beyond_loopback();
    env.push(("CONTRAIL_AUTH__TOKENS_FILE", empty.display().to_string()));
    let (status, output) = run_to_exit("delta-archiver", &env);
    assert_eq!(status, Some(1), "{output}");
    assert!(output.contains("beyond loopback"), "{output}");
}

#[test]
fn explicitly_disabled_authentication_starts_beyond_loopback_and_serves_unauthenticated() {
    let broker = shared_broker();
    let dir = test_dir("auth-disabled");
    let http_port = free_port();
    let name = unique("auth");
    let grpc_port = free_port();
    let env: Vec<(String, String)> = [
        ("CONTRAIL_KAFKA__BROKERS", broker.address.clone()),
        ("CONTRAIL_LISTEN__HTTP", format!("0.0.0.0:{http_port}")),
        ("CONTRAIL_LISTEN__GRPC", format!("0.0.0.0:{grpc_port}")),
        ("CONTRAIL_TOPICS__RAW", format!("{name}.ops.events.raw")),
        ("CONTRAIL_TOPICS__DLQ", format!("{name}.ops.events.dlq")),
        ("CONTRAIL_AUTH__DISABLED", "true".to_owned()),
        ("CONTRAIL_ADMIN_AUTH__DISABLED", "true".to_owned()),
        ("CONTRAIL_CURSOR_DIR", dir.join("cursors").display().to_string()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value))
    .collect();
    let mut ingest = StageProcess::spawn(
        &workspace_binary("ingest").expect("ingest"),
        &env,
        &dir.join("ingest.log"),
    )
    .expect("spawn");
    let url = format!("http://127.0.0.1:{http_port}/readyz");
    ingest
        .wait_until(
            "ingest ready with authentication disabled",
            Duration::from_secs(60),
            || Ok(answers_200(&url)),
        )
        .expect("ready");
    assert!(
        ingest.log().contains("auth.disabled = true"),
        "the choice is logged:\n{}",
        ingest.log_tail(20)
    );
    // Open by choice: the admin API answers without a token.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let status = runtime.block_on(async {
        use contrail_proto::admin::v1::{StatusRequest, admin_service_client::AdminServiceClient};
        let mut admin = AdminServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
            .await
            .expect("connect");
        admin
            .status(StatusRequest {})
            .await
            .map(tonic::Response::into_inner)
    });
    let status = status.expect("Status without a token");
    assert_eq!(status.stage, "ingest");
}
