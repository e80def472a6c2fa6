//! What the tasks of `contrail up` share: the platform's processes, the board's status, the
//! progress display and the run's milestones.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use indicatif::MultiProgress;
use tokio::sync::{Notify, RwLock};

use crate::commands::board::BoardMeta;
use crate::local::Platform;
use crate::local::Ports;

/// The running processes, shared by the tasks. A lock poisoned by a task that panicked holding it
/// is recovered: the processes are what they are, and stopping them must still work.
#[derive(Clone)]
pub(super) struct SharedPlatform(Arc<Mutex<Platform>>);

impl SharedPlatform {
    pub(super) fn new(platform: Platform) -> SharedPlatform {
        SharedPlatform(Arc::new(Mutex::new(platform)))
    }

    fn lock(&self) -> MutexGuard<'_, Platform> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `act` on the processes under the lock.
    pub(super) fn with<R>(&self, act: impl FnOnce(&mut Platform) -> R) -> R {
        act(&mut self.lock())
    }

    /// Stops every process (the last handle may also be held by a task still running).
    pub(super) fn shutdown(&self) {
        self.lock().shutdown();
    }
}

/// Milestones of a run, set by one task and watched by the others.
#[derive(Default)]
pub(super) struct Milestones {
    /// The replay has started (chaos starts with it).
    pub(super) replay_running: Notify,
    /// The replay has ended.
    pub(super) replay_done: AtomicBool,
    /// Chaos is over (or was never on).
    pub(super) chaos_done: AtomicBool,
    /// The run is over: the background tasks end.
    pub(super) finished: AtomicBool,
    /// The summary is printed and the platform stays up (chaos, if asked, goes on).
    pub(super) summary_printed: Notify,
}

impl Milestones {
    pub(super) fn is_set(flag: &AtomicBool) -> bool {
        flag.load(Ordering::SeqCst)
    }

    pub(super) fn set(flag: &AtomicBool) {
        flag.store(true, Ordering::SeqCst);
    }
}

/// What every task of a run works with.
#[derive(Clone)]
pub(super) struct Up {
    pub(super) ports: Ports,
    pub(super) workdir: PathBuf,
    pub(super) platform: SharedPlatform,
    pub(super) meta: Arc<RwLock<BoardMeta>>,
    pub(super) multi: MultiProgress,
    pub(super) milestones: Arc<Milestones>,
}

impl Up {
    /// A line above the progress bars, or on stderr when they are hidden (no terminal: logs, CI).
    pub(super) fn say(&self, line: impl Into<String>) {
        say(&self.multi, line);
    }

    /// What the board shows the platform doing.
    pub(super) async fn set_phase(&self, phase: &str) {
        crate::commands::board::set_phase(&self.meta, phase).await;
    }

    /// Whether the run is over.
    pub(super) fn finished(&self) -> bool {
        Milestones::is_set(&self.milestones.finished)
    }
}

/// A line above the progress bars, or on stderr when they are hidden.
pub(super) fn say(multi: &MultiProgress, line: impl Into<String>) {
    let line = line.into();
    if multi.is_hidden() {
        eprintln!("{line}");
    } else {
        let _ = multi.println(line);
    }
}
