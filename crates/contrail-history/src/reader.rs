//! Reading the history tables back, for tools (the flight board's state history, `contrail up`'s
//! exactly-once checks, the pipeline benchmark). It reads the table's current snapshot without a
//! query engine: the active files (of one partition date, when asked), only the columns asked for;
//! [`partitions`] lists a snapshot's files by partition so a tool reads one partition at a time.

use std::collections::{BTreeMap, HashMap};

use chrono::NaiveDate;
use deltalake::arrow::record_batch::RecordBatch;
use deltalake::logstore::object_store::GetOptions;
use deltalake::parquet::arrow::ProjectionMask;
use deltalake::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use deltalake::{DeltaTableError, ObjectStore as _};
use futures::TryStreamExt as _;

use crate::error::HistoryError;
use crate::location::{root_url, table_url};
use crate::tables::Table;

/// The rows of one data file.
#[derive(Debug, Clone)]
pub struct FileRows {
    /// When the file was added to the table (its `add.modificationTime`), ms since the epoch.
    pub added_at_ms: i64,
    /// The file's rows, projected to the columns asked for (the partition column is not in
    /// the files).
    pub batches: Vec<RecordBatch>,
}

/// What a scan read.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// Table version read; `None` when the table does not exist (yet).
    pub version: Option<i64>,
    /// Active files of the snapshot (of the partition asked for).
    pub files: Vec<FileRows>,
}

impl Scan {
    /// Rows read.
    pub fn rows(&self) -> usize {
        self.files
            .iter()
            .flat_map(|file| &file.batches)
            .map(RecordBatch::num_rows)
            .sum()
    }

    /// Every batch read.
    pub fn batches(&self) -> impl Iterator<Item = &RecordBatch> {
        self.files.iter().flat_map(|file| &file.batches)
    }
}

/// The newest snapshot of `table` under `root`; `None` when the table does not exist (yet).
async fn open_snapshot(
    root: &str,
    storage_options: &HashMap<String, String>,
    table: Table,
) -> Result<Option<deltalake::DeltaTable>, HistoryError> {
    let name = table.name();
    let wrap = |source| HistoryError::Delta { table: name, source };
    let url = table_url(&root_url(root)?, table)?;
    let mut delta = deltalake::DeltaTableBuilder::from_url(url)
        .map_err(wrap)?
        .with_storage_options(storage_options.clone())
        .build()
        .map_err(wrap)?;
    if !delta.verify_deltatable_existence().await.map_err(wrap)? {
        return Ok(None);
    }
    delta.load().await.map_err(wrap)?;
    Ok(Some(delta))
}

/// Reads `columns` of `table` under `root` (local path or URL); with `date`, only that
/// partition (service date, or change date for `serving_changes`).
pub async fn scan(
    root: &str,
    storage_options: &HashMap<String, String>,
    table: Table,
    date: Option<NaiveDate>,
    columns: &[&str],
) -> Result<Scan, HistoryError> {
    let Some(partitions) = partitions(root, storage_options, table).await? else {
        return Ok(Scan::default());
    };
    let files = match date {
        Some(day) => {
            partitions
                .read(&day.format("%Y-%m-%d").to_string(), columns)
                .await?
        }
        None => {
            let mut files = Vec::new();
            for date in partitions.dates().map(str::to_owned).collect::<Vec<_>>() {
                files.extend(partitions.read(&date, columns).await?);
            }
            files
        }
    };
    Ok(Scan {
        version: Some(partitions.version),
        files,
    })
}

/// One snapshot of a table, its active files by partition, to be read one partition at a time
/// (memory bounded by the largest partition, not by the table).
pub struct Partitions {
    table: Table,
    version: i64,
    delta: deltalake::DeltaTable,
    files: BTreeMap<String, Vec<(deltalake::logstore::object_store::path::Path, i64)>>,
}

impl std::fmt::Debug for Partitions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partitions")
            .field("table", &self.table.name())
            .field("version", &self.version)
            .field("partitions", &self.files.len())
            .finish()
    }
}

