//! delta-archiver's effect on the consuming-stage frame ([`contrail_common::consume::Frame`]):
//! records into per-partition batches (decoded rows, exact copies dropped by origin, bad records
//! for the dead-letter topic), committed to Delta behind the zombie fence with their `txn`
//! versions, then positions advanced; storage outages and scheduled maintenance handled between
//! batches. Its positions are the tables' `txn` versions.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use contrail_common::consume::frame::{Effect, Frame, Points, Start};
use contrail_common::consume::gaps::{self, Gaps};
use contrail_common::consume::{DeadLetters, GapWatch, Rebalances, RecordingConsumer, TopicPartition};
use contrail_common::server::Health;
use contrail_common::shutdown::Shutdown;
use contrail_common::trace::TraceParent;
use contrail_history::Table;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::FutureProducer;
use tracing::Instrument;

use crate::applied::{AppliedPositions, Decision};
use crate::config::DeltaArchiverConfig;
use crate::error::{DeltaArchiverError, STORAGE_ACCESS_HINT};
use crate::metrics::ArchiverMetrics;
use crate::progress::FlushReason;
use crate::row::{KafkaPosition, Row};
use crate::status::Positions;
use crate::table::{CommitOutcome, Tables, TxnUpdate};
use crate::{applied, error, maintenance, progress, row};

/// One source partition this instance is archiving.
pub(crate) struct PartitionProgress {
    table: Table,
    app_id: String,
    /// The version stored in the table (the fence's expectation).
    committed: Option<i64>,
    /// The highest position applied per origin (stored, and raised by the batch in flight).
    applied: AppliedPositions,
    /// Rows taken into the current batch.
    rows: Vec<Row>,
    /// Records of the current batch for the dead-letter topic, with the reason.
    dead: Vec<(OwnedMessage, String)>,
    /// Last offset taken into the current batch.
    last: Option<i64>,
    /// Spans of the batch's traced (sampled) records, open until their rows are committed.
    traced: Vec<tracing::Span>,
    /// The gap an operator accepted for this partition, until a commit records it.
    accepted_gap: Option<serde_json::Value>,
}

/// The archiving effect and everything it holds.
pub(crate) struct Archiver<'a> {
    pub(crate) config: &'a DeltaArchiverConfig,
    pub(crate) topics: HashMap<String, Table>,
    pub(crate) dlq: &'a FutureProducer,
    pub(crate) tables: Tables,
    pub(crate) metrics: &'a ArchiverMetrics,
    pub(crate) positions: &'a Positions,
    pub(crate) partitions: HashMap<TopicPartition, PartitionProgress>,
    pub(crate) batch_records: usize,
    pub(crate) batch_bytes: usize,
    pub(crate) batch_started: Option<Instant>,
    pub(crate) last_maintenance: Instant,
    pub(crate) health: &'a Health,
    /// The storage refused access and nothing succeeded since.
    pub(crate) outage: bool,
    /// Partitions whose commit was fenced: read again from their table position.
    pub(crate) restarts: Vec<TopicPartition>,
}

/// What the archiver acts on.
pub(crate) enum Ready {
    /// The batch is due.
    Flush(FlushReason),
    /// Scheduled maintenance is due (no batch in flight).
    Maintain,
}

/// An accepted gap as the first commit after it records it (commit metadata
/// `contrail.acceptedGaps`).
fn accepted_gap_metadata(held: &gaps::Held) -> serde_json::Value {
    serde_json::json!({
        "topic": held.topic,
        "partition": held.partition,
        "cause": held.gap.cause.label(),
        "stored_next": held.gap.stored_next,
        "log_start": held.gap.log_start,
        "log_end": held.gap.log_end,
        "records_lost": held.gap.records_lost().unwrap_or(-1),
        "found_at_us": held.found_at_us,
        "accepted_at_ms": chrono::Utc::now().timestamp_millis(),
    })
}

/// How long to wait before trying storage again during an access outage: 1 s doubling to 30 s.
fn outage_delay(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.min(5)).min(Duration::from_secs(30))
}

