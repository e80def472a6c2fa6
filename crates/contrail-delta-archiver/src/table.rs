//! The Delta side: opening (creating) the tables, reading stored `txn` versions, and committing
//! a batch of rows with its `txn` actions behind the zombie fence.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::{Action, Transaction};
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::writer::{DeltaWriter as _, RecordBatchWriter};
use deltalake::{DeltaTable, DeltaTableError};
use url::Url;

use crate::config::DeltaArchiverConfig;
use crate::error::DeltaArchiverError;
use crate::metrics::ArchiverMetrics;
use crate::progress::fence_holds;
use crate::row::{Row, record_batch};
use contrail_history::Table;
pub use contrail_history::location::root_url;
use contrail_history::location::table_url;

/// One partition's part in a commit: its app id, the version the fence expects to find, and the
/// version (last offset) to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnUpdate {
    /// `<table>-<topic>-<partition>`, or an origin's `…-from-<source>` (see [`crate::applied`]).
    pub app_id: String,
    /// What the table must still hold (what this instance resumed from or last committed);
    /// `None` for an origin's position, which is not fenced on its own: the partition's own app id
    /// in the same commit is, and Delta refuses a commit racing another on any of its app ids.
    pub expected: Option<Option<i64>>,
    /// The last offset this commit covers, or the origin's highest applied position.
    pub version: i64,
    /// A gap an operator accepted for this partition since its last commit: recorded in this
    /// commit's metadata (`contrail.acceptedGaps`).
    pub accepted_gap: Option<serde_json::Value>,
}

/// What became of a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOutcome {
    /// Committed as table version `version`.
    Committed {
        /// The new table version.
        version: i64,
        /// Parquet files added.
        files: usize,
        /// Their bytes.
        bytes: u64,
    },
    /// Another instance has committed for these app ids since this one read them: nothing was
    /// written; the caller must drop those partitions' rows and re-read their positions.
    Fenced(Vec<String>),
}

/// `testing.pause_before_commit_ms` (builds with the cargo feature `testing` only).
#[cfg(feature = "testing")]
fn pause_before_commit(config: &DeltaArchiverConfig) -> Duration {
    Duration::from_millis(config.testing.pause_before_commit_ms)
}

/// No pause: the build has no `testing.*` settings.
#[cfg(not(feature = "testing"))]
fn pause_before_commit(_config: &DeltaArchiverConfig) -> Duration {
    Duration::ZERO
}

/// The open tables.
pub struct Tables {
    root: Url,
    tables: BTreeMap<Table, DeltaTable>,
    pause_before_commit: Duration,
    target_file_size: u64,
}

impl Tables {
    /// Opens every table the config names, creating missing ones.
    pub async fn open(config: &DeltaArchiverConfig) -> Result<Tables, DeltaArchiverError> {
        let root = root_url(&config.delta_root)?;
        let storage_options: HashMap<String, String> = config
            .delta
            .storage_options
            .iter()
            .map(|(key, value)| (key.clone(), value.expose().to_owned()))
            .collect();
        let mut tables = BTreeMap::new();
        for (table, _) in config.topics.tables() {
            let opened = open_or_create(&root, &storage_options, table, config).await?;
            tables.insert(table, opened);
        }
        Ok(Tables {
            root,
            tables,
            pause_before_commit: pause_before_commit(config),
            target_file_size: config.delta.target_file_mb * 1024 * 1024,
        })
    }

    /// The Delta root.
    pub fn root(&self) -> &Url {
        &self.root
    }

    fn table(&mut self, table: Table) -> Result<&mut DeltaTable, DeltaArchiverError> {
        self.tables
            .get_mut(&table)
            .ok_or_else(|| DeltaArchiverError::Batch {
                table: table.name(),
                reason: "table not configured".to_owned(),
            })
    }

    /// The open table (maintenance works on it between batches).
    pub fn get_mut(&mut self, table: Table) -> Option<&mut DeltaTable> {
        self.tables.get_mut(&table)
    }

