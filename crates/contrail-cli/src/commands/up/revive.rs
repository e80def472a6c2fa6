//! Keeps the platform's stages running while `contrail up` runs: a stage that exits on its own
//! is restarted, as Kubernetes would.

use std::time::Duration;

use super::context::Up;
use crate::local::Platform;

/// Restarts a stage that exited on its own (as Kubernetes would), every half second for as long
/// as the platform runs — also after the summary, while the board stays up — until `shutdown`;
/// stops when the broker or the Cosmos endpoint exits (nothing can go on then).
pub(super) fn spawn(up: Up) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let (lines, stop) = up.platform.with(Platform::revive);
            for line in lines {
                up.say(line);
            }
            if stop {
                return;
            }
        }
    })
}
