//! `contrail admin`: a client for the admin API every stage serves on its gRPC port
//! (`contrail.admin.v1.AdminService`, DESIGN §6).
//!
//! A stage is named with `--stage` (a stage on this machine, at its default admin port shifted by
//! `--port-offset` as `contrail up` does) or reached anywhere with `--addr`. Human output is aligned
//! tables; `--json` prints one JSON object per stage on one line each, for scripts and `jq`.
//! The bearer token is sent as `authorization` metadata and never printed.

use std::error::Error as StdError;
use std::fmt;
use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use chrono::{DateTime, SecondsFormat};
use clap::{Args, Subcommand};
use contrail_proto::admin::v1 as admin;
use contrail_proto::admin::v1::admin_service_client::AdminServiceClient;
use serde_json::{Value, json};
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};

/// Options of `contrail admin`.
#[derive(Args, Debug)]
pub struct AdminArgs {
    /// The stage to talk to on this machine: ingest, dedup-state, cosmos-writer, changefeed-sync or
    /// delta-archiver (its default admin gRPC port on 127.0.0.1: 9090, 9091, 9192, 9193, 9194,
    /// plus --port-offset). `status` without --stage or --addr asks every stage.
    #[arg(long, global = true, value_name = "NAME", value_parser = Stage::from_name)]
    stage: Option<Stage>,
    /// Admin gRPC address of a stage anywhere, e.g. http://dedup-state-0.dedup-state:9091 (http://
    /// is assumed when no scheme is given). Overrides the address --stage implies; --stage then
    /// only names the stage in messages.
    #[arg(long, global = true, value_name = "URL", env = "CONTRAIL_ADMIN_ADDR")]
    addr: Option<String>,
    /// Added to every default admin port, as `contrail up --port-offset N` shifts them.
    #[arg(
        long,
        global = true,
        value_name = "N",
        env = "CONTRAIL_PORT_OFFSET",
        default_value_t = 0
    )]
    port_offset: u16,
    /// Bearer token of the admin API (sent as `authorization: Bearer TOKEN`; never printed).
    #[arg(
        long,
        global = true,
        value_name = "TOKEN",
        env = "CONTRAIL_ADMIN_TOKEN",
        hide_env_values = true
    )]
    token: Option<AdminToken>,
    /// Print one JSON object per stage, one per line, instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Give up on a stage after this many seconds, for connecting and again for its answer.
    #[arg(
        long,
        global = true,
        value_name = "SECONDS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    timeout_s: u64,
    /// What to ask the stage.
    #[command(subcommand)]
    command: AdminCommand,
}

/// The calls of the admin API, one subcommand each.
#[derive(Subcommand, Debug)]
enum AdminCommand {
    /// What a stage is doing: partitions, offsets, lag, rates, counters, sources and leases.
    /// Without --stage or --addr: one summary row for each of the five local stages.
    Status,
    /// Stop consuming/accepting new work; in-flight work finishes.
    Pause,
    /// Take work again after `pause`.
    Resume,
    /// Take a checkpoint now and print its epoch (dedup-state).
    Checkpoint,
    /// List the checkpoints the stage keeps (dedup-state).
    Checkpoints,
    /// Ask the stage to restore checkpoint EPOCH (dedup-state); fails unless the stage accepts.
    Restore {
        /// The checkpoint's epoch, as listed by `contrail admin checkpoints`.
        epoch: u64,
    },
    /// One key's state, dedup event ids and timers (dedup-state).
    State {
        /// The state key: a flight key `{carrier}{number}-{date}-{origin}`, e.g.
        /// UA1545-2013-01-01-EWR.
        key: String,
    },
    /// Finish in-flight work, commit and stop taking work; the stage then exits.
    Drain,
}

impl AdminCommand {
    /// The command as typed, for messages.
    fn name(&self) -> &'static str {
        match self {
            AdminCommand::Status => "status",
            AdminCommand::Pause => "pause",
            AdminCommand::Resume => "resume",
            AdminCommand::Checkpoint => "checkpoint",
            AdminCommand::Checkpoints => "checkpoints",
            AdminCommand::Restore { .. } => "restore",
            AdminCommand::State { .. } => "state",
            AdminCommand::Drain => "drain",
        }
    }
}

/// The admin bearer token. Its `Debug` is redacted, so the token reaches no log and no error.
#[derive(Clone)]
struct AdminToken(String);

impl From<String> for AdminToken {
    fn from(token: String) -> AdminToken {
        AdminToken(token)
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("AdminToken(<redacted>)")
    }
}

impl AdminToken {
    /// The `authorization` metadata value; `None` for an empty token (no header is sent).
    fn authorization(&self) -> Result<Option<AsciiMetadataValue>> {
        let token = self.0.trim();
        if token.is_empty() {
            return Ok(None);
        }
        // The error names neither the token nor the header value: both hold the secret.
        let value = AsciiMetadataValue::try_from(format!("Bearer {token}")).map_err(|_| {
            anyhow!("the admin token holds characters an HTTP header cannot carry (check --token)")
        })?;
        Ok(Some(value))
    }
}

/// A deployable stage and where its admin API listens by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Ingest,
    DedupState,
    CosmosWriter,
    ChangefeedSync,
    DeltaArchiver,
}

impl Stage {
    /// Every stage, in pipeline order (the order of the `status` summary).
    const ALL: [Stage; 5] = [
        Stage::Ingest,
        Stage::DedupState,
        Stage::CosmosWriter,
        Stage::ChangefeedSync,
        Stage::DeltaArchiver,
    ];

