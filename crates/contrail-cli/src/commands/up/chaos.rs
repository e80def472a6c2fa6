//! Chaos: `kill -9` of one stage instance per interval (seeded rounds, so every instance is hit
//! equally often), and among those kills the broker restarts, dedup-state volume losses and a freeze
//! of the local Cosmos endpoint (SIGSTOP, then SIGCONT) asked for;
//! from the start of the replay until it is done and every stage was killed often enough; then,
//! while the platform stays up after the summary, a `kill -9` per interval again.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::context::{Milestones, Up};
use crate::local::Platform;
use crate::local::{ChaosPlan, send_signal, shard_dir};

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
    /// Freeze the local Cosmos endpoint once for this long (SIGSTOP, then SIGCONT).
    pub(super) cosmos_freeze: Option<Duration>,
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
    /// The platform's working directory (dedup-state's shard directories and checkpoints are
    /// under it).
    workdir: PathBuf,
    /// The first tick the next volume loss may strike.
    next_volume_loss: u64,
    /// The Cosmos endpoint freeze still to do.
    cosmos_freeze_left: Option<Duration>,
    /// When the frozen Cosmos endpoint is thawed.
    thaw_at: Option<Instant>,
}

/// Ticks between volume losses.
const VOLUME_LOSS_EVERY: u64 = 9;

/// The newest epoch in `checkpoints` with a manifest (a complete checkpoint a lost volume is
/// restored from).
fn newest_complete_epoch(checkpoints: &std::path::Path) -> Option<String> {
    std::fs::read_dir(checkpoints)
        .ok()?
        .filter_map(Result::ok)
        .filter(|entry| entry.path().join("MANIFEST.json").is_file())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .max()
}

impl Chaos {
    /// Strikes once; returns the line that says what happened.
    fn strike(&mut self, platform: &mut Platform) -> String {
        self.tick += 1;
        // A volume loss waits for a complete checkpoint (so the restore is what it exercises),
        // at most three rounds; without one the stage reprocesses its partitions from the start.
        let checkpoint = newest_complete_epoch(&self.workdir.join("checkpoints"));
        if self.volume_losses_left > 0
            && self.tick >= self.next_volume_loss
            && (checkpoint.is_some() || self.tick >= self.next_volume_loss + 3 * VOLUME_LOSS_EVERY)
        {
            self.volume_losses_left -= 1;
            self.next_volume_loss = self.tick + VOLUME_LOSS_EVERY;
            let restores = match &checkpoint {
                Some(epoch) => format!("it restores the newest complete checkpoint ({epoch} or newer)"),
                None => "no complete checkpoint yet: it reprocesses its partitions from the start".to_owned(),
            };
            // The instances of dedup-state in turn.
            let instances: Vec<usize> = platform
                .replicas
                .iter()
                .enumerate()
                .filter(|(_, replica)| replica.stage.name == "dedup-state")
                .map(|(index, _)| index)
                .collect();
            let Some(&victim) = instances.get(platform.volume_losses as usize % instances.len().max(1))
            else {
                return "chaos: no dedup-state to take the volume of".to_owned();
            };
            let shards = shard_dir(&self.workdir, &platform.replicas[victim]);
            let dedup = &mut platform.stages[victim];
            return match dedup.kill9_then_restart(|| {
                std::fs::remove_dir_all(&shards).with_context(|| format!("deleting {}", shards.display()))
            }) {
                Ok(()) => {
                    let line = format!(
                        "chaos: kill -9 {} and delete its volume ({}) → restarted as pid {}: {restores}",
                        dedup.name,
                        shards.display(),
                        dedup.pid()
                    );
                    platform.volume_losses += 1;
                    line
                }
                Err(error) => format!("chaos: volume loss of {} failed: {error:#}", dedup.name),
            };
        }
        if let Some(freeze) = self.cosmos_freeze_left
            && self.tick % 11 == 5
        {
            self.cosmos_freeze_left = None;
            self.thaw_at = Some(Instant::now() + freeze);
            let pid = platform.cosmos.pid();
            send_signal(pid, libc::SIGSTOP);
            platform.cosmos_freezes += 1;
            return format!(
                "chaos: freeze cosmos-dev (pid {pid}, SIGSTOP) for {:.0} s: the serving store stops answering",
                freeze.as_secs_f64()
            );
        }
        if self.broker_restarts_left > 0 && self.tick % 13 == 6 {
            self.broker_restarts_left -= 1;
            let pid = platform.broker.pid();
            return match platform.broker.kill9_and_restart() {
                Ok(()) => {
                    platform.broker_restarts += 1;
                    format!(
                        "chaos: kill -9 the broker (pid {pid}), restarted as pid {}; its data is on disk",
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

impl Chaos {
    /// Thaws the frozen Cosmos endpoint once its time is up (or at once when `now` is set: the
    /// platform is stopping and a stopped process would not hear its SIGTERM).
    fn thaw_if_due(&mut self, platform: &Platform, now: bool) -> Option<String> {
        let due = self.thaw_at?;
        if !now && Instant::now() < due {
            return None;
        }
        self.thaw_at = None;
        let pid = platform.cosmos.pid();
        send_signal(pid, libc::SIGCONT);
        Some(format!("chaos: thaw cosmos-dev (pid {pid}, SIGCONT)"))
    }

    /// Whether every freeze asked for is done and thawed.
    fn thawed(&self) -> bool {
        self.cosmos_freeze_left.is_none() && self.thaw_at.is_none()
    }
}

/// Strikes every `interval` from the start of the replay until it is done and chaos did all it
/// was asked; then marks chaos done (the checks may settle). With `after_summary`, strikes again
/// once the summary is printed, until the platform stops.
pub(super) fn spawn(up: Up, settings: ChaosSettings) -> tokio::task::JoinHandle<()> {
    let instances = up.platform.with(|platform| platform.stages.len());
    let mut chaos = Chaos {
        plan: ChaosPlan::new(settings.seed, instances),
        tick: 0,
        broker_restarts_left: settings.broker_restarts,
        volume_losses_left: settings.volume_losses,
        workdir: up.workdir.clone(),
        next_volume_loss: 4,
        cosmos_freeze_left: settings.cosmos_freeze,
        thaw_at: None,
    };
    tokio::spawn(async move {
        // Chaos starts with the replay (the consumers have joined their groups by then).
        up.milestones.replay_running.notified().await;
        tokio::time::sleep(settings.interval).await;
        let mut after_summary = false;
        loop {
            let (thawed, line) = up.platform.with(|platform| {
                let thawed = chaos.thaw_if_due(platform, platform.stopping);
                if platform.stopping {
                    return (thawed, None); // shutting down (Ctrl-C or a failed replay): restart nothing
                }
                if after_summary {
                    return (thawed, Some(chaos.strike(platform)));
                }
                let enough = platform
                    .stages
                    .iter()
                    .all(|stage| stage.kills >= settings.min_kills)
                    && chaos.broker_restarts_left == 0
                    && chaos.volume_losses_left == 0
                    && chaos.thawed();
                if Milestones::is_set(&up.milestones.replay_done) && enough {
                    Milestones::set(&up.milestones.chaos_done);
                    let over = "chaos: every stage was killed enough times; stopping chaos".to_owned();
                    return (thawed, Some(over));
                }
                (thawed, Some(chaos.strike(platform)))
            });
            if let Some(thawed) = thawed {
                up.say(thawed);
            }
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
