//! What dedup-state answers in the admin API (`contrail.admin.v1.AdminService`, served by
//! [`contrail_common::admin::AdminApi`]): its status, checkpoints and key state, and which gaps it
//! refuses to accept.

use std::sync::Arc;
use std::time::Duration;

use contrail_common::admin::{AdminControls, StageAdmin, StageStatus};
use contrail_common::consume::gaps::{GapCause, Held};
use contrail_flight::document::flight_document;
use contrail_flight::flight;
use contrail_proto::admin::v1 as admin;
use contrail_proto::state::v1::FlightKeyState;
use contrail_state::checkpoints::CheckpointStore;
use contrail_state::{StateError, TimeDomain};
use rdkafka::consumer::{BaseConsumer, Consumer};
use tonic::Status;

use crate::checkpointing::{Coordinator, RoundOutcome};
use crate::metrics::DedupMetrics;
use crate::processor::FLIGHT_STATE;
use crate::shards::ShardSet;

/// dedup-state's part of the admin service.
pub struct DedupAdmin {
    /// Instance name.
    pub instance: String,
    /// Input topic.
    pub input_topic: String,
    /// The shards.
    pub shards: Arc<ShardSet>,
    /// A group-less consumer for high watermarks.
    pub watermarks: Arc<BaseConsumer>,
    /// The coordinator, when this instance runs it.
    pub coordinator: Option<Arc<Coordinator>>,
    /// The checkpoint store.
    pub store: CheckpointStore,
    /// The controls (for the uptime).
    pub controls: AdminControls,
    /// Metrics.
    pub metrics: DedupMetrics,
    /// The time rules (lateness, TTLs).
    pub rules: contrail_flight::flight::Rules,
}

fn internal(error: impl std::fmt::Display) -> Status {
    Status::internal(error.to_string())
}

#[tonic::async_trait]
impl StageStatus for DedupAdmin {
    async fn status(&self) -> Result<admin::StatusResponse, Status> {
        let shards = self.shards.status();
        let consumer = self.watermarks.clone();
        let topic = self.input_topic.clone();
        let partitions: Vec<i32> = shards.iter().map(|shard| shard.partition).collect();
        let highs = tokio::task::spawn_blocking(move || {
            partitions
                .iter()
                .map(|partition| {
                    consumer
                        .fetch_watermarks(&topic, *partition, Duration::from_secs(2))
                        .map(|(_, high)| high)
                        .unwrap_or(-1)
                })
                .collect::<Vec<i64>>()
        })
        .await
        .map_err(internal)?;
        let partitions = shards
            .iter()
            .zip(highs)
            .map(|(shard, high)| admin::PartitionStatus {
                topic: self.input_topic.clone(),
                partition: shard.partition,
                committed_offset: shard.next_offset,
                high_watermark: high,
                lag: contrail_common::kafka::partition_lag(high, shard.next_offset),
                state_bytes: shard.state_bytes,
            })
            .collect();
        let verdict = |name: &str| self.metrics.verdicts.with_label_values(&[name]).get() as f64;
        let counters = [
            ("records_total".to_owned(), self.metrics.records.get() as f64),
            ("events_accepted_total".to_owned(), verdict("accepted")),
            ("duplicates_total".to_owned(), verdict("duplicate")),
            (
                "late_events_total".to_owned(),
                verdict("late") + verdict("late_expired"),
            ),
            ("late_expired_total".to_owned(), verdict("late_expired")),
            ("invalid_records_total".to_owned(), verdict("invalid")),
            ("implausible_records_total".to_owned(), verdict("implausible")),
            ("states_too_large_total".to_owned(), verdict("state_too_large")),
            ("flights_full_total".to_owned(), verdict("flight_full")),
            (
                "timers_fired_total".to_owned(),
                self.metrics.timers_fired.get() as f64,
            ),
            ("evicted_total".to_owned(), self.metrics.evicted.get() as f64),
            ("commits_total".to_owned(), self.metrics.commits.get() as f64),
            (
                "outputs_resent_total".to_owned(),
                self.metrics.outputs_resent.get() as f64,
            ),
            ("restores_total".to_owned(), self.metrics.restores.get() as f64),
        ]
        .into_iter()
        .collect();
        let uptime = self.controls.uptime_seconds();
        Ok(admin::StatusResponse {
            instance: self.instance.clone(),
            uptime_seconds: uptime as i64,
            partitions,
            counters,
            events_per_second: self.metrics.records.get() as f64 / uptime,
            sources: Vec::new(),
            in_flight: self.shards.unacknowledged() as u64,
            leases: Vec::new(),
            ..admin::StatusResponse::default()
        })
    }
}