    /// The versions stored for `app_ids` in the table's newest snapshot.
    pub async fn stored_versions(
        &mut self,
        table: Table,
        app_ids: &[String],
    ) -> Result<Vec<Option<i64>>, DeltaArchiverError> {
        let delta = self.table(table)?;
        let name = table.name();
        let wrap = |source| DeltaArchiverError::Delta { table: name, source };
        delta.update_state().await.map_err(wrap)?;
        let log_store = delta.log_store();
        let snapshot = delta.snapshot().map_err(wrap)?;
        let mut versions = Vec::with_capacity(app_ids.len());
        for app_id in app_ids {
            versions.push(
                snapshot
                    .transaction_version(log_store.as_ref(), app_id)
                    .await
                    .map_err(wrap)?,
            );
        }
        Ok(versions)
    }

    /// The version stored for one app id (`None`: never committed).
    pub async fn stored_version(
        &mut self,
        table: Table,
        app_id: &str,
    ) -> Result<Option<i64>, DeltaArchiverError> {
        Ok(self
            .stored_versions(table, &[app_id.to_owned()])
            .await?
            .into_iter()
            .next()
            .flatten())
    }

    /// Writes `rows` as Parquet files and commits them with `txns`, unless the fence fails for
    /// any of them (then nothing is written).
    pub async fn commit(
        &mut self,
        table: Table,
        rows: &[&Row],
        txns: &[TxnUpdate],
        metrics: &ArchiverMetrics,
    ) -> Result<CommitOutcome, DeltaArchiverError> {
        let started = Instant::now();
        let app_ids: Vec<String> = txns.iter().map(|txn| txn.app_id.clone()).collect();
        // The fence: read the newest snapshot and check every partition's stored version.
        let fenced_txns: Vec<&TxnUpdate> = txns.iter().filter(|txn| txn.expected.is_some()).collect();
        let fenced_ids: Vec<String> = fenced_txns.iter().map(|txn| txn.app_id.clone()).collect();
        let stored = self.stored_versions(table, &fenced_ids).await?;
        let fenced: Vec<String> = fenced_txns
            .iter()
            .zip(&stored)
            .filter(|(txn, stored)| !fence_holds(txn.expected.flatten(), **stored))
            .map(|(txn, stored)| {
                tracing::warn!(table = table.name(), app_id = %txn.app_id, expected = ?txn.expected, ?stored, "zombie fence: another instance committed for this partition");
                txn.app_id.clone()
            })
            .collect();
        if !fenced.is_empty() {
            return Ok(CommitOutcome::Fenced(fenced));
        }
        let name = table.name();
        let wrap = |source| DeltaArchiverError::Delta { table: name, source };
        let pause = self.pause_before_commit;
        let target_file_size = self.target_file_size;
        let delta = self.table(table)?;
        let mut adds = Vec::new();
        if !rows.is_empty() {
            let mut writer = RecordBatchWriter::for_table(delta)
                .map_err(wrap)?
                .with_target_file_size(target_file_size);
            let batch = record_batch(table, writer.arrow_schema(), rows)
                .map_err(|reason| DeltaArchiverError::Batch { table: name, reason })?;
            writer.write(batch).await.map_err(wrap)?;
            adds = writer.flush().await.map_err(wrap)?;
        }
        let files = adds.len();
        let bytes: u64 = adds.iter().map(|add| add.size.max(0) as u64).sum();
        metrics.uncommitted_files.set(files as i64);
        if !pause.is_zero() {
            tracing::info!(
                table = name,
                files,
                "files written; pausing before the commit (testing.pause_before_commit_ms)"
            );
            tokio::time::sleep(pause).await;
        }
        let now_ms = chrono::Utc::now().timestamp_millis();
        let transactions = txns
            .iter()
            .map(|txn| Transaction::new_with_last_update(&txn.app_id, txn.version, Some(now_ms)))
            .collect();
        let partition_by = Some(vec![table.partition_column().to_owned()]);
        let snapshot = delta.snapshot().map_err(wrap)?;
        let mut properties = CommitProperties::default().with_application_transactions(transactions);
        let accepted: Vec<serde_json::Value> =
            txns.iter().filter_map(|txn| txn.accepted_gap.clone()).collect();
        if !accepted.is_empty() {
            properties = properties.with_metadata([(
                "contrail.acceptedGaps".to_owned(),
                serde_json::Value::Array(accepted),
            )]);
        }
        let result = CommitBuilder::from(properties)
            .with_actions(adds.into_iter().map(Action::Add).collect())
            .build(
                Some(snapshot),
                delta.log_store(),
                DeltaOperation::Write {
                    mode: SaveMode::Append,
                    partition_by,
                    predicate: None,
                },
            )
            .await;
        metrics.uncommitted_files.set(0);
        match result {
            Ok(finalized) => {
                let version = finalized.version() as i64;
                metrics.commits.with_label_values(&[name]).inc();
                metrics.files.with_label_values(&[name]).inc_by(files as u64);
                metrics.bytes.with_label_values(&[name]).inc_by(bytes);
                metrics
                    .commit_seconds
                    .with_label_values(&[name])
                    .observe(started.elapsed().as_secs_f64());
                tracing::debug!(table = name, version, rows = rows.len(), files, "committed");
                Ok(CommitOutcome::Committed {
                    version,
                    files,
                    bytes,
                })
            }
            Err(error) if is_concurrent_transaction(&error) => {
                tracing::warn!(table = name, %error, "zombie fence: a concurrent commit for the same partitions won");
                Ok(CommitOutcome::Fenced(app_ids))
            }
            Err(error) => Err(wrap(error)),
        }
    }
}

