//! One shutdown signal for the whole process.
//!
//! SIGTERM and Ctrl-C cancel one token; every long-running task is spawned through the tracker so
//! [`Shutdown::wait_for_tasks`] waits until each has finished its batch and committed.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The process-wide shutdown token and task tracker. Clones share both.
#[derive(Clone, Default)]
pub struct Shutdown {
    token: CancellationToken,
    tracker: TaskTracker,
}

impl Shutdown {
    /// A fresh, untriggered shutdown.
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// Cancels the token on SIGTERM or Ctrl-C (SIGINT).
    pub fn install_signal_handlers(&self) {
        let token = self.token.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown signal received, draining");
            token.cancel();
        });
    }

    /// Starts shutdown from inside the process (admin `Drain`, a fatal error).
    pub fn trigger(&self) {
        self.token.cancel();
    }

    /// Whether shutdown has started.
    pub fn is_triggered(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves when shutdown starts.
    pub fn triggered(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.token.clone().cancelled_owned()
    }

    /// The token, for `select!`s.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Spawns a task that shutdown will wait for.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tracker.spawn(task)
    }

    /// Waits until every tracked task has finished, at most `grace`; returns whether all did.
    pub async fn wait_for_tasks(&self, grace: Duration) -> bool {
        self.tracker.close();
        tokio::time::timeout(grace, self.tracker.wait()).await.is_ok()
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = terminate.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C will stop the process");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_for_tracked_tasks_to_finish_their_work() {
        let shutdown = Shutdown::new();
        let (done_sender, done_receiver) = tokio::sync::oneshot::channel();
        let triggered = shutdown.triggered();
        shutdown.spawn(async move {
            triggered.await;
            // Simulates finishing and committing the batch in flight.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = done_sender.send(());
        });
        shutdown.trigger();
        assert!(shutdown.wait_for_tasks(Duration::from_secs(5)).await);
        assert!(done_receiver.await.is_ok(), "task finished before wait returned");
    }

    #[tokio::test]
    async fn grace_period_bounds_the_wait() {
        let shutdown = Shutdown::new();
        shutdown.spawn(tokio::time::sleep(Duration::from_secs(60)));
        assert!(!shutdown.wait_for_tasks(Duration::from_millis(20)).await);
    }
}