/// Opens (creates) the tables, waiting out a storage that refuses access (an outage: the error
/// says what to fix, retried with backoff); `None` when the shutdown comes first.
pub(crate) async fn open_tables(
    config: &DeltaArchiverConfig,
    shutdown: &Shutdown,
) -> Result<Option<Tables>, DeltaArchiverError> {
    let mut refused: u32 = 0;
    loop {
        let opened = tokio::select! {
            opened = Tables::open(config) => opened,
            () = shutdown.triggered() => return Ok(None),
        };
        match opened {
            Ok(tables) => return Ok(Some(tables)),
            Err(error) => match error.storage_access_refused() {
                Some(message) => {
                    let delay = outage_delay(refused);
                    refused = refused.saturating_add(1);
                    tracing::error!(root = %config.delta_root, %message, hint = STORAGE_ACCESS_HINT, retry_in_ms = delay.as_millis() as u64, "the storage refuses access to the Delta tables; waiting for it to be fixed");
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = shutdown.triggered() => return Ok(None),
                    }
                }
                None => return Err(error),
            },
        }
    }
}

/// The group consumer, its rebalances and the stage's gaps: what the frame runs on.
pub(crate) struct Consuming<'a> {
    pub(crate) consumer: &'a RecordingConsumer,
    pub(crate) rebalances: &'a Rebalances,
    pub(crate) gaps: Gaps,
    /// The client configuration of the probe that asks the broker whether a position past its
    /// reported end is in its log.
    pub(crate) probe: ClientConfig,
}

impl Archiver<'_> {
    /// Archives until `shutdown`. Refused storage access (a rotated key, a missing role) is an
    /// outage, not a fault of the records: not ready, an error saying what to fix, the batch in
    /// flight dropped (nothing of it was committed) and every partition read again from its
    /// table position once the storage answers — no record is committed or dead-lettered past it.
    pub(crate) async fn run(
        &mut self,
        consuming: Consuming<'_>,
        paused: &AtomicBool,
        shutdown: &Shutdown,
    ) -> Result<(), DeltaArchiverError> {
        let watches = self
            .config
            .topics
            .tables()
            .iter()
            .map(|(_, topic)| GapWatch::new(consuming.gaps.clone(), consuming.probe.clone(), topic))
            .collect();
        let mut frame = Frame::new(
            consuming.consumer,
            consuming.rebalances,
            watches,
            paused,
            shutdown,
        );
        let mut refused: u32 = 0;
        loop {
            let Err(error) = frame.run(self).await else {
                return Ok(());
            };
            let Some(message) = error.storage_access_refused() else {
                return Err(error);
            };
            let delay = outage_delay(refused);
            refused = refused.saturating_add(1);
            self.health.set_ready(false);
            self.outage = true;
            tracing::error!(root = %self.config.delta_root, %message, hint = error::STORAGE_ACCESS_HINT, retry_in_ms = delay.as_millis() as u64, "the storage refuses access: nothing is committed or dead-lettered until it is fixed");
            frame.restart_all(self);
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = shutdown.triggered() => return Ok(()),
            }
        }
    }

    /// A commit or a partition start succeeded: an access outage, if any, is over.
    fn storage_answers(&mut self) {
        if self.outage {
            self.outage = false;
            self.health.set_ready(true);
            tracing::info!("the storage accepts the credentials again; archiving");
        }
    }

    fn forget_batch_share(&mut self, progress: &PartitionProgress) {
        let records = progress.rows.len() + progress.dead.len();
        let bytes: usize = progress.rows.iter().map(Row::weight).sum();
        self.batch_records = self.batch_records.saturating_sub(records);
        self.batch_bytes = self.batch_bytes.saturating_sub(bytes);
        if self.batch_records == 0 {
            self.batch_started = None;
        }
    }

    fn flush_due(&self) -> Option<FlushReason> {
        let age = self.batch_started.map(|t| t.elapsed()).unwrap_or_default();
        progress::flush_due(
            &self.config.batch.thresholds(),
            self.batch_records,
            self.batch_bytes,
            age,
        )
    }
}

