//! Chaos: `kill -9` of one stage per interval (seeded rounds, so every stage is hit equally
//! often), and among those kills the broker restarts and dedup-state volume losses asked for;
//! from the start of the replay until it is done and every stage was killed often enough; then,
//! while the platform stays up after the summary, a `kill -9` per interval again.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use super::context::{Milestones, Up};
use super::supervisor::Platform;
use crate::platform::{ChaosPlan, STAGES};

/// What chaos is asked to do.
pub(super) struct ChaosSettings {
    /// Time between strikes.
    pub(super) interval: Duration,
    /// Kills per stage before chaos may stop (after the replay).
    pub(super) min_kills: u32,
    /// Seed of the victims' order.
    pub(super) seed: u64,
    /// Broker restarts to do.
    pub(super) broker_restarts: u32,
    /// dedup-state volume losses to do.
    pub(super) volume_losses: u32,
    /// Go on killing after the summary, for as long as the platform runs.
    pub(super) after_summary: bool,
}

/// What chaos does next: mostly `kill -9` of one stage (seeded rounds over every stage), and
/// spread among those kills the broker restarts and dedup-state volume losses asked for.
struct Chaos {
    plan: ChaosPlan,
    tick: u64,
    broker_restarts_left: u32,
    volume_losses_left: u32,
    /// dedup-state's shard directories (deleted by a volume loss).
    shards: PathBuf,
}

impl Chaos {
    /// Strikes once; returns the line that says what happened.
    fn strike(&mut self, platform: &mut Platform) -> String {
        self.tick += 1;
        if self.volume_losses_left > 0 && self.tick % 9 == 4 {
            self.volume_losses_left -= 1;
            let shards = self.shards.clone();
            let Some(dedup) = platform
                .stages
                .iter_mut()
                .find(|stage| stage.name == "dedup-state")
            else {
                return "chaos: no dedup-state to take the volume of".to_owned();
            };
            return match dedup.kill9_then_restart(|| {
                std::fs::remove_dir_all(&shards).with_context(|| format!("deleting {}", shards.display()))
            }) {
                Ok(()) => {
                    platform.volume_losses += 1;
                    format!(
                        "chaos: kill -9 dedup-state and delete its volume ({}) → restarted as pid {}: it restores the newest checkpoint",
                        self.shards.display(),
                        dedup.pid()
                    )
                }
                Err(error) => format!("chaos: volume loss of dedup-state failed: {error:#}"),
            };
        }
        if self.broker_restarts_left > 0 && self.tick % 13 == 6 {
            self.broker_restarts_left -= 1;
            let pid = platform.broker.pid();
            return match platform.broker.stop_and_restart(Duration::from_secs(10)) {
                Ok(()) => {
                    platform.broker_restarts += 1;
                    format!(
                        "chaos: restart the broker (pid {pid}) → pid {}; its data is on disk",
                        platform.broker.pid()
                    )
                }
                Err(error) => format!("chaos: restarting the broker failed: {error:#}"),
            };
        }
        let stage = &mut platform.stages[self.plan.next_victim()];
        let pid = stage.pid();
        let uptime = stage.started.elapsed();
        match stage.kill9_and_restart() {
            Ok(()) => format!(
                "chaos: kill -9 {} (pid {pid}, up {:.1} s) → restarted as pid {}",
                stage.name,
                uptime.as_secs_f64(),
                stage.pid()
            ),
            Err(error) => format!("chaos: restarting {} failed: {error:#}", stage.name),
        }
    }
}

/// Strikes every `interval` from the start of the replay until it is done and chaos did all it
/// was asked; then marks chaos done (the checks may settle). With `after_summary`, strikes again
/// once the summary is printed, until the platform stops.
pub(super) fn spawn(up: Up, settings: ChaosSettings) -> tokio::task::JoinHandle<()> {
    let mut chaos = Chaos {
        plan: ChaosPlan::new(settings.seed, STAGES.len()),
        tick: 0,
        broker_restarts_left: settings.broker_restarts,
        volume_losses_left: settings.volume_losses,
        shards: up.workdir.join("shards"),
    };
    tokio::spawn(async move {
        // Chaos starts with the replay (the consumers have joined their groups by then).
        up.milestones.replay_running.notified().await;
        tokio::time::sleep(settings.interval).await;
        let mut after_summary = false;
        loop {
            let line = up.platform.with(|platform| {
                if platform.stopping {
                    return None; // shutting down (Ctrl-C or a failed replay): restart nothing
                }
                if after_summary {
                    return Some(chaos.strike(platform));
                }
                let enough = platform
                    .stages
                    .iter()
                    .all(|stage| stage.kills >= settings.min_kills)
                    && chaos.broker_restarts_left == 0
                    && chaos.volume_losses_left == 0;
                if Milestones::is_set(&up.milestones.replay_done) && enough {
                    Milestones::set(&up.milestones.chaos_done);
                    return Some("chaos: every stage was killed enough times; stopping chaos".to_owned());
                }
                Some(chaos.strike(platform))
            });
            let Some(line) = line else {
                return;
            };
            let over = line.ends_with("stopping chaos");
            up.say(line);
            if over {
                if !settings.after_summary {
                    return;
                }
                up.milestones.summary_printed.notified().await;
                up.say(format!(
                    "chaos: going on while the platform runs — a kill -9 every {:.1} s (Ctrl-C stops)",
                    settings.interval.as_secs_f64()
                ));
                after_summary = true;
            }
            tokio::time::sleep(settings.interval).await;
        }
    })
}
