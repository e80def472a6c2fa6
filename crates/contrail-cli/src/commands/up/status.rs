//! The platform's live status: every stage's admin API asked for its lag once a second (shown
//! under the progress bar, on the board, and every 10 s on stderr without a terminal), and the
//! wait for every consumer to own its partitions before the replay starts.

use std::time::{Duration, Instant};

use contrail_proto::admin::v1 as admin;
use indicatif::ProgressBar;
use serde_json::json;

use super::context::Up;
use crate::local::{Ports, Replica};

/// How long the consumers have to own their partitions before the replay starts.
pub(super) const ASSIGNMENT_TIMEOUT: Duration = Duration::from_secs(180);

/// How long a stage's admin API has to answer the status line: under a backlog a stage's admin
/// API answers late (its status reads every owned partition), and late is not down.
const STATUS_TIMEOUT: Duration = Duration::from_millis(2_500);

/// A stage whose process started this recently and does not answer yet is restarting.
const RESTART_GRACE: Duration = Duration::from_secs(30);

/// An instance's admin status, `None` when it does not answer within `timeout`.
async fn admin_status(ports: Ports, replica: &Replica, timeout: Duration) -> Option<admin::StatusResponse> {
    let url = format!("http://127.0.0.1:{}", ports.grpc_of(replica));
    let channel = tonic::transport::Endpoint::from_shared(url)
        .ok()?
        .connect_timeout(Duration::from_millis(300))
        .timeout(timeout)
        .connect()
        .await
        .ok()?;
    let mut client = admin::admin_service_client::AdminServiceClient::new(channel);
    Some(client.status(admin::StatusRequest {}).await.ok()?.into_inner())
}

/// Every instance's admin status, asked of all at once.
async fn every_status(ports: Ports, replicas: &[Replica]) -> Vec<Option<admin::StatusResponse>> {
    futures::future::join_all(
        replicas
            .iter()
            .map(|replica| admin_status(ports, replica, STATUS_TIMEOUT)),
    )
    .await
}

/// What the status line says about one instance of a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StageLag {
    /// It does not answer, and its process started less than [`RESTART_GRACE`] ago.
    Restarting,
    /// It does not answer although its process has been running for a while (hung, or too
    /// busy to answer within [`STATUS_TIMEOUT`]).
    NotAnswering,
    /// A consumer that owns no input partition (changefeed-sync: no lease): it consumes nothing,
    /// whatever its lag reads — in the large chaos run a broken group coordinator left every
    /// group like this while the lags read 0.
    OwnsNothing,
    /// A changefeed-sync instance without a lease while another instance holds them (more
    /// instances than feed ranges): it takes over a lease its owner stops renewing.
    StandingBy,
    /// Its lag over the partitions it owns (negative lags — the local broker's high watermark
    /// behind the position — count as 0).
    Lag(i64),
}

/// Whether an instance that owns nothing is the change feed's standby: another instance of
/// changefeed-sync holds the leases.
fn standing_by(replicas: &[Replica], owns: &[Option<bool>], index: usize) -> bool {
    replicas[index].stage.name == "changefeed-sync"
        && replicas
            .iter()
            .zip(owns)
            .any(|(other, owns)| other.stage.name == "changefeed-sync" && *owns == Some(true))
}

/// Whether an instance's status says it owns input (always for ingest, which has none):
/// partitions, or a lease of the change feed held under its own name (its lease board also
/// shows leases it lost or saw free).
fn owns_input(replica: &Replica, status: &admin::StatusResponse) -> bool {
    replica.stage.name == "ingest"
        || !status.partitions.is_empty()
        || status.leases.iter().any(|lease| lease.owner == status.instance)
}

/// Every instance's lag from its admin API, asked of all at once; `running_for` says how long
/// each instance's current process has been running (a silent one is restarting only if recent).
async fn stage_lags(
    ports: Ports,
    replicas: &[Replica],
    running_for: impl Fn(&str) -> Duration,
) -> Vec<(String, StageLag)> {
    let answers = every_status(ports, replicas).await;
    let owns: Vec<Option<bool>> = replicas
        .iter()
        .zip(&answers)
        .map(|(replica, answer)| answer.as_ref().map(|status| owns_input(replica, status)))
        .collect();
    replicas
        .iter()
        .zip(answers)
        .enumerate()
        .map(|(index, (replica, answer))| {
            let name = replica.name();
            let lag = match answer {
                None if running_for(&name) < RESTART_GRACE => StageLag::Restarting,
                None => StageLag::NotAnswering,
                Some(status) if !owns_input(replica, &status) => {
                    if standing_by(replicas, &owns, index) {
                        StageLag::StandingBy
                    } else {
                        StageLag::OwnsNothing
                    }
                }
                Some(status) => StageLag::Lag(status.partitions.iter().map(|p| p.lag.max(0)).sum()),
            };
            (name, lag)
        })
        .collect()
}