fn is_concurrent_transaction(error: &DeltaTableError) -> bool {
    use deltalake::kernel::transaction::{CommitConflictError, TransactionError};
    matches!(
        error,
        DeltaTableError::Transaction {
            source: TransactionError::CommitConflict(CommitConflictError::ConcurrentTransaction)
        }
    )
}

async fn open_or_create(
    root: &Url,
    storage_options: &HashMap<String, String>,
    table: Table,
    config: &DeltaArchiverConfig,
) -> Result<DeltaTable, DeltaArchiverError> {
    let url = table_url(root, table)?;
    let name = table.name();
    let wrap = |source| DeltaArchiverError::Delta { table: name, source };
    if url.scheme() == "file"
        && let Ok(path) = url.to_file_path()
    {
        std::fs::create_dir_all(&path).map_err(|error| DeltaArchiverError::Location {
            root: root.to_string(),
            reason: format!("cannot create {}: {error}", path.display()),
        })?;
    }
    for attempt in 0..5 {
        let mut existing = deltalake::DeltaTableBuilder::from_url(url.clone())
            .map_err(wrap)?
            .with_storage_options(storage_options.clone())
            .build()
            .map_err(wrap)?;
        // Probe first: loading a missing table is logged as an error by the library.
        if existing.verify_deltatable_existence().await.map_err(wrap)? {
            existing.load().await.map_err(wrap)?;
            return Ok(existing);
        }
        let created = existing
            .create()
            .with_table_name(name)
            .with_comment(format!("contrail history: {}", table.message()))
            .with_columns(table.delta_columns())
            .with_partition_columns([table.partition_column()])
            .with_save_mode(SaveMode::Ignore)
            .with_configuration([
                (
                    "delta.checkpointInterval".to_owned(),
                    Some(config.delta.checkpoint_interval.to_string()),
                ),
                (
                    "delta.logRetentionDuration".to_owned(),
                    Some(format!("interval {} days", config.delta.log_retention_days)),
                ),
                (
                    "delta.enableExpiredLogCleanup".to_owned(),
                    Some("true".to_owned()),
                ),
                ("delta.appendOnly".to_owned(), Some("true".to_owned())),
                // Statistics for every column but the raw record (binary: no min/max).
                (
                    "delta.dataSkippingStatsColumns".to_owned(),
                    Some(table.stats_columns().join(",")),
                ),
            ])
            .await;
        match created {
            Ok(created) => {
                tracing::info!(table = name, url = %url, "created Delta table");
                return Ok(created);
            }
            // Another instance created it at the same moment: open theirs.
            Err(DeltaTableError::VersionAlreadyExists(_)) if attempt < 4 => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => return Err(wrap(error)),
        }
    }
    Err(DeltaArchiverError::Location {
        root: root.to_string(),
        reason: format!("table {name} could not be opened or created"),
    })
}