#[tonic::async_trait]
impl StageAdmin for DedupAdmin {
    async fn trigger_checkpoint(&self) -> Result<admin::TriggerCheckpointResponse, Status> {
        let Some(coordinator) = &self.coordinator else {
            return Err(Status::failed_precondition(
                "this instance does not run the checkpoint coordinator (checkpoint.coordinator = false); ask the one that does",
            ));
        };
        match coordinator.round().await {
            Ok(RoundOutcome::Complete { epoch, .. }) => Ok(admin::TriggerCheckpointResponse { epoch }),
            Ok(RoundOutcome::Incomplete { epoch, missing }) => Err(Status::unavailable(format!(
                "epoch {epoch} incomplete: partitions {missing:?} did not acknowledge (owner unreachable or rebalancing)"
            ))),
            Err(error) => Err(Status::unavailable(error.to_string())),
        }
    }

    async fn list_checkpoints(&self) -> Result<admin::ListCheckpointsResponse, Status> {
        let epochs = self.store.epochs().await.map_err(internal)?;
        let manifests = self.store.manifests().await.map_err(internal)?;
        let checkpoints = epochs
            .iter()
            .rev()
            .map(
                |epoch| match manifests.iter().find(|manifest| manifest.epoch == *epoch) {
                    Some(manifest) => admin::CheckpointInfo {
                        epoch: *epoch,
                        complete: manifest.is_complete(),
                        created_at_us: manifest.created_at_us,
                        partitions: manifest
                            .shards
                            .values()
                            .map(|shard| admin::PartitionStatus {
                                topic: self.input_topic.clone(),
                                partition: shard.partition,
                                committed_offset: shard.next_offset,
                                ..Default::default()
                            })
                            .collect(),
                    },
                    None => admin::CheckpointInfo {
                        epoch: *epoch,
                        complete: false,
                        ..Default::default()
                    },
                },
            )
            .collect();
        Ok(admin::ListCheckpointsResponse { checkpoints })
    }

    async fn restore_checkpoint(
        &self,
        request: admin::RestoreCheckpointRequest,
    ) -> Result<admin::RestoreCheckpointResponse, Status> {
        let epoch = request.epoch;
        let manifests = self.store.manifests().await.map_err(internal)?;
        let Some(manifest) = manifests
            .iter()
            .find(|manifest| manifest.epoch == epoch && manifest.is_complete())
        else {
            return Err(Status::not_found(format!(
                "epoch {epoch} has no complete manifest (see ListCheckpoints)"
            )));
        };
        // Restoring in place would race the processing thread; the supported procedure is the one
        // a new pod follows anyway: stop the instance, delete its shard directories, start it —
        // each shard then restores the newest complete checkpoint. Refuse anything else clearly.
        let newest = manifests
            .iter()
            .filter(|m| m.is_complete())
            .map(|m| m.epoch)
            .max()
            .unwrap_or(0);
        Ok(admin::RestoreCheckpointResponse {
            accepted: false,
            message: format!(
                "epoch {} covers partitions {:?}; a shard restores the newest complete epoch ({newest}) when its \
                 local directory is missing: stop this instance, delete {} and start it again",
                manifest.epoch,
                manifest.partitions,
                self.shards.state_dir().join("shard-<partition>").display()
            ),
        })
    }