/// Waits until every instance is ready and every consumer owns its partitions (changefeed-sync:
/// one instance holds the leases), so the replay does not start into a group join. Returns the
/// instances still waiting when `timeout` ran out.
pub(super) async fn wait_assigned(ports: Ports, replicas: &[Replica], timeout: Duration) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let answers = every_status(ports, replicas).await;
        let owns: Vec<Option<bool>> = replicas
            .iter()
            .zip(&answers)
            .map(|(replica, answer)| {
                answer
                    .as_ref()
                    .map(|status| status.ready && owns_input(replica, status))
            })
            .collect();
        let waiting: Vec<String> = replicas
            .iter()
            .zip(&answers)
            .enumerate()
            .filter(|(index, (_, answer))| {
                let ready = answer.as_ref().is_some_and(|status| status.ready);
                !ready || (owns[*index] != Some(true) && !standing_by(replicas, &owns, *index))
            })
            .map(|(_, (replica, _))| replica.name())
            .collect();
        if waiting.is_empty() || Instant::now() > deadline {
            return waiting;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn status_line(lags: &[(String, StageLag)], kills: u32, crashes: u32) -> String {
    let parts: Vec<String> = lags
        .iter()
        .map(|(name, lag)| match lag {
            StageLag::Lag(lag) => format!("{name} lag {lag}"),
            StageLag::OwnsNothing => format!("{name} OWNS NO PARTITION"),
            StageLag::StandingBy => format!("{name} standing by"),
            StageLag::Restarting => format!("{name} (restarting)"),
            StageLag::NotAnswering => format!("{name} (not answering)"),
        })
        .collect();
    format!("{} · kills {kills} · crashes {crashes}", parts.join(" · "))
}

/// The status line once: every stage asked, the kill and crash counts added.
async fn current_line(up: &Up) -> (String, u32, u32) {
    let (running_for, replicas) = up.platform.with(|platform| {
        let running_for = platform
            .stages
            .iter()
            .map(|stage| (stage.name.clone(), stage.started.elapsed()))
            .collect::<Vec<_>>();
        (running_for, platform.replicas.clone())
    });
    let lags = stage_lags(up.ports, &replicas, |name| {
        running_for
            .iter()
            .find(|(stage, _)| stage == name)
            .map_or(Duration::ZERO, |(_, running)| *running)
    })
    .await;
    let (kills, crashes) = up
        .platform
        .with(|platform| (platform.kills().values().sum::<u32>(), platform.crashes()));
    (status_line(&lags, kills, crashes), kills, crashes)
}

/// Asks every stage for its lag once a second until the run is over.
pub(super) fn spawn(up: Up, status: ProgressBar, bar: ProgressBar) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last_report = Instant::now();
        while !up.finished() {
            let (line, kills, crashes) = current_line(&up).await;
            // Without a terminal (logs, CI) the bars are hidden: a line every 10 s instead.
            if up.multi.is_hidden() && last_report.elapsed() >= Duration::from_secs(10) {
                last_report = Instant::now();
                eprintln!(
                    "replay {}/{} events · {line}",
                    bar.position(),
                    bar.length().unwrap_or(0)
                );
            }
            status.set_message(line.clone());
            status.tick();
            up.meta.write().await.status = json!({ "line": line, "kills": kills, "crashes": crashes });
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// After the run: keeps the board's status line current (the terminal shows the summary) for as
/// long as the platform runs.
pub(super) fn spawn_for_the_board(up: Up) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !up.platform.with(|platform| platform.stopping) {
            let (line, kills, crashes) = current_line(&up).await;
            up.meta.write().await.status = json!({ "line": line, "kills": kills, "crashes": crashes });
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_names_restarting_stages() {
        let line = status_line(
            &[
                ("ingest".to_owned(), StageLag::Lag(0)),
                ("dedup-state".to_owned(), StageLag::Restarting),
            ],
            3,
            1,
        );
        assert_eq!(
            line,
            "ingest lag 0 · dedup-state (restarting) · kills 3 · crashes 1"
        );
    }

    #[test]
    fn a_silent_stage_is_restarting_only_right_after_its_start() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        // Nothing listens on 56090-56194 (the ephemeral range, where only outgoing connections
        // take ports; the tests' platforms stay below 32,000): every stage is refused at once.
        let ports = Ports { offset: 47_000 };
        let replicas = crate::local::Scale::default().replicas();
        let lags = runtime.block_on(stage_lags(ports, &replicas, |name| {
            if name == "dedup-state" {
                Duration::from_secs(3)
            } else {
                Duration::from_secs(600)
            }
        }));
        assert_eq!(lags[1], ("dedup-state".to_owned(), StageLag::Restarting));
        assert_eq!(lags[0], ("ingest".to_owned(), StageLag::NotAnswering));
        assert_eq!(
            status_line(&lags[..2], 1, 0),
            "ingest (not answering) · dedup-state (restarting) · kills 1 · crashes 0"
        );
    }

    #[test]
    fn a_changefeed_instance_without_a_lease_stands_by_only_while_another_holds_them() {
        let scale = crate::local::Scale::new(&[
            crate::local::parse_scale("changefeed-sync=2").expect("parses"),
            crate::local::parse_scale("cosmos-writer=2").expect("parses"),
        ]);
        let replicas = scale.replicas();
        let names: Vec<String> = replicas.iter().map(Replica::name).collect();
        let at = |name: &str| names.iter().position(|n| n == name).expect(name);
        let mut owns = vec![Some(true); replicas.len()];
        owns[at("changefeed-sync-1")] = Some(false);
        owns[at("cosmos-writer-1")] = Some(false);
        assert!(standing_by(&replicas, &owns, at("changefeed-sync-1")));
        assert!(
            !standing_by(&replicas, &owns, at("cosmos-writer-1")),
            "a Kafka consumer owning nothing is not a standby"
        );
        owns[at("changefeed-sync-0")] = None; // down
        assert!(
            !standing_by(&replicas, &owns, at("changefeed-sync-1")),
            "nobody holds the leases: not standing by, owning nothing"
        );
    }

    #[test]
    fn the_status_line_shouts_when_a_consumer_owns_nothing() {
        let line = status_line(
            &[
                ("dedup-state".to_owned(), StageLag::OwnsNothing),
                ("cosmos-writer".to_owned(), StageLag::Lag(12)),
            ],
            0,
            0,
        );
        assert_eq!(
            line,
            "dedup-state OWNS NO PARTITION · cosmos-writer lag 12 · kills 0 · crashes 0"
        );
    }
}
