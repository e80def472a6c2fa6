//! The platform's live status: every stage's admin API asked for its lag once a second (shown
//! under the progress bar, on the board, and every 10 s on stderr without a terminal), and the
//! wait for every consumer to own its partitions before the replay starts.

use std::time::{Duration, Instant};

use contrail_proto::admin::v1 as admin;
use indicatif::ProgressBar;
use serde_json::json;

use super::context::Up;
use crate::platform::{Ports, STAGES, StageSpec};

/// How long the consumers have to own their partitions before the replay starts.
pub(super) const ASSIGNMENT_TIMEOUT: Duration = Duration::from_secs(180);

/// A stage's admin status, `None` when it does not answer within a second (restarting).
async fn admin_status(ports: Ports, stage: &StageSpec) -> Option<admin::StatusResponse> {
    let url = format!("http://127.0.0.1:{}", ports.grpc(stage));
    let channel = tonic::transport::Endpoint::from_shared(url)
        .ok()?
        .connect_timeout(Duration::from_millis(300))
        .timeout(Duration::from_millis(700))
        .connect()
        .await
        .ok()?;
    let mut client = admin::admin_service_client::AdminServiceClient::new(channel);
    Some(client.status(admin::StatusRequest {}).await.ok()?.into_inner())
}

/// What the status line says about one stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StageLag {
    /// It does not answer (restarting).
    Restarting,
    /// A consumer that owns no input partition (changefeed-sync: no lease): it consumes nothing,
    /// whatever its lag reads — in the large chaos run a broken group coordinator left every
    /// group like this while the lags read 0.
    OwnsNothing,
    /// Its lag over the partitions it owns (negative lags — the local broker's high watermark
    /// behind the position — count as 0).
    Lag(i64),
}

/// Every stage's lag from its admin API.
async fn stage_lags(ports: Ports) -> Vec<(&'static str, StageLag)> {
    let mut lags = Vec::new();
    for stage in &STAGES {
        let lag = match admin_status(ports, stage).await {
            None => StageLag::Restarting,
            Some(status)
                if stage.name != "ingest" && status.partitions.is_empty() && status.leases.is_empty() =>
            {
                StageLag::OwnsNothing
            }
            Some(status) => StageLag::Lag(status.partitions.iter().map(|p| p.lag.max(0)).sum()),
        };
        lags.push((stage.name, lag));
    }
    lags
}

/// Waits until every stage is ready and every consumer owns its partitions (changefeed-sync: its
/// leases), so the replay does not start into a group join.
pub(super) async fn wait_assigned(ports: Ports, timeout: Duration) -> Vec<&'static str> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut waiting = Vec::new();
        for stage in &STAGES {
            let settled = admin_status(ports, stage).await.map(|status| {
                status.ready
                    && (stage.name == "ingest" || !status.partitions.is_empty() || !status.leases.is_empty())
            });
            if settled != Some(true) {
                waiting.push(stage.name);
            }
        }
        if waiting.is_empty() || Instant::now() > deadline {
            return waiting;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn status_line(lags: &[(&'static str, StageLag)], kills: u32, crashes: u32) -> String {
    let parts: Vec<String> = lags
        .iter()
        .map(|(name, lag)| match lag {
            StageLag::Lag(lag) => format!("{name} lag {lag}"),
            StageLag::OwnsNothing => format!("{name} OWNS NO PARTITION"),
            StageLag::Restarting => format!("{name} (restarting)"),
        })
        .collect();
    format!("{} · kills {kills} · crashes {crashes}", parts.join(" · "))
}

/// Asks every stage for its lag once a second until the run is over.
pub(super) fn spawn(up: Up, status: ProgressBar, bar: ProgressBar) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last_report = Instant::now();
        while !up.finished() {
            let lags = stage_lags(up.ports).await;
            let (kills, crashes) = up
                .platform
                .with(|platform| (platform.kills().values().sum::<u32>(), platform.crashes()));
            let line = status_line(&lags, kills, crashes);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_names_restarting_stages() {
        let line = status_line(
            &[
                ("ingest", StageLag::Lag(0)),
                ("dedup-state", StageLag::Restarting),
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
    fn the_status_line_shouts_when_a_consumer_owns_nothing() {
        let line = status_line(
            &[
                ("dedup-state", StageLag::OwnsNothing),
                ("cosmos-writer", StageLag::Lag(12)),
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