    /// The stage's name, as in its binary and in `--stage`.
    fn name(self) -> &'static str {
        match self {
            Stage::Ingest => "ingest",
            Stage::DedupState => "dedup-state",
            Stage::CosmosWriter => "cosmos-writer",
            Stage::ChangefeedSync => "changefeed-sync",
            Stage::DeltaArchiver => "delta-archiver",
        }
    }

    /// The stage's admin gRPC port when its config does not set one (each stage's `config.rs`;
    /// the table `contrail up` starts the stages with).
    fn default_admin_port(self) -> u16 {
        crate::platform::STAGES
            .iter()
            .find(|spec| spec.name == self.name())
            .map_or(0, |spec| spec.grpc)
    }

    /// Parses a `--stage` value; the error names the bad value and lists the valid ones.
    fn from_name(name: &str) -> Result<Stage, String> {
        Stage::ALL
            .into_iter()
            .find(|stage| stage.name() == name)
            .ok_or_else(|| {
                let valid: Vec<&str> = Stage::ALL.iter().map(|stage| stage.name()).collect();
                format!("unknown stage {name:?}: expected one of {}", valid.join(", "))
            })
    }

    /// `http://127.0.0.1:PORT` of the stage's admin API with every port shifted by `port_offset`.
    fn local_url(self, port_offset: u16) -> Result<String> {
        let default_port = self.default_admin_port();
        let Some(port) = default_port.checked_add(port_offset) else {
            bail!(
                "--port-offset {port_offset} moves the {} admin port {default_port} past 65535",
                self.name()
            );
        };
        Ok(format!("http://127.0.0.1:{port}"))
    }
}

/// One admin API to call: its URL, and the stage it belongs to when known.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    stage: Option<Stage>,
    url: String,
}

impl Target {
    /// Who answers, for messages: the stage's name, or its address when only `--addr` was given.
    fn name(&self) -> String {
        match self.stage {
            Some(stage) => stage.name().to_owned(),
            None => format!("the stage at {}", self.url),
        }
    }

    /// "dedup-state admin API at http://…", for connection errors.
    fn describe_api(&self) -> String {
        match self.stage {
            Some(stage) => format!("{} admin API at {}", stage.name(), self.url),
            None => format!("the admin API at {}", self.url),
        }
    }

    /// The `stage` and `address` fields every JSON answer starts with.
    fn json_fields(&self) -> serde_json::Map<String, Value> {
        let mut fields = serde_json::Map::new();
        fields.insert("stage".to_owned(), json!(self.stage.map(Stage::name)));
        fields.insert("address".to_owned(), json!(self.url));
        fields
    }
}

/// Where `--stage`, `--addr` and `--port-offset` point; `None` when neither names a stage.
fn resolve_target(stage: Option<Stage>, addr: Option<&str>, port_offset: u16) -> Result<Option<Target>> {
    let explicit_addr = addr.map(str::trim).filter(|addr| !addr.is_empty());
    if let Some(addr) = explicit_addr {
        let url = if addr.contains("://") {
            addr.to_owned()
        } else {
            format!("http://{addr}")
        };
        return Ok(Some(Target { stage, url }));
    }
    match stage {
        Some(stage) => Ok(Some(Target {
            stage: Some(stage),
            url: stage.local_url(port_offset)?,
        })),
        None => Ok(None),
    }
}

/// The RPCs only stateful stages serve; the others answer UNIMPLEMENTED.
const STATEFUL_RPCS: [&str; 4] = [
    "TriggerCheckpoint",
    "ListCheckpoints",
    "RestoreCheckpoint",
    "ReadKeyState",
];

/// What to tell the operator when `target` answered `rpc` with an error status.
fn rpc_failure(target: &Target, rpc: &str, status: &tonic::Status) -> anyhow::Error {
    let name = target.name();
    let server_message = status.message();
    match status.code() {
        tonic::Code::Unimplemented if STATEFUL_RPCS.contains(&rpc) => anyhow!(
            "{name} does not support {rpc} (only dedup-state keeps checkpoints/state): {server_message}"
        ),
        tonic::Code::Unimplemented => anyhow!("{name} does not support {rpc}: {server_message}"),
        tonic::Code::Unauthenticated => anyhow!(
            "the admin API refused the token: pass --token or set CONTRAIL_ADMIN_TOKEN \
             ({name} answered {rpc} with: {server_message})"
        ),
        tonic::Code::Unavailable => anyhow!("cannot reach {}: {server_message}", target.describe_api()),
        code => anyhow!("{name} failed {rpc}: {server_message} (gRPC {code:?})"),
    }
}

/// `error` and its causes, joined: tonic's transport error alone says only "transport error".
fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut messages = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if messages.last() != Some(&message) {
            messages.push(message);
        }
        source = cause.source();
    }
    messages.join(": ")
}

/// A connection to one stage's admin API, with what every call needs.
struct AdminSession {
    target: Target,
    client: AdminServiceClient<Channel>,
    authorization: Option<AsciiMetadataValue>,
    timeout: Duration,
}

impl AdminSession {
    /// Connects to `target`, giving up after `timeout`.
    async fn connect(
        target: Target,
        authorization: Option<AsciiMetadataValue>,
        timeout: Duration,
    ) -> Result<AdminSession> {
        let endpoint = Endpoint::from_shared(target.url.clone())
            .map_err(|error| {
                anyhow!(
                    "invalid admin address {:?} (expected e.g. http://127.0.0.1:9091): {}",
                    target.url,
                    error_chain(&error)
                )
            })?
            .connect_timeout(timeout);
        // The outer timeout also bounds the HTTP/2 handshake, which `connect_timeout` does not.
        let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(error)) => bail!("cannot reach {}: {}", target.describe_api(), error_chain(&error)),
            Err(_elapsed) => bail!(
                "cannot reach {}: no connection within {} s",
                target.describe_api(),
                timeout.as_secs()
            ),
        };
        Ok(AdminSession {
            target,
            client: AdminServiceClient::new(channel),
            authorization,
            timeout,
        })
    }

    /// `message` with the bearer token attached.
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(authorization) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", authorization.clone());
        }
        request
    }

    /// Awaits `call` (the RPC named `rpc`) within the timeout and explains any failure.
    async fn answer<T>(
        &self,
        rpc: &str,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(rpc_failure(&self.target, rpc, &status)),
            Err(_elapsed) => Err(anyhow!(
                "{} did not answer {rpc} within {} s",
                self.target.name(),
                self.timeout.as_secs()
            )),
        }
    }

    async fn status(&self) -> Result<admin::StatusResponse> {
        let mut client = self.client.clone();
        self.answer("Status", client.status(self.request(admin::StatusRequest {})))
            .await
    }
}