#[cfg(test)]
mod tests {
    //! Real Delta tables on disk: the zombie fence, both before writing and at the commit.

    use std::path::Path;
    use std::sync::Arc;

    use contrail_proto::v1::ServingChange;
    use prost::Message as _;

    use super::*;
    use crate::row::KafkaPosition;

    fn config(root: &Path, pause_ms: u64) -> DeltaArchiverConfig {
        // Mutated only with the `testing` feature (which the workspace's test build enables).
        #[cfg_attr(not(feature = "testing"), expect(unused_mut))]
        let mut config = DeltaArchiverConfig {
            delta_root: root.display().to_string(),
            ..DeltaArchiverConfig::default()
        };
        #[cfg(feature = "testing")]
        {
            config.testing.pause_before_commit_ms = pause_ms;
        }
        #[cfg(not(feature = "testing"))]
        assert_eq!(pause_ms, 0, "a pause needs the cargo feature `testing`");
        config
    }

    fn rows(from: i64, count: i64) -> Vec<Row> {
        (from..from + count)
            .map(|offset| {
                let change = ServingChange {
                    id: format!("UA{offset}-2013-01-01-EWR"),
                    flight_key: format!("UA{offset}-2013-01-01-EWR"),
                    lsn: offset + 1,
                    ts: 1_357_000_000,
                    document_json: "{\"version\":1}".to_owned(),
                    feed_range: "0".to_owned(),
                    ..ServingChange::default()
                };
                let position = KafkaPosition {
                    topic: Arc::from("changes"),
                    partition: 0,
                    offset,
                };
                crate::row::decode(Table::ServingChanges, position, &change.encode_to_vec()).expect("decodes")
            })
            .collect()
    }

    fn txn(expected: Option<i64>, version: i64) -> TxnUpdate {
        TxnUpdate {
            app_id: "serving_changes-changes-0".to_owned(),
            expected: Some(expected),
            version,
            accepted_gap: None,
        }
    }