    async fn read_key_state(
        &self,
        request: admin::ReadKeyStateRequest,
    ) -> Result<admin::ReadKeyStateResponse, Status> {
        let key = request.key;
        let rules = self.rules;
        let lateness = rules.allowed_lateness_us;
        let found = self
            .shards
            .with_shards(
                |shards| -> Result<Option<admin::ReadKeyStateResponse>, StateError> {
                    for shard in shards {
                        let read = contrail_state::inspect(shard, key.as_bytes(), lateness, |context| {
                            let state: Option<FlightKeyState> = context.get(FLIGHT_STATE)?;
                            let service_end = crate::processor::flight_service_end(key.as_bytes());
                            let horizon = flight::horizon_us(service_end, state.as_ref(), &rules);
                            let mut dedup: Vec<String> = state
                                .as_ref()
                                .map(|state| {
                                    flight::live_dedup_entries(state, horizon, context.watermark_us())
                                })
                                .unwrap_or_default()
                                .into_iter()
                                .map(|(id, _)| id.to_owned())
                                .collect();
                            // Entries of earlier versions, in the engine's dedup family.
                            dedup.extend(
                                context
                                    .dedup_entries()?
                                    .into_iter()
                                    .map(|(id, _)| String::from_utf8_lossy(&id).into_owned()),
                            );
                            let expired = state.is_some() && horizon <= context.watermark_us();
                            Ok::<_, StateError>((state, dedup, context.timers(), expired))
                        })?;
                        let (state, dedup, timers, expired) = read;
                        if state.is_none() && dedup.is_empty() && timers.is_empty() {
                            continue;
                        }
                        return Ok(Some(admin::ReadKeyStateResponse {
                            found: state.is_some(),
                            expired,
                            state_json: state
                                .map(|state| flight_document(&flight::current_state(&state)).to_string())
                                .unwrap_or_default(),
                            dedup_event_ids: dedup,
                            timers: timers
                                .into_iter()
                                .map(|timer| admin::TimerInfo {
                                    kind: timer.name,
                                    fire_at_us: timer.fire_at_us,
                                    time_domain: match timer.domain {
                                        TimeDomain::EventTime => "event_time".to_owned(),
                                        TimeDomain::ProcessingTime => "processing_time".to_owned(),
                                    },
                                })
                                .collect(),
                        }));
                    }
                    Ok(None)
                },
            )
            .map_err(internal)?;
        Ok(found.unwrap_or_default())
    }

    fn refuse_gap(&self, held: &[Held], request: &admin::AcceptGapRequest) -> Result<(), Status> {
        refuse_past_end(held, request)
    }
}

/// dedup-state does not accept a gap past the end of its input (the topic deleted and created
/// again): the new topic's offsets start below the shard's stored offset, and the shard takes
/// records below it for ones it has already processed, so "accepting" would skip them silently.
/// `FAILED_PRECONDITION` naming them and what to do instead; retention gaps pass.
fn refuse_past_end(held: &[Held], request: &admin::AcceptGapRequest) -> Result<(), Status> {
    let refused: Vec<String> = held
        .iter()
        .filter(|held| held.gap.cause == GapCause::PastEnd)
        .filter(|held| request.all || (held.topic == request.topic && held.partition == request.partition))
        .map(|held| {
            format!(
                "{}/{} (stored offset {})",
                held.topic, held.partition, held.gap.stored_next
            )
        })
        .collect();
    if refused.is_empty() {
        return Ok(());
    }
    Err(Status::failed_precondition(format!(
        "dedup-state cannot go on past a re-created input topic at {}: the new topic's offsets start \
         below the shard's stored offset, so its records would be taken for ones already processed. \
         The partition stays held; docs/OPERATIONS.md (\"A partition held at a gap\") says what can be done",
        refused.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use contrail_common::consume::gaps::Gap;

    fn held(partition: i32, cause: GapCause) -> Held {
        Held {
            topic: "raw".to_owned(),
            partition,
            gap: Gap {
                cause,
                stored_next: 500,
                log_start: 0,
                log_end: 40,
            },
            found_at_us: 0,
        }
    }

    fn request(partition: i32, all: bool) -> admin::AcceptGapRequest {
        admin::AcceptGapRequest {
            topic: if all { String::new() } else { "raw".to_owned() },
            partition,
            all,
        }
    }

    #[test]
    fn a_gap_past_the_end_of_the_input_is_refused_and_a_retention_gap_passes() {
        let book = [held(0, GapCause::PastEnd), held(1, GapCause::Retention)];
        let refused = refuse_past_end(&book, &request(0, false)).expect_err("past the end");
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        assert!(
            refused.message().contains("raw/0 (stored offset 500)"),
            "{}",
            refused.message()
        );
        assert!(refuse_past_end(&book, &request(1, false)).is_ok());
        assert!(
            refuse_past_end(&book, &request(7, false)).is_ok(),
            "not held: NOT_FOUND comes later"
        );
        let all = refuse_past_end(&book, &request(0, true)).expect_err("all includes partition 0");
        assert!(!all.message().contains("raw/1"), "{}", all.message());
        assert!(refuse_past_end(&book[1..], &request(0, true)).is_ok());
    }
}