/// Runs `contrail admin …`.
pub async fn run(args: AdminArgs) -> Result<()> {
    let authorization = match &args.token {
        Some(token) => token.authorization()?,
        None => None,
    };
    let timeout = Duration::from_secs(args.timeout_s);
    let target = resolve_target(args.stage, args.addr.as_deref(), args.port_offset)?;
    let Some(target) = target else {
        if matches!(args.command, AdminCommand::Status) {
            return status_of_every_stage(args.port_offset, authorization, timeout, args.json).await;
        }
        let valid: Vec<&str> = Stage::ALL.iter().map(|stage| stage.name()).collect();
        bail!(
            "`contrail admin {}` needs a stage: pass --stage NAME (one of {}) or --addr URL \
             (or set CONTRAIL_ADMIN_ADDR)",
            args.command.name(),
            valid.join(", ")
        );
    };
    let session = AdminSession::connect(target, authorization, timeout).await?;
    let mut client = session.client.clone();
    let output = match args.command {
        AdminCommand::Status => {
            let status = session.status().await?;
            if args.json {
                with_fields(session.target.json_fields(), status_json(&status)).to_string()
            } else {
                render_status(&session.target, &status)
            }
        }
        AdminCommand::Pause => {
            let response = session
                .answer("Pause", client.pause(session.request(admin::PauseRequest {})))
                .await?;
            if args.json {
                let answer = json!({ "paused": response.paused });
                with_fields(session.target.json_fields(), answer).to_string()
            } else {
                let state = if response.paused { "paused" } else { "not paused" };
                format!("{}: {state}", session.target.name())
            }
        }
        AdminCommand::Resume => {
            let response = session
                .answer("Resume", client.resume(session.request(admin::ResumeRequest {})))
                .await?;
            if args.json {
                let answer = json!({ "paused": response.paused });
                with_fields(session.target.json_fields(), answer).to_string()
            } else {
                let state = if response.paused {
                    "still paused"
                } else {
                    "resumed"
                };
                format!("{}: {state}", session.target.name())
            }
        }
        AdminCommand::Checkpoint => {
            let request = session.request(admin::TriggerCheckpointRequest {});
            let response = session
                .answer("TriggerCheckpoint", client.trigger_checkpoint(request))
                .await?;
            if args.json {
                let answer = json!({ "epoch": response.epoch });
                with_fields(session.target.json_fields(), answer).to_string()
            } else {
                format!("{}: checkpoint epoch {}", session.target.name(), response.epoch)
            }
        }
        AdminCommand::Checkpoints => {
            let request = session.request(admin::ListCheckpointsRequest {});
            let response = session
                .answer("ListCheckpoints", client.list_checkpoints(request))
                .await?;
            let mut checkpoints = response.checkpoints;
            checkpoints.sort_by_key(|checkpoint| checkpoint.epoch);
            if args.json {
                let answer =
                    json!({ "checkpoints": checkpoints.iter().map(checkpoint_json).collect::<Vec<_>>() });
                with_fields(session.target.json_fields(), answer).to_string()
            } else {
                render_checkpoints(&session.target, &checkpoints)
            }
        }
        AdminCommand::Restore { epoch } => {
            let request = session.request(admin::RestoreCheckpointRequest { epoch });
            let response = session
                .answer("RestoreCheckpoint", client.restore_checkpoint(request))
                .await?;
            let rendered = if args.json {
                let answer = json!({
                    "epoch": epoch,
                    "accepted": response.accepted,
                    "message": response.message,
                });
                with_fields(session.target.json_fields(), answer).to_string()
            } else {
                let accepted = if response.accepted { "yes" } else { "no" };
                format!("accepted: {accepted}\nmessage:  {}", response.message)
            };
            print_out(&rendered)?;
            if !response.accepted {
                bail!(
                    "{} did not accept restoring checkpoint epoch {epoch}",
                    session.target.name()
                );
            }
            return Ok(());
        }
        AdminCommand::State { key } => {
            let request = session.request(admin::ReadKeyStateRequest { key: key.clone() });
            let response = session
                .answer("ReadKeyState", client.read_key_state(request))
                .await?;
            if args.json {
                with_fields(session.target.json_fields(), key_state_json(&key, &response)).to_string()
            } else {
                render_key_state(&key, &response)
            }
        }
        AdminCommand::Drain => {
            let response = session
                .answer("Drain", client.drain(session.request(admin::DrainRequest {})))
                .await?;
            if args.json {
                let answer = json!({ "draining": response.draining });
                with_fields(session.target.json_fields(), answer).to_string()
            } else if response.draining {
                format!(
                    "{}: draining (it finishes in-flight work, commits and exits)",
                    session.target.name()
                )
            } else {
                format!("{}: not draining", session.target.name())
            }
        }
    };
    print_out(&output)
}

/// `status` without a stage: asks all five local stages at once; a stage that cannot answer is
/// shown as down with its error instead of failing the command.
async fn status_of_every_stage(
    port_offset: u16,
    authorization: Option<AsciiMetadataValue>,
    timeout: Duration,
    as_json: bool,
) -> Result<()> {
    let probes = Stage::ALL.into_iter().map(|stage| {
        let authorization = authorization.clone();
        async move {
            let url = stage.local_url(port_offset)?;
            let target = Target {
                stage: Some(stage),
                url,
            };
            let session = AdminSession::connect(target, authorization, timeout).await?;
            session.status().await
        }
    });
    let answers = futures::future::join_all(probes).await;
    let stages_and_answers: Vec<(Stage, Result<admin::StatusResponse>)> =
        Stage::ALL.into_iter().zip(answers).collect();
    if as_json {
        let lines: Vec<String> = stages_and_answers
            .iter()
            .map(|(stage, answer)| summary_json(*stage, port_offset, answer).to_string())
            .collect();
        return print_out(&lines.join("\n"));
    }
    let mut table = Table::new(&[
        ("STAGE", Align::Left),
        ("INSTANCE", Align::Left),
        ("READY", Align::Left),
        ("PAUSED", Align::Left),
        ("UPTIME", Align::Right),
        ("PARTITIONS", Align::Right),
        ("LAG", Align::Right),
        ("EVENTS/S", Align::Right),
        ("IN FLIGHT", Align::Right),
    ]);
    let mut failures = Vec::new();
    for (stage, answer) in &stages_and_answers {
        match answer {
            Ok(status) => table.push(vec![
                stage.name().to_owned(),
                status.instance.clone(),
                yes_no(status.ready),
                yes_no(status.paused),
                format_uptime(status.uptime_seconds),
                status.partitions.len().to_string(),
                total_lag(status).to_string(),
                format!("{:.1}", status.events_per_second),
                status.in_flight.to_string(),
            ]),
            Err(error) => {
                let mut row = vec![stage.name().to_owned(), "-".to_owned(), "down".to_owned()];
                row.resize(9, "-".to_owned());
                table.push(row);
                failures.push(format!("{}: {error:#}", stage.name()));
            }
        }
    }
    let mut output = table.render();
    if !failures.is_empty() {
        output.push('\n');
        output.push_str(&failures.join("\n"));
    }
    print_out(&output)
}

