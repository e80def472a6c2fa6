//! Reading the history tables back, for tools (the flight board's state history, `contrail up`'s
//! exactly-once checks, the pipeline benchmark). It reads the table's current snapshot without a
//! query engine: the active files (of one partition date, when asked), only the columns asked for.

use std::collections::HashMap;

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
    let name = table.name();
    let wrap = |source| HistoryError::Delta { table: name, source };
    let Some(delta) = open_snapshot(root, storage_options, table).await? else {
        return Ok(Scan::default());
    };
    let wanted = date.map(|day| day.format("%Y-%m-%d").to_string());
    let column = table.partition_column();
    let views: Vec<_> = delta
        .get_active_add_actions_by_partitions(&[])
        .try_collect()
        .await
        .map_err(wrap)?;
    let store = delta.object_store();
    let mut files = Vec::new();
    for view in views {
        if let Some(wanted) = &wanted {
            let value = view.partition_values_map().get(column).cloned().flatten();
            if value.as_deref() != Some(wanted.as_str()) {
                continue;
            }
        }
        let bytes = store
            .get_opts(&view.object_store_path(), GetOptions::default())
            .await
            .map_err(|error| wrap(DeltaTableError::from(error)))?
            .bytes()
            .await
            .map_err(|error| wrap(DeltaTableError::from(error)))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|error| wrap(error.into()))?;
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
            added_at_ms: view.modification_time(),
            batches,
        });
    }
    Ok(Scan {
        version: delta.version().map(|version| version as i64),
        files,
    })
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