impl Effect for Archiver<'_> {
    type Error = DeltaArchiverError;
    type Ready = Ready;

    /// The `txn` version of each partition's table, plus one (`None`: nothing archived yet).
    async fn stored_positions(
        &mut self,
        _consumer: &RecordingConsumer,
        partitions: &[TopicPartition],
    ) -> Result<Vec<(TopicPartition, Option<i64>)>, DeltaArchiverError> {
        let mut stored = Vec::new();
        for key in partitions {
            let Some(table) = self.topics.get(&*key.0).copied() else {
                continue;
            };
            let version = self
                .tables
                .stored_version(table, &table.app_id(&key.0, key.1))
                .await?;
            stored.push((key.clone(), version.map(|version| version + 1)));
        }
        if !stored.is_empty() {
            self.storage_answers();
        }
        Ok(stored)
    }

    async fn start(&mut self, key: &TopicPartition, start: Start<'_>) -> Result<(), DeltaArchiverError> {
        let Some(table) = self.topics.get(&*key.0).copied() else {
            return Ok(());
        };
        // Held while it was read, and goes on after an accepted gap: what it took before the gap
        // is committed first (the new progress replaces the old).
        if self
            .partitions
            .get(key)
            .is_some_and(|progress| progress.last.is_some())
        {
            self.flush(FlushReason::Gap).await?;
        }
        let app_id = table.app_id(&key.0, key.1);
        // The fence's expectation: what the table stores (after an accepted gap the old topic's
        // last offset, which the next commit replaces).
        let committed = match start.accepted {
            Some(_) => self.tables.stored_version(table, &app_id).await?,
            None => start.stored.map(|next| next - 1),
        };
        if let (Some(at), Ok(mut positions)) = (start.at, self.positions.lock()) {
            positions.insert((key.0.to_string(), key.1), at);
        }
        tracing::info!(
            table = table.name(),
            topic = %key.0,
            partition = key.1,
            ?committed,
            next = ?start.at,
            gap_accepted = start.accepted.is_some(),
            "partition position read from the table"
        );
        self.partitions.insert(
            key.clone(),
            PartitionProgress {
                table,
                app_id,
                committed,
                applied: AppliedPositions::default(),
                rows: Vec::new(),
                dead: Vec::new(),
                last: None,
                traced: Vec::new(),
                accepted_gap: start
                    .accepted
                    .map(|accepted| accepted_gap_metadata(&accepted.held)),
            },
        );
        Ok(())
    }

    /// The partition's uncommitted rows are dropped (read again by whoever owns it).
    fn stop(&mut self, key: &TopicPartition) {
        if let Some(progress) = self.partitions.remove(key) {
            self.forget_batch_share(&progress);
        }
        if let Ok(mut positions) = self.positions.lock() {
            positions.remove(&(key.0.to_string(), key.1));
        }
    }

    fn has_room(&self) -> bool {
        self.flush_due().is_none()
    }

    async fn take(&mut self, message: OwnedMessage) -> Result<(), DeltaArchiverError> {
        let topic: Arc<str> = Arc::from(message.topic());
        let partition = message.partition();
        let offset = message.offset();
        let key = (topic.clone(), partition);
        let Some(progress) = self.partitions.get_mut(&key) else {
            return Ok(());
        };
        let table = progress.table;
        self.metrics.records.with_label_values(&[table.name()]).inc();
        let position = KafkaPosition {
            topic: topic.clone(),
            partition,
            offset,
        };
        let app_id = progress.app_id.clone();
        match row::decode(table, position, message.payload().unwrap_or_default()) {
            Ok(row) => {
                let mut decision = progress.applied.decide(&row.origin);
                if decision == Decision::Unknown {
                    // The first record of this origin since the partition started: read the
                    // origin's applied position from the table (one txn look-up).
                    let origin_id = applied::origin_app_id(&app_id, &row.origin.source);
                    let stored = self.tables.stored_version(table, &origin_id).await?;
                    tracing::debug!(table = table.name(), topic = %topic, partition, source = %row.origin.source, ?stored, "origin position read from the table");
                    let Some(progress) = self.partitions.get_mut(&key) else {
                        return Ok(());
                    };
                    progress.applied.load(&row.origin.source, stored);
                    decision = progress.applied.decide(&row.origin);
                }
                let Some(progress) = self.partitions.get_mut(&key) else {
                    return Ok(());
                };
                if decision == Decision::Apply {
                    self.batch_bytes += row.weight();
                    progress.rows.push(row);
                    if let Some(parent) =
                        TraceParent::of_record(message.headers()).filter(TraceParent::sampled)
                    {
                        let span = tracing::info_span!(
                            parent: None,
                            "delta-archiver.archive",
                            delta.table = table.name(),
                            messaging.kafka.topic = %topic,
                            messaging.kafka.partition = partition,
                            messaging.kafka.offset = offset,
                            delta.version = tracing::field::Empty,
                        );
                        parent.adopt(&span);
                        progress.traced.push(span);
                    }
                } else {
                    self.metrics.duplicates.with_label_values(&[table.name()]).inc();
                }
            }
            Err(reason) => {
                if let Some(progress) = self.partitions.get_mut(&key) {
                    progress.dead.push((message, reason));
                }
            }
        }
        let Some(progress) = self.partitions.get_mut(&key) else {
            return Ok(());
        };
        progress.last = Some(offset);
        self.batch_records += 1;
        if self.batch_started.is_none() {
            self.batch_started = Some(Instant::now());
        }
        Ok(())
    }

    /// The batch when it is due (at once when full, else when its oldest record is
    /// `batch.max_latency_ms` old); with no batch, maintenance when it is due.
    async fn ready(&mut self) -> Ready {
        if let Some(reason) = self.flush_due() {
            return Ready::Flush(reason);
        }
        if let Some(started) = self.batch_started {
            tokio::time::sleep_until((started + self.config.batch.thresholds().max_latency).into()).await;
            return Ready::Flush(FlushReason::Latency);
        }
        let settings = &self.config.maintenance;
        if !settings.enabled {
            return std::future::pending().await;
        }
        tokio::time::sleep_until((self.last_maintenance + Duration::from_secs(settings.interval_s)).into())
            .await;
        Ready::Maintain
    }

    async fn act(&mut self, ready: Ready) -> Result<Points, DeltaArchiverError> {
        match ready {
            Ready::Flush(reason) => {
                let points = self.flush(reason).await?;
                self.maybe_maintain().await?;
                Ok(points)
            }
            Ready::Maintain => {
                self.maybe_maintain().await?;
                Ok(Vec::new())
            }
        }
    }

    /// Informational (tools that read consumer-group lag): positions are the tables'.
    fn committed(&mut self, _points: &[(TopicPartition, i64)]) {}

    fn restarts(&mut self) -> Vec<TopicPartition> {
        std::mem::take(&mut self.restarts)
    }

    async fn drain(&mut self) -> Result<Points, DeltaArchiverError> {
        if self.batch_records == 0 {
            return Ok(Vec::new());
        }
        tracing::info!(
            records = self.batch_records,
            "stopping: committing the batch in flight"
        );
        self.flush(FlushReason::Stopping).await
    }
}