/// One stage's line of `status --json` without a stage.
fn summary_json(stage: Stage, port_offset: u16, answer: &Result<admin::StatusResponse>) -> Value {
    let url = stage.local_url(port_offset).unwrap_or_default();
    let target = Target {
        stage: Some(stage),
        url,
    };
    match answer {
        Ok(status) => {
            let mut fields = target.json_fields();
            fields.insert("up".to_owned(), json!(true));
            with_fields(fields, status_json(status))
        }
        Err(error) => {
            let mut fields = target.json_fields();
            fields.insert("up".to_owned(), json!(false));
            fields.insert("error".to_owned(), json!(format!("{error:#}")));
            Value::Object(fields)
        }
    }
}

/// `answer`'s fields after `fields`; `answer`'s win on a clash (a stage reports its own `stage`).
fn with_fields(mut fields: serde_json::Map<String, Value>, answer: Value) -> Value {
    if let Value::Object(answer_fields) = answer {
        fields.extend(answer_fields);
    }
    Value::Object(fields)
}

/// Writes `text` and a newline to stdout; a closed pipe (`| head`) is an error, not a panic.
fn print_out(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}").context("cannot write to stdout")?;
    stdout.flush().context("cannot write to stdout")
}

/// Lag summed over the partitions that report one (a negative lag means "not known yet").
fn total_lag(status: &admin::StatusResponse) -> i64 {
    status
        .partitions
        .iter()
        .map(|partition| partition.lag.max(0))
        .fold(0_i64, i64::saturating_add)
}

/// Every field of a `StatusResponse`, plus the partition count and total lag.
fn status_json(status: &admin::StatusResponse) -> Value {
    let counters: serde_json::Map<String, Value> = status
        .counters
        .iter()
        .map(|(name, value)| (name.clone(), json!(value)))
        .collect();
    let partitions: Vec<Value> = status.partitions.iter().map(partition_json).collect();
    let sources: Vec<Value> = status
        .sources
        .iter()
        .map(|source| {
            json!({
                "name": source.name,
                "cursor": source.cursor,
                "events_fetched": source.events_fetched,
                "pages_fetched": source.pages_fetched,
                "errors": source.errors,
                "last_error": source.last_error,
                "caught_up": source.caught_up,
            })
        })
        .collect();
    let leases: Vec<Value> = status
        .leases
        .iter()
        .map(|lease| {
            json!({
                "feed_range": lease.feed_range,
                "owner": lease.owner,
                "last_lsn": lease.last_lsn,
                "last_ts": lease.last_ts,
                "lag_seconds": lease.lag_seconds,
                "renewed_ms_ago": lease.renewed_ms_ago,
                "changes_published": lease.changes_published,
            })
        })
        .collect();
    json!({
        "stage": status.stage,
        "version": status.version,
        "instance": status.instance,
        "ready": status.ready,
        "paused": status.paused,
        "uptime_seconds": status.uptime_seconds,
        "events_per_second": status.events_per_second,
        "in_flight": status.in_flight,
        "partitions_owned": status.partitions.len(),
        "total_lag": total_lag(status),
        "partitions": partitions,
        "counters": counters,
        "sources": sources,
        "leases": leases,
    })
}

fn partition_json(partition: &admin::PartitionStatus) -> Value {
    json!({
        "topic": partition.topic,
        "partition": partition.partition,
        "committed_offset": partition.committed_offset,
        "high_watermark": partition.high_watermark,
        "lag": partition.lag,
        "state_bytes": partition.state_bytes,
    })
}

fn checkpoint_json(checkpoint: &admin::CheckpointInfo) -> Value {
    json!({
        "epoch": checkpoint.epoch,
        "complete": checkpoint.complete,
        "created_at_us": checkpoint.created_at_us,
        "created_at": format_micros(checkpoint.created_at_us),
        "partitions": checkpoint.partitions.iter().map(partition_json).collect::<Vec<_>>(),
    })
}

/// A key's state; `state` is the stage's JSON document itself (a string only if it is not JSON).
fn key_state_json(key: &str, response: &admin::ReadKeyStateResponse) -> Value {
    let timers: Vec<Value> = response
        .timers
        .iter()
        .map(|timer| {
            json!({
                "kind": timer.kind,
                "fire_at_us": timer.fire_at_us,
                "fire_at": format_micros(timer.fire_at_us),
                "time_domain": timer.time_domain,
            })
        })
        .collect();
    json!({
        "key": key,
        "found": response.found,
        "expired": response.expired,
        "state": parse_state(&response.state_json),
        "dedup_event_ids": response.dedup_event_ids,
        "timers": timers,
    })
}

/// The state document as JSON: null when empty, the raw text when it does not parse.
fn parse_state(state_json: &str) -> Value {
    if state_json.trim().is_empty() {
        return Value::Null;
    }
    serde_json::from_str(state_json).unwrap_or_else(|_| Value::String(state_json.to_owned()))
}