/// The newest snapshot of `table` under `root`, its files listed by partition; `None` when the
/// table does not exist (yet).
pub async fn partitions(
    root: &str,
    storage_options: &HashMap<String, String>,
    table: Table,
) -> Result<Option<Partitions>, HistoryError> {
    let name = table.name();
    let wrap = |source| HistoryError::Delta { table: name, source };
    let Some(delta) = open_snapshot(root, storage_options, table).await? else {
        return Ok(None);
    };
    let column = table.partition_column();
    let views: Vec<_> = delta
        .get_active_add_actions_by_partitions(&[])
        .try_collect()
        .await
        .map_err(wrap)?;
    let mut files: BTreeMap<String, Vec<(deltalake::logstore::object_store::path::Path, i64)>> =
        BTreeMap::new();
    for view in views {
        // A row without a partition value is listed under "" (first in date order).
        let value = view.partition_values_map().get(column).cloned().flatten();
        files
            .entry(value.unwrap_or_default())
            .or_default()
            .push((view.object_store_path(), view.modification_time()));
    }
    Ok(Some(Partitions {
        table,
        version: delta.version().map_or(-1, |version| version as i64),
        delta,
        files,
    }))
}

impl Partitions {
    /// The table version these partitions are of.
    pub fn version(&self) -> i64 {
        self.version
    }

    /// The partition values (dates, `YYYY-MM-DD`) that have active files, in ascending order.
    pub fn dates(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }

    /// Active files in all partitions.
    pub fn file_count(&self) -> usize {
        self.files.values().map(Vec::len).sum()
    }

    /// Reads `columns` of the files of partition `date` (none when it has no files).
    pub async fn read(&self, date: &str, columns: &[&str]) -> Result<Vec<FileRows>, HistoryError> {
        let name = self.table.name();
        let wrap = |source| HistoryError::Delta { table: name, source };
        let store = self.delta.object_store();
        let mut files = Vec::new();
        for (path, added_at_ms) in self.files.get(date).into_iter().flatten() {
            let bytes = store
                .get_opts(path, GetOptions::default())
                .await
                .map_err(|error| wrap(DeltaTableError::from(error)))?
                .bytes()
                .await
                .map_err(|error| wrap(DeltaTableError::from(error)))?;
            let builder =
                ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|error| wrap(error.into()))?;
            let mask = {
                let descriptor = builder.parquet_schema();
                let indices: Vec<usize> = descriptor
                    .root_schema()
                    .get_fields()
                    .iter()
                    .enumerate()
                    .filter(|(_, field)| columns.contains(&field.name()))
                    .map(|(index, _)| index)
                    .collect();
                ProjectionMask::roots(descriptor, indices)
            };
            let reader = builder
                .with_projection(mask)
                .build()
                .map_err(|error| wrap(error.into()))?;
            let batches = reader
                .collect::<Result<Vec<_>, _>>()
                .map_err(|error| wrap(error.into()))?;
            files.push(FileRows {
                added_at_ms: *added_at_ms,
                batches,
            });
        }
        Ok(files)
    }
}

/// The last offset of each of `topic`'s `partitions` that delta-archiver has committed to
/// `table` (its `txn` versions; `None`: nothing archived from that partition yet), in the order
/// asked. A table that does not exist (yet) has archived nothing.
pub async fn archived_offsets(
    root: &str,
    storage_options: &HashMap<String, String>,
    table: Table,
    topic: &str,
    partitions: &[i32],
) -> Result<Vec<Option<i64>>, HistoryError> {
    let name = table.name();
    let wrap = |source| HistoryError::Delta { table: name, source };
    let Some(delta) = open_snapshot(root, storage_options, table).await? else {
        return Ok(vec![None; partitions.len()]);
    };
    let log_store = delta.log_store();
    let snapshot = delta.snapshot().map_err(wrap)?;
    let mut offsets = Vec::with_capacity(partitions.len());
    for partition in partitions {
        offsets.push(
            snapshot
                .transaction_version(log_store.as_ref(), &table.app_id(topic, *partition))
                .await
                .map_err(wrap)?,
        );
    }
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_table_scans_as_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().display().to_string();
        let scan = scan(&root, &HashMap::new(), Table::Events, None, &["event_id"])
            .await
            .expect("scan");
        assert_eq!(scan.version, None);
        assert_eq!(scan.rows(), 0);
        let offsets = archived_offsets(&root, &HashMap::new(), Table::FlightStates, "t", &[0, 1])
            .await
            .expect("offsets");
        assert_eq!(offsets, vec![None, None]);
    }
}