impl Archiver<'_> {
    /// Commits the batch: dead letters first, then one Delta commit per table. Returns the
    /// partitions' next offsets (for the group, informational: positions are the tables').
    async fn flush(&mut self, reason: FlushReason) -> Result<Points, DeltaArchiverError> {
        let mut points = Points::new();
        let mut by_table: BTreeMap<Table, Vec<TopicPartition>> = BTreeMap::new();
        for (key, progress) in &self.partitions {
            if progress.last.is_some() {
                by_table.entry(progress.table).or_default().push(key.clone());
            }
        }
        for (table, keys) in by_table {
            self.send_dead_letters(table, &keys).await?;
            let mut txns: Vec<TxnUpdate> = Vec::new();
            for progress in keys.iter().filter_map(|key| self.partitions.get(key)) {
                let Some(last) = progress.last else {
                    continue;
                };
                txns.push(TxnUpdate {
                    app_id: progress.app_id.clone(),
                    expected: Some(progress.committed),
                    version: last,
                    accepted_gap: progress.accepted_gap.clone(),
                });
                txns.extend(progress.applied.pending().map(|(source, position)| TxnUpdate {
                    app_id: applied::origin_app_id(&progress.app_id, source),
                    expected: None,
                    version: position,
                    accepted_gap: None,
                }));
            }
            let rows: Vec<&Row> = keys
                .iter()
                .filter_map(|key| self.partitions.get(key))
                .flat_map(|progress| progress.rows.iter())
                .collect();
            let row_count = rows.len();
            let commit_span = tracing::info_span!(
                parent: None,
                "delta-archiver.commit",
                delta.table = table.name(),
                rows = row_count,
                partitions = keys.len(),
                delta.version = tracing::field::Empty,
                outcome = tracing::field::Empty,
            );
            for traced in keys
                .iter()
                .filter_map(|key| self.partitions.get(key))
                .flat_map(|progress| progress.traced.iter())
                .filter_map(TraceParent::of_span)
            {
                traced.link_from(&commit_span);
            }
            let outcome = self
                .tables
                .commit(table, &rows, &txns, self.metrics)
                .instrument(commit_span.clone())
                .await?;
            commit_span.record(
                "outcome",
                match &outcome {
                    CommitOutcome::Committed { .. } => "committed",
                    CommitOutcome::Fenced(_) => "fenced",
                },
            );
            match outcome {
                CommitOutcome::Committed { version, files, .. } => {
                    commit_span.record("delta.version", version);
                    self.storage_answers();
                    self.metrics
                        .rows
                        .with_label_values(&[table.name()])
                        .inc_by(row_count as u64);
                    tracing::debug!(
                        table = table.name(),
                        version,
                        rows = row_count,
                        files,
                        reason = reason.label(),
                        "batch committed"
                    );
                    for key in &keys {
                        if let Some(progress) = self.partitions.get_mut(key)
                            && let Some(last) = progress.last.take()
                        {
                            progress.committed = Some(last);
                            progress.applied.committed();
                            progress.rows.clear();
                            progress.dead.clear();
                            progress.accepted_gap = None;
                            for span in progress.traced.drain(..) {
                                span.record("delta.version", version);
                            }
                            points.push((key.clone(), last + 1));
                            if let Ok(mut positions) = self.positions.lock() {
                                positions.insert((key.0.to_string(), key.1), last + 1);
                            }
                        }
                    }
                }
                CommitOutcome::Fenced(app_ids) => {
                    self.metrics
                        .fenced
                        .with_label_values(&[table.name()])
                        .inc_by(app_ids.len() as u64);
                    // Nothing of this commit was written: every partition in it starts over from
                    // the table's position (the fenced ones belong to another instance now).
                    for key in &keys {
                        if let Some(progress) = self.partitions.remove(key) {
                            self.forget_batch_share(&progress);
                            self.restarts.push(key.clone());
                        }
                    }
                }
            }
        }
        self.metrics.batches.with_label_values(&[reason.label()]).inc();
        self.batch_records = 0;
        self.batch_bytes = 0;
        self.batch_started = None;
        Ok(points)
    }

    async fn send_dead_letters(
        &mut self,
        table: Table,
        keys: &[TopicPartition],
    ) -> Result<(), DeltaArchiverError> {
        let mut dead = Vec::new();
        for key in keys {
            if let Some(progress) = self.partitions.get(key) {
                for (message, reason) in &progress.dead {
                    dead.push((message.clone(), reason.clone()));
                }
            }
        }
        let letters = DeadLetters {
            producer: self.dlq,
            topic: &self.config.topics.dlq,
            stage: "delta-archiver",
            max_message_bytes: self.config.kafka.max_message_bytes(),
        };
        for (message, reason) in dead {
            self.metrics.dead_letters.with_label_values(&[table.name()]).inc();
            tracing::warn!(table = table.name(), topic = message.topic(), partition = message.partition(), offset = message.offset(), %reason, "record to the dead-letter topic");
            // Without the dead letter acknowledged the batch must not be committed.
            letters
                .send(
                    &message,
                    reason,
                    format!("application/x-protobuf; {}", table.message()),
                    chrono::Utc::now().timestamp_micros(),
                )
                .await
                .map_err(|error| DeltaArchiverError::Broker(format!("dead-letter topic: {error}")))?;
        }
        Ok(())
    }

    async fn maybe_maintain(&mut self) -> Result<(), DeltaArchiverError> {
        let settings = &self.config.maintenance;
        if !settings.enabled || self.last_maintenance.elapsed() < Duration::from_secs(settings.interval_s) {
            return Ok(());
        }
        self.last_maintenance = Instant::now();
        for (table, _) in self.config.topics.tables() {
            match maintenance::run(
                &mut self.tables,
                table,
                settings,
                &self.config.delta,
                self.metrics,
            )
            .await
            {
                Ok(report) => tracing::info!(
                    table = table.name(),
                    compacted = report.compacted_files,
                    written = report.written_files,
                    vacuumed = report.vacuumed_files,
                    "maintenance done"
                ),
                // Maintenance never blocks archiving: log and try again next interval.
                Err(error) => tracing::warn!(table = table.name(), %error, "maintenance failed"),
            }
        }
        Ok(())
    }
}