/// The full status of one stage: header fields, then partitions, counters, sources and leases.
fn render_status(target: &Target, status: &admin::StatusResponse) -> String {
    let mut sections = vec![key_value_lines(&[
        ("stage", status.stage.clone()),
        ("version", status.version.clone()),
        ("instance", status.instance.clone()),
        ("address", target.url.clone()),
        ("ready", yes_no(status.ready)),
        ("paused", yes_no(status.paused)),
        (
            "uptime",
            format!(
                "{} ({} s)",
                format_uptime(status.uptime_seconds),
                status.uptime_seconds
            ),
        ),
        ("events/s", format!("{:.1}", status.events_per_second)),
        ("in flight", status.in_flight.to_string()),
    ])];

    let mut partitions = Table::new(&[
        ("TOPIC", Align::Left),
        ("PARTITION", Align::Right),
        ("COMMITTED", Align::Right),
        ("HIGH WATERMARK", Align::Right),
        ("LAG", Align::Right),
        ("STATE", Align::Right),
    ]);
    let mut sorted_partitions: Vec<&admin::PartitionStatus> = status.partitions.iter().collect();
    sorted_partitions
        .sort_by(|left, right| (&left.topic, left.partition).cmp(&(&right.topic, right.partition)));
    for partition in sorted_partitions {
        partitions.push(vec![
            partition.topic.clone(),
            partition.partition.to_string(),
            partition.committed_offset.to_string(),
            partition.high_watermark.to_string(),
            partition.lag.to_string(),
            format_bytes(partition.state_bytes),
        ]);
    }
    sections.push(format!(
        "partitions: {} owned, total lag {}\n{}",
        status.partitions.len(),
        total_lag(status),
        partitions.render()
    ));

    if !status.counters.is_empty() {
        let mut counters = Table::new(&[("COUNTER", Align::Left), ("VALUE", Align::Right)]);
        let mut sorted_counters: Vec<(&String, &f64)> = status.counters.iter().collect();
        sorted_counters.sort_by(|left, right| left.0.cmp(right.0));
        for (name, value) in sorted_counters {
            counters.push(vec![name.clone(), format_number(*value)]);
        }
        sections.push(counters.render());
    }

    if !status.sources.is_empty() {
        let mut sources = Table::new(&[
            ("SOURCE", Align::Left),
            ("CURSOR", Align::Left),
            ("EVENTS", Align::Right),
            ("PAGES", Align::Right),
            ("ERRORS", Align::Right),
            ("CAUGHT UP", Align::Left),
            ("LAST ERROR", Align::Left),
        ]);
        for source in &status.sources {
            sources.push(vec![
                source.name.clone(),
                source.cursor.clone(),
                source.events_fetched.to_string(),
                source.pages_fetched.to_string(),
                source.errors.to_string(),
                yes_no(source.caught_up),
                source.last_error.clone(),
            ]);
        }
        sections.push(sources.render());
    }

    if !status.leases.is_empty() {
        let mut leases = Table::new(&[
            ("FEED RANGE", Align::Left),
            ("OWNER", Align::Left),
            ("LAST LSN", Align::Right),
            ("LAST CHANGE", Align::Left),
            ("LAG S", Align::Right),
            ("RENEWED MS AGO", Align::Right),
            ("PUBLISHED", Align::Right),
        ]);
        for lease in &status.leases {
            leases.push(vec![
                lease.feed_range.clone(),
                lease.owner.clone(),
                lease.last_lsn.to_string(),
                format_epoch_seconds(lease.last_ts),
                format!("{:.1}", lease.lag_seconds),
                lease.renewed_ms_ago.to_string(),
                lease.changes_published.to_string(),
            ]);
        }
        sections.push(leases.render());
    }
    sections.join("\n\n")
}

fn render_checkpoints(target: &Target, checkpoints: &[admin::CheckpointInfo]) -> String {
    if checkpoints.is_empty() {
        return format!("{} keeps no checkpoints yet", target.name());
    }
    let mut table = Table::new(&[
        ("EPOCH", Align::Right),
        ("COMPLETE", Align::Left),
        ("CREATED AT", Align::Left),
        ("PARTITIONS", Align::Right),
    ]);
    for checkpoint in checkpoints {
        table.push(vec![
            checkpoint.epoch.to_string(),
            yes_no(checkpoint.complete),
            format_micros(checkpoint.created_at_us),
            checkpoint.partitions.len().to_string(),
        ]);
    }
    table.render()
}

fn render_key_state(key: &str, response: &admin::ReadKeyStateResponse) -> String {
    let mut sections = vec![format!(
        "key:   {key}\nfound: {}{}",
        yes_no(response.found),
        if response.expired {
            " (expired: a tombstone — its events are late until dedup_ttl after its last one)"
        } else {
            ""
        }
    )];
    match parse_state(&response.state_json) {
        Value::Null => {}
        Value::String(raw) => sections.push(format!("state (not JSON):\n{raw}")),
        document => {
            let pretty = serde_json::to_string_pretty(&document).unwrap_or_else(|_| document.to_string());
            sections.push(format!("state:\n{pretty}"));
        }
    }
    if response.dedup_event_ids.is_empty() {
        sections.push("dedup event ids: none".to_owned());
    } else {
        sections.push(format!(
            "dedup event ids ({}):\n{}",
            response.dedup_event_ids.len(),
            response.dedup_event_ids.join("\n")
        ));
    }
    if response.timers.is_empty() {
        sections.push("timers: none".to_owned());
    } else {
        let mut timers = Table::new(&[
            ("KIND", Align::Left),
            ("FIRE AT", Align::Left),
            ("TIME DOMAIN", Align::Left),
        ]);
        for timer in &response.timers {
            timers.push(vec![
                timer.kind.clone(),
                format_micros(timer.fire_at_us),
                timer.time_domain.clone(),
            ]);
        }
        sections.push(format!("timers:\n{}", timers.render()));
    }
    sections.join("\n\n")
}

