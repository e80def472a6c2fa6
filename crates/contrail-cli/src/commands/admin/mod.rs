//! `contrail admin`: a client for the admin API every stage serves on its gRPC port
//! (`contrail.admin.v1.AdminService`, docs/CONTRACT.md, "Operating").
//!
//! A stage is named with `--stage` (a stage on this machine, at its default admin port shifted by
//! `--port-offset` as `contrail up` does) or reached anywhere with `--addr`. Human output is aligned
//! tables; `--json` prints one JSON object per stage on one line each, for scripts and `jq`.
//! The bearer token is sent as `authorization` metadata and never printed.

mod fields;
mod json;
mod render;
mod session;
mod table;
mod target;

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use contrail_proto::admin::v1 as admin;
use serde_json::json;
use tonic::metadata::AsciiMetadataValue;

use self::fields::total_lag;
use self::json::{checkpoint_json, gap_json, key_state_json, status_json, summary_json, with_fields};
use self::render::{format_uptime, render_checkpoints, render_key_state, render_status, yes_no};
use self::session::{AdminSession, AdminToken};
use self::table::{Align, Table};
use self::target::{Stage, Target, local_url, resolve_target};

/// Options of `contrail admin`.
#[derive(Args, Debug)]
pub struct AdminArgs {
    /// The stage to talk to on this machine: ingest, dedup-state, cosmos-writer, changefeed-sync,
    /// delta-archiver, or the knock-on delay extension's rotation and cosmos-predictions (its
    /// default admin gRPC port on 127.0.0.1: 9090, 9091, 9192, 9193, 9194, 9195, 9196, plus
    /// --port-offset). `status` without --stage or --addr asks every stage.
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
    /// Without --stage or --addr: one summary row for each of the five local stages, and for the
    /// knock-on delay extension's two when they run.
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
    /// Let a partition held at a gap go on from its topic's first offset (consuming stages).
    ///
    /// A consuming stage stops a partition whose stored position the topic no longer holds —
    /// retention deleted records before they were read, or the topic was re-created — instead of
    /// skipping the records in between silently; `status` lists the gaps it holds, its readiness
    /// fails and `contrail_consumer_gap_held` is 1. Accepting says those records are lost (or
    /// were replayed elsewhere): the stage logs the acceptance and reads on.
    #[command(name = "accept-gap")]
    AcceptGap {
        /// The topic of the partition held, as `status` lists it.
        #[arg(long, value_name = "TOPIC", required_unless_present = "all")]
        topic: Option<String>,
        /// The partition held.
        #[arg(long, value_name = "N", requires = "topic", required_unless_present = "all")]
        partition: Option<i32>,
        /// Every partition this instance holds at a gap.
        #[arg(long, conflicts_with_all = ["topic", "partition"])]
        all: bool,
    },
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
            AdminCommand::AcceptGap { .. } => "accept-gap",
        }
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
        bail!(
            "`contrail admin {}` needs a stage: pass --stage NAME (one of {}) or --addr URL \
             (or set CONTRAIL_ADMIN_ADDR)",
            args.command.name(),
            Stage::valid_names()
        );
    };
    let session = AdminSession::connect(target, authorization, timeout).await?;
    let mut client = session.client.clone();
    let output = match args.command {
        AdminCommand::Status => {
            let status = session.status().await?;
            if args.json {
                with_fields(&session.target, status_json(&status)).to_string()
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
                with_fields(&session.target, answer).to_string()
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
                with_fields(&session.target, answer).to_string()
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
                with_fields(&session.target, answer).to_string()
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
                with_fields(&session.target, answer).to_string()
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
                with_fields(&session.target, answer).to_string()
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
                with_fields(&session.target, key_state_json(&key, &response)).to_string()
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
                with_fields(&session.target, answer).to_string()
            } else if response.draining {
                format!(
                    "{}: draining (it finishes in-flight work, commits and exits)",
                    session.target.name()
                )
            } else {
                format!("{}: not draining", session.target.name())
            }
        }
        AdminCommand::AcceptGap {
            topic,
            partition,
            all,
        } => {
            let request = session.request(admin::AcceptGapRequest {
                topic: topic.unwrap_or_default(),
                partition: partition.unwrap_or_default(),
                all,
            });
            let response = session.answer("AcceptGap", client.accept_gap(request)).await?;
            if args.json {
                let gaps: Vec<_> = response.accepted.iter().map(gap_json).collect();
                with_fields(&session.target, json!({ "accepted": gaps })).to_string()
            } else {
                let lines: Vec<String> = response
                    .accepted
                    .iter()
                    .map(|gap| {
                        format!(
                            "{}: accepted the gap of {}/{} ({}, stored next offset {}); it goes on at offset {}",
                            session.target.name(),
                            gap.topic,
                            gap.partition,
                            gap.cause,
                            gap.stored_next,
                            gap.log_start
                        )
                    })
                    .collect();
                lines.join("\n")
            }
        }
    };
    print_out(&output)
}

