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

/// Per-stage lag from the admin API (negative lags — the local broker's high watermark behind
/// the position — count as 0); `None` for a stage that does not answer (restarting).
async fn stage_lags(ports: Ports) -> Vec<(&'static str, Option<i64>)> {
    let mut lags = Vec::new();
    for stage in &STAGES {
        let lag = admin_status(ports, stage)
            .await
            .map(|status| status.partitions.iter().map(|p| p.lag.max(0)).sum::<i64>());
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

fn status_line(lags: &[(&'static str, Option<i64>)], kills: u32, crashes: u32) -> String {
    let parts: Vec<String> = lags
        .iter()
        .map(|(name, lag)| match lag {
            Some(lag) => format!("{name} lag {lag}"),
            None => format!("{name} (restarting)"),
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
        let line = status_line(&[("ingest", Some(0)), ("dedup-state", None)], 3, 1);
        assert_eq!(
            line,
            "ingest lag 0 · dedup-state (restarting) · kills 3 · crashes 1"
        );
    }
}