/// `name  value` lines with the values aligned.
fn key_value_lines(pairs: &[(&str, String)]) -> String {
    let width = pairs
        .iter()
        .map(|(name, _)| name.chars().count())
        .max()
        .unwrap_or(0);
    pairs
        .iter()
        .map(|(name, value)| format!("{name:<width$}  {value}").trim_end().to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// How a column's cells line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Align {
    Left,
    Right,
}

/// A text table: every column as wide as its widest cell, two spaces between columns.
struct Table {
    headers: Vec<&'static str>,
    alignments: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(columns: &[(&'static str, Align)]) -> Table {
        Table {
            headers: columns.iter().map(|(header, _)| *header).collect(),
            alignments: columns.iter().map(|(_, align)| *align).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; it must have one cell per column.
    fn push(&mut self, row: Vec<String>) {
        debug_assert_eq!(
            row.len(),
            self.headers.len(),
            "a table row needs one cell per column"
        );
        self.rows.push(row);
    }

    /// The header line and one line per row, without trailing spaces or a final newline.
    fn render(&self) -> String {
        let header_cells: Vec<String> = self.headers.iter().map(|header| (*header).to_owned()).collect();
        let lines: Vec<&Vec<String>> = std::iter::once(&header_cells).chain(&self.rows).collect();
        let widths: Vec<usize> = (0..self.headers.len())
            .map(|column| {
                lines
                    .iter()
                    .map(|cells| cells.get(column).map_or(0, |cell| cell.chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        lines
            .iter()
            .map(|cells| {
                let padded: Vec<String> = widths
                    .iter()
                    .zip(&self.alignments)
                    .enumerate()
                    .map(|(column, (&width, align))| {
                        let cell = cells.get(column).map_or("", String::as_str);
                        match align {
                            Align::Left => format!("{cell:<width$}"),
                            Align::Right => format!("{cell:>width$}"),
                        }
                    })
                    .collect();
                padded.join("  ").trim_end().to_owned()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn yes_no(value: bool) -> String {
    if value { "yes" } else { "no" }.to_owned()
}

/// `42s`, `5m07s`, `3h05m`, `2d04h`.
fn format_uptime(seconds: i64) -> String {
    if seconds < 0 {
        return "-".to_owned();
    }
    let (days, hours, minutes, secs) = (
        seconds / 86_400,
        seconds % 86_400 / 3_600,
        seconds % 3_600 / 60,
        seconds % 60,
    );
    if days > 0 {
        format!("{days}d{hours:02}h")
    } else if hours > 0 {
        format!("{hours}h{minutes:02}m")
    } else if minutes > 0 {
        format!("{minutes}m{secs:02}s")
    } else {
        format!("{secs}s")
    }
}

/// `512 B`, `1.5 KiB`, `12.3 MiB`, …
fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    // Precision lost above 2^53 bytes does not show at one decimal.
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A counter: whole numbers without a fraction, others as Rust's shortest exact form.
fn format_number(value: f64) -> String {
    const EXACT_INTEGER_LIMIT: f64 = 9_007_199_254_740_992.0; // 2^53
    if value.fract() == 0.0 && value.abs() < EXACT_INTEGER_LIMIT {
        // Exact: a whole number below 2^53 converts to i64 without loss.
        let whole = value as i64;
        whole.to_string()
    } else {
        value.to_string()
    }
}

/// RFC 3339 (UTC) of microseconds since the Unix epoch.
fn format_micros(micros: i64) -> String {
    DateTime::from_timestamp_micros(micros).map_or_else(
        || format!("{micros} µs (out of range)"),
        |time| time.to_rfc3339_opts(SecondsFormat::AutoSi, true),
    )
}

/// RFC 3339 (UTC) of seconds since the Unix epoch; `-` for 0 ("none yet").
fn format_epoch_seconds(seconds: i64) -> String {
    if seconds == 0 {
        return "-".to_owned();
    }
    DateTime::from_timestamp(seconds, 0).map_or_else(
        || format!("{seconds} s (out of range)"),
        |time| time.to_rfc3339_opts(SecondsFormat::Secs, true),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_names_resolve_to_local_admin_urls() {
        let expected = [
            ("ingest", "http://127.0.0.1:9090"),
            ("dedup-state", "http://127.0.0.1:9091"),
            ("cosmos-writer", "http://127.0.0.1:9192"),
            ("changefeed-sync", "http://127.0.0.1:9193"),
            ("delta-archiver", "http://127.0.0.1:9194"),
        ];
        for (name, url) in expected {
            let stage = Stage::from_name(name).expect("a valid stage name");
            assert_eq!(stage.name(), name);
            let target = resolve_target(Some(stage), None, 0)
                .expect("resolves")
                .expect("a target");
            assert_eq!(target.url, url);
            assert_eq!(target.stage, Some(stage));
        }
    }

    #[test]
    fn port_offset_shifts_the_port() {
        let target = resolve_target(Some(Stage::DedupState), None, 100)
            .expect("resolves")
            .expect("a target");
        assert_eq!(target.url, "http://127.0.0.1:9191");
        assert_eq!(
            Stage::DeltaArchiver.local_url(1000).expect("in range"),
            "http://127.0.0.1:10194"
        );
        let error = Stage::Ingest.local_url(60_000).expect_err("past 65535");
        assert!(error.to_string().contains("60000"), "{error}");
        assert!(error.to_string().contains("ingest"), "{error}");
    }

    #[test]
    fn bad_stage_name_is_named_with_the_valid_ones() {
        let error = Stage::from_name("dedup").expect_err("not a stage");
        assert!(error.contains("\"dedup\""), "{error}");
        for stage in Stage::ALL {
            assert!(error.contains(stage.name()), "{error} lacks {}", stage.name());
        }
        assert!(Stage::from_name("Ingest").is_err(), "names are case-sensitive");
    }

    #[test]
    fn addr_overrides_stage_and_defaults_to_http() {
        let target = resolve_target(
            Some(Stage::DedupState),
            Some("http://dedup-state-0.dedup-state:9091"),
            500,
        )
        .expect("resolves")
        .expect("a target");
        assert_eq!(target.url, "http://dedup-state-0.dedup-state:9091");
        assert_eq!(target.stage, Some(Stage::DedupState));

        let bare = resolve_target(None, Some(" dedup-state-1:9091 "), 0)
            .expect("resolves")
            .expect("a target");
        assert_eq!(bare.url, "http://dedup-state-1:9091");
        assert_eq!(bare.stage, None);
        assert_eq!(bare.name(), "the stage at http://dedup-state-1:9091");

        assert_eq!(resolve_target(None, None, 0).expect("resolves"), None);
        assert_eq!(resolve_target(None, Some("  "), 0).expect("resolves"), None);
    }

    /// `contrail admin` wired the way `main.rs` wires it, for parsing tests.
    #[derive(clap::Parser, Debug)]
    #[command(name = "contrail")]
    struct TestCli {
        #[command(subcommand)]
        command: TestCommand,
    }

    #[derive(clap::Subcommand, Debug)]
    enum TestCommand {
        /// Operate a running stage through its admin API.
        Admin(AdminArgs),
    }

    fn parse(arguments: &[&str]) -> Result<AdminArgs, clap::Error> {
        use clap::Parser;
        let TestCommand::Admin(admin_args) = TestCli::try_parse_from(arguments)?.command;
        Ok(admin_args)
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        TestCli::command().debug_assert();
    }

    #[test]
    fn global_options_parse_before_and_after_the_subcommand() {
        let admin_args = parse(&[
            "contrail",
            "admin",
            "--json",
            "state",
            "UA1545-2013-01-01-EWR",
            "--stage",
            "dedup-state",
            "--port-offset",
            "100",
            "--timeout-s",
            "3",
        ])
        .expect("parses");
        assert_eq!(admin_args.stage, Some(Stage::DedupState));
        assert!(admin_args.json);
        assert_eq!(admin_args.port_offset, 100);
        assert_eq!(admin_args.timeout_s, 3);
        assert!(
            matches!(&admin_args.command, AdminCommand::State { key } if key == "UA1545-2013-01-01-EWR"),
            "{:?}",
            admin_args.command
        );

        let restore =
            parse(&["contrail", "admin", "restore", "7", "--stage", "dedup-state"]).expect("parses");
        assert!(matches!(restore.command, AdminCommand::Restore { epoch: 7 }));

        let error = parse(&["contrail", "admin", "--stage", "dedupe", "status"]).expect_err("bad stage");
        let message = error.to_string();
        assert!(message.contains("\"dedupe\""), "{message}");
        assert!(message.contains("changefeed-sync"), "{message}");

        parse(&["contrail", "admin", "--timeout-s", "0", "status"]).expect_err("a zero timeout");
    }

    #[test]
    fn table_columns_align() {
        let mut table = Table::new(&[
            ("STAGE", Align::Left),
            ("LAG", Align::Right),
            ("NOTE", Align::Left),
        ]);
        table.push(vec!["dedup-state".to_owned(), "7".to_owned(), "ok".to_owned()]);
        table.push(vec!["ingest".to_owned(), "12345".to_owned(), String::new()]);
        let rendered = table.render();
        let lines: Vec<&str> = rendered.lines().collect();
        assert_eq!(
            lines,
            [
                "STAGE          LAG  NOTE",
                "dedup-state      7  ok",
                "ingest       12345",
            ]
        );
        // Right-aligned cells end in the same column.
        let lag_end = lines[0].find("LAG").expect("header") + "LAG".len();
        assert_eq!(&lines[1][lag_end - 1..lag_end], "7");
        assert_eq!(&lines[2][lag_end - 5..lag_end], "12345");
    }

    #[test]
    fn table_measures_characters_not_bytes() {
        let mut table = Table::new(&[("A", Align::Left), ("B", Align::Left)]);
        table.push(vec!["µµ".to_owned(), "x".to_owned()]);
        table.push(vec!["ab".to_owned(), "y".to_owned()]);
        assert_eq!(table.render(), "A   B\nµµ  x\nab  y");
    }

    fn sample_status() -> admin::StatusResponse {
        admin::StatusResponse {
            stage: "dedup-state".to_owned(),
            version: "0.1.0".to_owned(),
            instance: "dedup-state-0".to_owned(),
            ready: true,
            paused: false,
            uptime_seconds: 3_725,
            partitions: vec![
                admin::PartitionStatus {
                    topic: "ops.events.raw".to_owned(),
                    partition: 0,
                    committed_offset: 1_200,
                    high_watermark: 1_212,
                    lag: 12,
                    state_bytes: 4_096,
                },
                admin::PartitionStatus {
                    topic: "ops.events.raw".to_owned(),
                    partition: 1,
                    committed_offset: 900,
                    high_watermark: 930,
                    lag: 30,
                    state_bytes: 2_048,
                },
            ],
            counters: [
                ("events_deduplicated_total".to_owned(), 17.0),
                ("events_accepted_total".to_owned(), 1_234.5),
            ]
            .into_iter()
            .collect(),
            events_per_second: 88.25,
            sources: vec![admin::SourceStatus {
                name: "flightaware".to_owned(),
                cursor: "page-9".to_owned(),
                events_fetched: 500,
                pages_fetched: 9,
                errors: 1,
                last_error: "HTTP 503".to_owned(),
                caught_up: true,
            }],
            in_flight: 3,
            leases: vec![admin::LeaseStatus {
                feed_range: "[00,80)".to_owned(),
                owner: "changefeed-sync-1".to_owned(),
                last_lsn: 42,
                last_ts: 1_357_016_400,
                lag_seconds: 1.5,
                renewed_ms_ago: 250,
                changes_published: 77,
            }],
        }
    }

    #[test]
    fn status_renders_as_json_with_every_field() {
        let status = sample_status();
        let target = Target {
            stage: Some(Stage::DedupState),
            url: "http://127.0.0.1:9091".to_owned(),
        };
        let rendered = with_fields(target.json_fields(), status_json(&status));
        // One line, parseable: what `--json` prints.
        let line = rendered.to_string();
        assert!(!line.contains('\n'));
        let parsed: Value = serde_json::from_str(&line).expect("valid JSON");

        assert_eq!(parsed["stage"], "dedup-state");
        assert_eq!(parsed["address"], "http://127.0.0.1:9091");
        assert_eq!(parsed["version"], "0.1.0");
        assert_eq!(parsed["instance"], "dedup-state-0");
        assert_eq!(parsed["ready"], true);
        assert_eq!(parsed["paused"], false);
        assert_eq!(parsed["uptime_seconds"], 3_725);
        assert_eq!(parsed["events_per_second"], 88.25);
        assert_eq!(parsed["in_flight"], 3);
        assert_eq!(parsed["partitions_owned"], 2);
        assert_eq!(parsed["total_lag"], 42);
        assert_eq!(parsed["partitions"][1]["partition"], 1);
        assert_eq!(parsed["partitions"][1]["committed_offset"], 900);
        assert_eq!(parsed["partitions"][1]["high_watermark"], 930);
        assert_eq!(parsed["partitions"][1]["lag"], 30);
        assert_eq!(parsed["partitions"][0]["state_bytes"], 4_096);
        assert_eq!(parsed["counters"]["events_accepted_total"], 1_234.5);
        assert_eq!(parsed["counters"]["events_deduplicated_total"], 17.0);
        assert_eq!(parsed["sources"][0]["name"], "flightaware");
        assert_eq!(parsed["sources"][0]["last_error"], "HTTP 503");
        assert_eq!(parsed["sources"][0]["caught_up"], true);
        assert_eq!(parsed["leases"][0]["owner"], "changefeed-sync-1");
        assert_eq!(parsed["leases"][0]["last_lsn"], 42);
        assert_eq!(parsed["leases"][0]["changes_published"], 77);
    }

    #[test]
    fn summary_json_marks_down_stages() {
        let down: Result<admin::StatusResponse> = Err(anyhow!("cannot reach cosmos-writer admin API"));
        let parsed = summary_json(Stage::CosmosWriter, 10, &down);
        assert_eq!(parsed["stage"], "cosmos-writer");
        assert_eq!(parsed["address"], "http://127.0.0.1:9202");
        assert_eq!(parsed["up"], false);
        assert_eq!(parsed["error"], "cannot reach cosmos-writer admin API");

        let up = Ok(sample_status());
        let parsed = summary_json(Stage::DedupState, 0, &up);
        assert_eq!(parsed["up"], true);
        assert_eq!(parsed["total_lag"], 42);
    }

    #[test]
    fn full_status_lists_partitions_and_sorted_counters() {
        let target = Target {
            stage: Some(Stage::DedupState),
            url: "http://127.0.0.1:9091".to_owned(),
        };
        let rendered = render_status(&target, &sample_status());
        assert!(rendered.contains("uptime     1h02m (3725 s)"), "{rendered}");
        assert!(
            rendered.contains("partitions: 2 owned, total lag 42"),
            "{rendered}"
        );
        let accepted = rendered.find("events_accepted_total").expect("counter shown");
        let deduplicated = rendered.find("events_deduplicated_total").expect("counter shown");
        assert!(accepted < deduplicated, "counters sorted by name:\n{rendered}");
        assert!(rendered.contains("1234.5"), "{rendered}");
        assert!(rendered.contains("flightaware"), "{rendered}");
        assert!(
            rendered.contains("2013-01-01T05:00:00Z"),
            "lease time as RFC 3339:\n{rendered}"
        );
    }

    #[test]
    fn grpc_failures_say_what_to_do() {
        let target = Target {
            stage: Some(Stage::CosmosWriter),
            url: "http://127.0.0.1:9192".to_owned(),
        };
        let unimplemented = tonic::Status::unimplemented("progress lives in the Kafka offsets");
        let message = rpc_failure(&target, "TriggerCheckpoint", &unimplemented).to_string();
        assert!(
            message.starts_with("cosmos-writer does not support TriggerCheckpoint (only dedup-state"),
            "{message}"
        );

        let unauthenticated = tonic::Status::unauthenticated("invalid bearer token");
        let message = rpc_failure(&target, "Status", &unauthenticated).to_string();
        assert!(
            message.starts_with("the admin API refused the token: pass --token or set CONTRAIL_ADMIN_TOKEN"),
            "{message}"
        );

        let unavailable = tonic::Status::unavailable("connection reset");
        let message = rpc_failure(&target, "Status", &unavailable).to_string();
        assert_eq!(
            message,
            "cannot reach cosmos-writer admin API at http://127.0.0.1:9192: connection reset"
        );
    }

    #[test]
    fn token_is_redacted_and_sent_as_bearer() {
        let token = AdminToken::from("s3cret".to_owned());
        assert!(!format!("{token:?}").contains("s3cret"));
        let header = token.authorization().expect("valid").expect("a header");
        assert_eq!(header.to_str().expect("ascii"), "Bearer s3cret");
        assert_eq!(
            AdminToken::from("  ".to_owned()).authorization().expect("valid"),
            None
        );
        let error = AdminToken::from("bad\ntoken".to_owned())
            .authorization()
            .expect_err("newline");
        assert!(!error.to_string().contains("bad"), "{error}");
    }

    #[test]
    fn times_and_sizes_read_well() {
        assert_eq!(format_micros(1_357_016_400_000_000), "2013-01-01T05:00:00Z");
        assert_eq!(format_micros(1_357_016_400_250_000), "2013-01-01T05:00:00.250Z");
        assert_eq!(format_uptime(42), "42s");
        assert_eq!(format_uptime(307), "5m07s");
        assert_eq!(format_uptime(3_725), "1h02m");
        assert_eq!(format_uptime(187_200), "2d04h");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1_536), "1.5 KiB");
        assert_eq!(format_bytes(5 * 1024 * 1024), "5.0 MiB");
        assert_eq!(format_number(17.0), "17");
        assert_eq!(format_number(0.25), "0.25");
    }

    #[test]
    fn key_state_keeps_the_document_as_json() {
        let response = admin::ReadKeyStateResponse {
            found: true,
            state_json: r#"{"status":"DEPARTED","gate":"B12"}"#.to_owned(),
            dedup_event_ids: vec!["evt-1".to_owned(), "evt-2".to_owned()],
            timers: vec![admin::TimerInfo {
                kind: "lateness".to_owned(),
                fire_at_us: 1_357_016_400_000_000,
                time_domain: "event".to_owned(),
            }],
            expired: true,
        };
        let parsed = key_state_json("UA1545-2013-01-01-EWR", &response);
        assert_eq!(parsed["found"], true);
        assert_eq!(parsed["expired"], true);
        assert_eq!(parsed["state"]["gate"], "B12");
        assert_eq!(parsed["dedup_event_ids"][1], "evt-2");
        assert_eq!(parsed["timers"][0]["fire_at"], "2013-01-01T05:00:00Z");
        let text = render_key_state("UA1545-2013-01-01-EWR", &response);
        assert!(text.contains("\"gate\": \"B12\""), "pretty-printed:\n{text}");
        assert!(text.contains("lateness  2013-01-01T05:00:00Z  event"), "{text}");
        assert_eq!(parse_state(""), Value::Null);
        assert_eq!(parse_state("not json"), Value::String("not json".to_owned()));
    }
}
