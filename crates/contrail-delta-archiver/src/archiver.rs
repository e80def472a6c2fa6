//! The archiving loop: records from the consumer into per-partition batches (decoded rows, exact
//! copies dropped by origin, bad records for the dead-letter topic), committed to Delta behind the
//! zombie fence with their `txn` versions, then offsets and positions advanced; rebalances,
//! storage outages and scheduled maintenance handled between batches.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use contrail_common::consume::gaps::{self, Gaps, Start};
use contrail_common::consume::{DeadLetters, RebalanceEvent, Rebalances, RecordingConsumer, TopicPartition};
use contrail_common::server::Health;
use contrail_common::shutdown::Shutdown;
use contrail_common::trace::TraceParent;
use contrail_history::Table;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};
use tracing::Instrument;

use crate::applied::{AppliedPositions, Decision};
use crate::config::DeltaArchiverConfig;
use crate::error::{DeltaArchiverError, STORAGE_ACCESS_HINT};
use crate::metrics::ArchiverMetrics;
use crate::progress::{FlushReason, Placement};
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
    /// The next offset to take.
    next: i64,
    /// The consumer was sought to `next`.
    sought: bool,
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

/// The archiving loop and everything it holds.
pub(crate) struct Archiver<'a> {
    pub(crate) config: &'a DeltaArchiverConfig,
    pub(crate) topics: HashMap<String, Table>,
    pub(crate) consumer: &'a RecordingConsumer,
    pub(crate) rebalances: &'a Rebalances,
    pub(crate) watermarks: &'a BaseConsumer,
    pub(crate) dlq: &'a FutureProducer,
    pub(crate) tables: Tables,
    pub(crate) metrics: &'a ArchiverMetrics,
    pub(crate) positions: &'a Positions,
    pub(crate) partitions: HashMap<TopicPartition, PartitionProgress>,
    /// Assigned partitions not started yet.
    pub(crate) to_start: Vec<TopicPartition>,
    pub(crate) batch_records: usize,
    pub(crate) batch_bytes: usize,
    pub(crate) batch_started: Option<Instant>,
    pub(crate) last_maintenance: Instant,
    pub(crate) health: &'a Health,
    /// The storage refused access and nothing succeeded since.
    pub(crate) outage: bool,
    /// Partitions held at a gap (their table position is not in the topic any more).
    pub(crate) gaps: Gaps,
    /// The client configuration of the probe that asks the broker whether a position past its
    /// reported end is in its log.
    pub(crate) probe: ClientConfig,
}

/// How long the probe of a position may wait for the broker.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a partition's start position comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StartFrom {
    /// The table's `txn` version, judged against the topic.
    Table,
    /// An operator accepted the partition's gap: the topic's first offset.
    GapAccepted(gaps::Held),
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