/// `status` without a stage: asks all five local stages at once — and the further instances of
/// a stage `contrail up --scale` runs (on the stage's ports + 100 per instance) and the knock-on
/// delay extension's deployments (`contrail up --rotation`), which are left out where nothing
/// listens on their port; a stage that cannot answer is shown as down with its error instead of
/// failing the command.
async fn status_of_every_stage(
    port_offset: u16,
    authorization: Option<AsciiMetadataValue>,
    timeout: Duration,
    as_json: bool,
) -> Result<()> {
    let places: Vec<(Stage, u16, u16)> = Stage::every()
        .flat_map(|stage| {
            (0..contrail_common::topology::MAX_LOCAL_INSTANCES).filter_map(move |index| {
                let port = stage.local_port_of(port_offset, index).ok()?;
                Some((stage, index, port))
            })
        })
        .collect();
    let probes = places.iter().map(|&(stage, index, port)| {
        let authorization = authorization.clone();
        let target = Target {
            stage: Some(stage),
            url: local_url(port),
        };
        async move {
            // Nothing listening (a refused connection says so at once): not running, left out.
            // Whatever listens is asked, and shown as down if it does not answer.
            if !always_shown(stage, index) && !listens(port, timeout).await {
                return None;
            }
            let answer = async {
                let session = AdminSession::connect(target, authorization, timeout).await?;
                session.status().await
            };
            Some(answer.await)
        }
    });
    let answers = futures::future::join_all(probes).await;
    let stages_and_answers: Vec<(Stage, String, Result<admin::StatusResponse>)> = places
        .into_iter()
        .zip(answers)
        .filter_map(|((stage, _, port), answer)| Some((stage, local_url(port), answer?)))
        .collect();
    if as_json {
        let lines: Vec<String> = stages_and_answers
            .iter()
            .map(|(stage, url, answer)| summary_json(*stage, url, answer).to_string())
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
    for (stage, _, answer) in &stages_and_answers {
        if let Ok(status) = answer {
            for gap in &status.gaps {
                failures.push(format!(
                    "{} {} HOLDS {}/{} AT A GAP ({}): `contrail admin --stage {} status` shows it, \
                     `contrail admin --stage {} accept-gap --topic {} --partition {}` lets it go on",
                    stage.name(),
                    status.instance,
                    gap.topic,
                    gap.partition,
                    gap.cause,
                    stage.name(),
                    stage.name(),
                    gap.topic,
                    gap.partition
                ));
            }
        }
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

/// Whether `status` shows instance `index` of `stage` (as down) even when nothing listens on its
/// port: the first instance of each pipeline stage; further instances and the extension's
/// deployments run only when `contrail up` was asked for them.
fn always_shown(stage: Stage, index: u16) -> bool {
    index == 0 && Stage::ALL.contains(&stage)
}

/// Whether something accepts TCP connections on `127.0.0.1:port` within `timeout`.
async fn listens(port: u16, timeout: Duration) -> bool {
    let connect = tokio::net::TcpStream::connect(("127.0.0.1", port));
    matches!(tokio::time::timeout(timeout, connect).await, Ok(Ok(_)))
}

/// Writes `text` and a newline to stdout; a closed pipe (`| head`) is an error, not a panic.
fn print_out(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}").context("cannot write to stdout")?;
    stdout.flush().context("cannot write to stdout")
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

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
    fn status_shows_a_pipeline_stage_down_but_leaves_out_what_need_not_run() {
        for stage in Stage::ALL {
            assert!(always_shown(stage, 0), "{}", stage.name());
            assert!(!always_shown(stage, 1), "{}", stage.name());
        }
        for stage in Stage::EXTENSIONS {
            assert!(!always_shown(stage, 0), "{}", stage.name());
        }
        assert_eq!(Stage::every().count(), 7);
    }

    #[tokio::test]
    async fn a_port_listens_while_something_accepts_on_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        assert!(listens(port, Duration::from_secs(5)).await);
        drop(listener);
        assert!(!listens(port, Duration::from_secs(5)).await);
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

        let accept = parse(&[
            "contrail",
            "admin",
            "accept-gap",
            "--topic",
            "t",
            "--partition",
            "3",
        ])
        .expect("parses");
        assert!(
            matches!(&accept.command, AdminCommand::AcceptGap { topic: Some(topic), partition: Some(3), all: false } if topic == "t"),
            "{:?}",
            accept.command
        );
        let all = parse(&["contrail", "admin", "accept-gap", "--all"]).expect("parses");
        assert!(matches!(all.command, AdminCommand::AcceptGap { all: true, .. }));
        parse(&["contrail", "admin", "accept-gap"]).expect_err("a partition or --all");
        parse(&["contrail", "admin", "accept-gap", "--topic", "t"]).expect_err("a topic needs its partition");
        parse(&[
            "contrail",
            "admin",
            "accept-gap",
            "--all",
            "--topic",
            "t",
            "--partition",
            "1",
        ])
        .expect_err("--all or one partition");
    }

    pub(crate) fn sample_status() -> admin::StatusResponse {
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
            gaps: vec![admin::GapStatus {
                topic: "ops.events.accepted".to_owned(),
                partition: 7,
                cause: "retention".to_owned(),
                stored_next: 100,
                log_start: 160,
                log_end: 900,
                records_lost: 60,
                found_at_us: 1_357_016_400_000_000,
            }],
        }
    }
}