    fn metrics() -> ArchiverMetrics {
        ArchiverMetrics::new(&contrail_common::metrics::MetricsRegistry::new())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_reader_returns_committed_rows_of_a_partition_with_their_commit_time() {
        let root = tempfile::tempdir().expect("tempdir");
        let mut tables = Tables::open(&config(root.path(), 0)).await.expect("open");
        let committed = rows(0, 25);
        let refs: Vec<&Row> = committed.iter().collect();
        let before = chrono::Utc::now().timestamp_millis();
        tables
            .commit(Table::ServingChanges, &refs, &[txn(None, 24)], &metrics())
            .await
            .expect("commit");
        let root_text = root.path().display().to_string();
        let all = contrail_history::reader::scan(
            &root_text,
            &HashMap::new(),
            Table::ServingChanges,
            None,
            &["id", "lsn"],
        )
        .await
        .expect("scan");
        assert_eq!(all.rows(), 25);
        assert_eq!(all.version, Some(1));
        let batch = all.batches().next().expect("a batch");
        assert_eq!(batch.num_columns(), 2, "only the columns asked for");
        assert!(all.files.iter().all(|file| file.added_at_ms >= before - 1000));
        // The rows' change date: epoch second 1_357_000_000 is 2013-01-01T00:26:40Z.
        let day = chrono::NaiveDate::from_ymd_opt(2013, 1, 1).expect("date");
        let other = chrono::NaiveDate::from_ymd_opt(2012, 12, 31).expect("date");
        let of_day = contrail_history::reader::scan(
            &root_text,
            &HashMap::new(),
            Table::ServingChanges,
            Some(day),
            &["id"],
        )
        .await
        .expect("scan");
        assert_eq!(of_day.rows(), 25);
        let of_other = contrail_history::reader::scan(
            &root_text,
            &HashMap::new(),
            Table::ServingChanges,
            Some(other),
            &["id"],
        )
        .await
        .expect("scan");
        assert_eq!(of_other.rows(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_zombie_that_resumed_from_an_older_version_commits_nothing() {
        let root = tempfile::tempdir().expect("tempdir");
        let metrics = metrics();
        let mut owner = Tables::open(&config(root.path(), 0)).await.expect("owner");
        let mut zombie = Tables::open(&config(root.path(), 0)).await.expect("zombie");
        let first = rows(0, 10);
        let refs: Vec<&Row> = first.iter().collect();
        // Both resumed from "nothing archived"; the owner commits offsets 0..=9 first.
        let outcome = owner
            .commit(Table::ServingChanges, &refs, &[txn(None, 9)], &metrics)
            .await
            .expect("owner commits");
        assert!(
            matches!(outcome, CommitOutcome::Committed { files: 1, .. }),
            "{outcome:?}"
        );
        let outcome = zombie
            .commit(Table::ServingChanges, &refs, &[txn(None, 9)], &metrics)
            .await
            .expect("zombie answered");
        assert_eq!(
            outcome,
            CommitOutcome::Fenced(vec!["serving_changes-changes-0".to_owned()])
        );
        // The zombie re-reads the position and continues from there.
        let stored = zombie
            .stored_versions(Table::ServingChanges, &["serving_changes-changes-0".to_owned()])
            .await
            .expect("read back");
        assert_eq!(stored, vec![Some(9)]);
        let next = rows(10, 5);
        let refs: Vec<&Row> = next.iter().collect();
        let outcome = zombie
            .commit(Table::ServingChanges, &refs, &[txn(Some(9), 14)], &metrics)
            .await
            .expect("commits after re-reading");
        assert!(matches!(outcome, CommitOutcome::Committed { .. }), "{outcome:?}");
        let files = std::fs::read_dir(root.path().join("serving_changes"))
            .expect("table dir")
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("change_date="))
            .flat_map(|partition| std::fs::read_dir(partition.path()).expect("partition"))
            .count();
        assert_eq!(files, 2, "the fenced attempt wrote no file");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_racing_another_for_the_same_partition_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        // The slow one passes the fence, writes its file, then waits before committing.
        let mut slow = Tables::open(&config(root.path(), 800)).await.expect("slow");
        let mut fast = Tables::open(&config(root.path(), 0)).await.expect("fast");
        let slow_task = tokio::spawn(async move {
            let metrics = metrics();
            let batch = rows(0, 10);
            let refs: Vec<&Row> = batch.iter().collect();
            slow.commit(Table::ServingChanges, &refs, &[txn(None, 9)], &metrics)
                .await
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let batch = rows(0, 10);
        let refs: Vec<&Row> = batch.iter().collect();
        let outcome = fast
            .commit(Table::ServingChanges, &refs, &[txn(None, 9)], &metrics())
            .await
            .expect("fast commits");
        assert!(matches!(outcome, CommitOutcome::Committed { .. }), "{outcome:?}");
        let slow_outcome = slow_task.await.expect("task").expect("slow answered");
        assert_eq!(
            slow_outcome,
            CommitOutcome::Fenced(vec!["serving_changes-changes-0".to_owned()]),
            "Delta's conflict check refuses the second commit for the same app id"
        );
        let stored = fast
            .stored_versions(Table::ServingChanges, &["serving_changes-changes-0".to_owned()])
            .await
            .expect("read back");
        assert_eq!(stored, vec![Some(9)]);
        fast.table(Table::ServingChanges)
            .expect("table")
            .update_state()
            .await
            .expect("refresh");
        let version = fast.table(Table::ServingChanges).expect("table").version();
        assert_eq!(
            version,
            Some(1),
            "create + one append: the racing commit is not in the log"
        );
    }
}