impl Archiver<'_> {
    /// Archives until `shutdown`. Refused storage access (a rotated key, a missing role) is an
    /// outage, not a fault of the records: not ready, an error saying what to fix, the batch in
    /// flight dropped (nothing of it was committed) and every partition read again from its
    /// table position once the storage answers — no record is committed or dead-lettered past it.
    pub(crate) async fn run(
        &mut self,
        paused: &AtomicBool,
        shutdown: &Shutdown,
    ) -> Result<(), DeltaArchiverError> {
        let mut refused: u32 = 0;
        loop {
            let Err(error) = self.archive(paused, shutdown).await else {
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
            let owned: Vec<TopicPartition> = self.partitions.keys().cloned().collect();
            for key in owned {
                if let Some(progress) = self.partitions.remove(&key) {
                    self.forget_batch_share(&progress);
                }
                self.to_start.push(key);
            }
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

    async fn archive(&mut self, paused: &AtomicBool, shutdown: &Shutdown) -> Result<(), DeltaArchiverError> {
        let thresholds = self.config.batch.thresholds();
        loop {
            self.handle_rebalances();
            self.start_accepted().await?;
            self.start_assigned().await?;
            let age = self.batch_started.map(|t| t.elapsed()).unwrap_or_default();
            if shutdown.is_triggered() {
                if self.batch_records > 0 {
                    tracing::info!(
                        records = self.batch_records,
                        "stopping: committing the batch in flight"
                    );
                    self.flush(FlushReason::Stopping).await?;
                }
                return Ok(());
            }
            if let Some(reason) = progress::flush_due(&thresholds, self.batch_records, self.batch_bytes, age)
            {
                self.flush(reason).await?;
                self.maybe_maintain().await?;
                continue;
            }
            if paused.load(Ordering::Relaxed) {
                tokio::select! {
                    () = shutdown.triggered() => {}
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
                continue;
            }
            let wait = if self.batch_records > 0 {
                thresholds.max_latency.saturating_sub(age)
            } else {
                Duration::from_secs(1)
            };
            let received = tokio::select! {
                () = shutdown.triggered() => continue,
                received = tokio::time::timeout(wait, self.consumer.recv()) => received,
            };
            match received {
                Err(_) => {
                    if self.batch_records == 0 {
                        self.maybe_maintain().await?;
                    }
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, "consumer error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(Ok(message)) => {
                    let message = message.detach();
                    self.handle_rebalances();
                    let started = self.start_assigned().await?;
                    let key: TopicPartition = (Arc::from(message.topic()), message.partition());
                    if started.contains(&key)
                        && let Some(progress) = self.partitions.get_mut(&key)
                    {
                        // This record was fetched before the seek: judge it as unsought.
                        progress.sought = false;
                    }
                    self.take(message).await?;
                }
            }
        }
    }

    /// Forgets partitions that were revoked or (re-)assigned: their uncommitted rows are dropped.
    /// Assigned partitions are queued to be started from their table position.
    fn handle_rebalances(&mut self) {
        for event in self.rebalances.take() {
            let (RebalanceEvent::Assigned(list) | RebalanceEvent::Revoked(list)) = &event;
            for (topic, partition) in list {
                let key: TopicPartition = (Arc::from(topic.as_str()), *partition);
                if let Some(progress) = self.partitions.remove(&key) {
                    self.forget_batch_share(&progress);
                }
                match event {
                    RebalanceEvent::Revoked(_) => {
                        self.gaps.release(topic, *partition);
                        self.to_start.retain(|queued| *queued != key);
                        if let Ok(mut positions) = self.positions.lock() {
                            positions.remove(&(topic.clone(), *partition));
                        }
                    }
                    RebalanceEvent::Assigned(_) => self.to_start.push(key),
                }
            }
        }
    }

    /// Starts queued partitions: reads each one's table position and seeks the consumer there,
    /// so every owned partition reports its position (and resumes correctly) even before, or
    /// without, a new record.
    async fn start_assigned(&mut self) -> Result<Vec<TopicPartition>, DeltaArchiverError> {
        let mut started = Vec::new();
        while let Some(key) = self.to_start.pop() {
            if self.partitions.contains_key(&key) {
                continue;
            }
            let Some(table) = self.topics.get(&*key.0).copied() else {
                continue;
            };
            self.start_and_seek(table, &key).await?;
            started.push(key);
        }
        if !started.is_empty() {
            self.storage_answers();
        }
        Ok(started)
    }

    /// Starts the partitions whose gap an operator accepted (and that this instance still owns)
    /// at their topic's first offset.
    async fn start_accepted(&mut self) -> Result<(), DeltaArchiverError> {
        for held in self.gaps.take_accepted() {
            let key: TopicPartition = (Arc::from(held.topic.as_str()), held.partition);
            let Some(table) = self.topics.get(&held.topic).copied() else {
                continue;
            };
            let mut list = TopicPartitionList::new();
            list.add_partition(&held.topic, held.partition);
            if let Err(error) = self.consumer.resume(&list) {
                tracing::warn!(topic = %held.topic, partition = held.partition, %error, "resuming the partition after its gap was accepted");
            }
            if let Some(progress) = self.partitions.remove(&key) {
                self.forget_batch_share(&progress);
            }
            self.seek_started(table, &key, StartFrom::GapAccepted(held))
                .await?;
        }
        Ok(())
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

    async fn take(&mut self, message: OwnedMessage) -> Result<(), DeltaArchiverError> {
        let topic: Arc<str> = Arc::from(message.topic());
        let partition = message.partition();
        let offset = message.offset();
        let Some(table) = self.topics.get(message.topic()).copied() else {
            return Ok(());
        };
        let key = (topic.clone(), partition);
        if !self.partitions.contains_key(&key) {
            // A partition held at a gap is never started (not in `partitions`): a record of it
            // was fetched before it was paused, and is not taken.
            if self.gaps.is_held(&topic, partition) {
                return Ok(());
            }
            let Some(progress) = self
                .start_partition(table, &topic, partition, StartFrom::Table)
                .await?
            else {
                return Ok(());
            };
            self.partitions.insert(key.clone(), progress);
        }
        let consumer = self.consumer;
        let Some(progress) = self.partitions.get_mut(&key) else {
            return Ok(());
        };
        match progress::place(progress.next, offset, progress.sought) {
            Placement::Skip => return Ok(()),
            Placement::SeekTo(next) => {
                tracing::info!(topic = %topic, partition, offset, next, "seeking to the table's position");
                let result = tokio::task::block_in_place(|| {
                    consumer.seek(&topic, partition, Offset::Offset(next), Duration::from_secs(10))
                });
                match result {
                    Ok(()) => progress.sought = true,
                    Err(error) => {
                        // Not assigned any more, or the broker is away: start over for it.
                        tracing::warn!(topic = %topic, partition, %error, "seek failed; the partition will be re-read from its table position");
                        if let Some(progress) = self.partitions.remove(&key) {
                            self.forget_batch_share(&progress);
                        }
                    }
                }
                return Ok(());
            }
            Placement::Take => {}
        }
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
        progress.next = offset + 1;
        self.batch_records += 1;
        if self.batch_started.is_none() {
            self.batch_started = Some(Instant::now());
        }
        Ok(())
    }

    /// Reads a partition's stored position (origins' positions are read when their first record
    /// arrives) and judges it against the topic: `None` when the topic no longer holds it — the
    /// partition is then held at the gap (paused, reported) until an operator accepts it.
    async fn start_partition(
        &mut self,
        table: Table,
        topic: &str,
        partition: i32,
        from: StartFrom,
    ) -> Result<Option<PartitionProgress>, DeltaArchiverError> {
        let app_id = table.app_id(topic, partition);
        let committed = self.tables.stored_version(table, &app_id).await?;
        let (low, high) = tokio::task::block_in_place(|| {
            self.watermarks
                .fetch_watermarks(topic, partition, Duration::from_secs(10))
        })
        .map_err(|error| DeltaArchiverError::Broker(format!("watermarks of {topic}/{partition}: {error}")))?;
        let start = match &from {
            StartFrom::Table => gaps::judge_start(committed.map(|version| version + 1), low, high),
            StartFrom::GapAccepted(_) => Start::First(low),
        };
        let next = match start {
            Start::First(at) | Start::At(at) => at,
            Start::PastReportedEnd(next) => {
                let probe = &self.probe;
                let exists = tokio::task::block_in_place(|| {
                    gaps::position_exists(probe, topic, partition, next, PROBE_TIMEOUT)
                })
                .map_err(|error| {
                    DeltaArchiverError::Broker(format!(
                        "asking whether {topic}/{partition} holds offset {}: {error}",
                        next - 1
                    ))
                })?;
                if !exists {
                    self.hold(table, topic, partition, gaps::past_end(next, low, high));
                    return Ok(None);
                }
                next
            }
            Start::Gap(gap) => {
                self.hold(table, topic, partition, gap);
                return Ok(None);
            }
        };
        if let Ok(mut positions) = self.positions.lock() {
            positions.insert((topic.to_owned(), partition), next);
        }
        tracing::info!(
            table = table.name(),
            topic,
            partition,
            ?committed,
            next,
            ?from,
            "partition position read from the table"
        );
        Ok(Some(PartitionProgress {
            table,
            app_id,
            committed,
            next,
            sought: false,
            applied: AppliedPositions::default(),
            rows: Vec::new(),
            dead: Vec::new(),
            last: None,
            traced: Vec::new(),
            accepted_gap: match &from {
                StartFrom::GapAccepted(held) => Some(accepted_gap_metadata(held)),
                StartFrom::Table => None,
            },
        }))
    }

    /// Holds a partition at its gap: reported (log, metric, readiness, status) and paused, so
    /// nothing of it is read until the gap is accepted.
    fn hold(&mut self, table: Table, topic: &str, partition: i32, gap: gaps::Gap) {
        tracing::debug!(
            table = table.name(),
            topic,
            partition,
            ?gap,
            "holding the partition"
        );
        self.gaps.hold(topic, partition, gap);
        let mut list = TopicPartitionList::new();
        list.add_partition(topic, partition);
        if let Err(error) = self.consumer.pause(&list) {
            // Records fetched anyway are dropped while it is held (`take`).
            tracing::warn!(topic, partition, %error, "pausing the partition held at a gap");
        }
        if let Ok(mut positions) = self.positions.lock() {
            positions.remove(&(topic.to_owned(), partition));
        }
    }

    /// Commits the batch: dead letters first, then one Delta commit per table.
    async fn flush(&mut self, reason: FlushReason) -> Result<(), DeltaArchiverError> {
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
                    let mut offsets = TopicPartitionList::new();
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
                            let _ = offsets.add_partition_offset(&key.0, key.1, Offset::Offset(last + 1));
                            if let Ok(mut positions) = self.positions.lock() {
                                positions.insert((key.0.to_string(), key.1), last + 1);
                            }
                        }
                    }
                    // For tools that read consumer-group lag; positions come from the tables.
                    if let Err(error) = self.consumer.commit(&offsets, CommitMode::Async) {
                        tracing::debug!(%error, "consumer-group offset commit failed (informational only)");
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
                            self.start_and_seek(table, key).await?;
                        }
                    }
                }
            }
        }
        self.metrics.batches.with_label_values(&[reason.label()]).inc();
        self.batch_records = 0;
        self.batch_bytes = 0;
        self.batch_started = None;
        Ok(())
    }

    /// Reads a partition's position from its table and seeks the consumer there (if this instance
    /// owns it): after an assignment, and after a fenced commit so its rows are read again.
    async fn start_and_seek(&mut self, table: Table, key: &TopicPartition) -> Result<(), DeltaArchiverError> {
        self.seek_started(table, key, StartFrom::Table).await
    }

    async fn seek_started(
        &mut self,
        table: Table,
        key: &TopicPartition,
        from: StartFrom,
    ) -> Result<(), DeltaArchiverError> {
        let owned = self
            .consumer
            .assignment()
            .map(|list| list.find_partition(&key.0, key.1).is_some())
            .unwrap_or(false);
        if !owned {
            return Ok(());
        }
        let Some(mut progress) = self.start_partition(table, &key.0, key.1, from).await? else {
            return Ok(());
        };
        let next = progress.next;
        let consumer = self.consumer;
        let sought = tokio::task::block_in_place(|| {
            consumer.seek(&key.0, key.1, Offset::Offset(next), Duration::from_secs(10))
        });
        match sought {
            Ok(()) => progress.sought = true,
            // Not fetching yet: the first record decides (`progress::place`).
            Err(error) => {
                tracing::debug!(topic = %key.0, partition = key.1, %error, "seek after start failed")
            }
        }
        self.partitions.insert(key.clone(), progress);
        Ok(())
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
