//! Keeps the platform's stages running while `contrail up` runs: a stage that exits on its own
//! is restarted, as Kubernetes would.

use std::time::Duration;

use super::context::Up;

/// Restarts a stage that exited on its own (as Kubernetes would), every half second for as long
/// as the platform runs — also after the summary, while the board stays up — until `shutdown`;
/// stops when the broker or the Cosmos endpoint exits (nothing can go on then).
pub(super) fn spawn(up: Up) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let lines = up.platform.with(|platform| {
                let mut lines = Vec::new();
                if platform.stopping {
                    return (lines, true);
                }
                for stage in &mut platform.stages {
                    match stage.revive() {
                        Ok(Some(status)) => {
                            lines.push(format!("{} exited ({status}); restarted", stage.name))
                        }
                        Ok(None) => {}
                        Err(error) => lines.push(format!("{} cannot be restarted: {error:#}", stage.name)),
                    }
                }
                if let Some(status) = platform.broker.exited() {
                    lines.push(format!("the local broker exited ({status})"));
                    return (lines, true);
                }
                if let Some(status) = platform.cosmos.exited() {
                    lines.push(format!("the local Cosmos endpoint exited ({status})"));
                    return (lines, true);
                }
                (lines, false)
            });
            let (lines, stop) = lines;
            for line in lines {
                up.say(line);
            }
            if stop {
                return;
            }
        }
    })
}
