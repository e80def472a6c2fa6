//! Scheduled table maintenance: compaction of small files and vacuum. Checkpoints and log
//! clean-up need no schedule — the commit that reaches `delta.checkpointInterval` writes the
//! checkpoint and removes log entries older than `delta.logRetentionDuration`.
//!
//! Compaction is our own, without DataFusion (whose `optimize` would add ≈ 80 crates): per
//! partition date with at least `compact_min_files` files below the target size, the files are
//! read back, written as one (or a few target-sized) new files, and committed as `remove` + `add`
//! actions with `dataChange = false`, so streaming readers of the table see no new data. Archiving
//! appends commit concurrently without conflict; a competing compaction of the same files makes
//! one of the two fail harmlessly (its new files become orphans for vacuum).

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::NaiveDate;
use deltalake::arrow::array::{ArrayRef, Date32Array};
use deltalake::arrow::record_batch::RecordBatch;
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::{Action, Remove};
use deltalake::logstore::object_store::GetOptions;
use deltalake::operations::vacuum::VacuumMode;
use deltalake::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use deltalake::protocol::DeltaOperation;
use deltalake::writer::{DeltaWriter as _, RecordBatchWriter};
use deltalake::{DeltaTable, DeltaTableError, ObjectStore as _};
use futures::TryStreamExt as _;

use crate::config::{DeltaConfig, MaintenanceConfig};
use crate::error::DeltaArchiverError;
use crate::metrics::ArchiverMetrics;
use crate::table::Tables;
use contrail_history::Table;

/// What one maintenance run did to a table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Small files replaced.
    pub compacted_files: usize,
    /// Files written in their place.
    pub written_files: usize,
    /// Files removed by vacuum.
    pub vacuumed_files: usize,
}

/// Compacts and vacuums `table`.
pub async fn run(
    tables: &mut Tables,
    table: Table,
    settings: &MaintenanceConfig,
    delta_config: &DeltaConfig,
    metrics: &ArchiverMetrics,
) -> Result<Report, DeltaArchiverError> {
    let name = table.name();
    let wrap = |source| DeltaArchiverError::Delta { table: name, source };
    let Some(delta) = tables.get_mut(table) else {
        return Ok(Report::default());
    };
    delta.update_state().await.map_err(wrap)?;
    let mut report = Report::default();
    if settings.compact_min_files > 0 {
        let target = delta_config.target_file_mb * 1024 * 1024;
        let (compacted, written) = compact(delta, table, settings.compact_min_files, target)
            .await
            .map_err(wrap)?;
        report.compacted_files = compacted;
        report.written_files = written;
        metrics.compacted_files.inc_by(compacted as u64);
        delta.update_state().await.map_err(wrap)?;
    }
    let (vacuumed, vacuum_metrics) = delta
        .clone()
        .vacuum()
        .with_retention_period(chrono::Duration::seconds(settings.vacuum_retention_s as i64))
        .with_enforce_retention_duration(false)
        .with_mode(VacuumMode::Full)
        .await
        .map_err(wrap)?;
    *delta = vacuumed;
    report.vacuumed_files = vacuum_metrics.files_deleted.len();
    metrics.vacuumed_files.inc_by(report.vacuumed_files as u64);
    Ok(report)
}

/// One candidate file of a partition.
struct SmallFile {
    path: deltalake::Path,
    remove: Remove,
}

async fn compact(
    delta: &mut DeltaTable,
    table: Table,
    min_files: usize,
    target: u64,
) -> Result<(usize, usize), DeltaTableError> {
    let column = table.partition_column();
    let mut groups: BTreeMap<String, Vec<SmallFile>> = BTreeMap::new();
    {
        let views: Vec<_> = delta
            .get_active_add_actions_by_partitions(&[])
            .try_collect()
            .await?;
        for view in views {
            if view.size().max(0) as u64 >= target {
                continue;
            }
            let Some(Some(date)) = view.partition_values_map().get(column).cloned() else {
                continue;
            };
            groups.entry(date).or_default().push(SmallFile {
                path: view.object_store_path(),
                remove: view.remove_action(false),
            });
        }
    }
    let mut compacted = 0;
    let mut written = 0;
    for (date, files) in groups {
        if files.len() < min_files {
            continue;
        }
        let days = NaiveDate::parse_from_str(&date, "%Y-%m-%d")
            .map(|day| (day - NaiveDate::default()).num_days() as i32)
            .map_err(|error| DeltaTableError::Generic(format!("partition {column}={date}: {error}")))?;
        let store = delta.object_store();
        let mut writer = RecordBatchWriter::for_table(delta)?.with_target_file_size(target);
        let schema = writer.arrow_schema();
        for file in &files {
            let bytes = store
                .get_opts(&file.path, GetOptions::default())
                .await?
                .bytes()
                .await?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
            for batch in reader {
                let batch = batch?;
                let rows = batch.num_rows();
                let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
                for field in schema.fields() {
                    if field.name() == column {
                        columns.push(Arc::new(Date32Array::from(vec![days; rows])));
                    } else {
                        let array = batch.column_by_name(field.name()).ok_or_else(|| {
                            DeltaTableError::Generic(format!(
                                "{}: file {} has no column {}",
                                table.name(),
                                file.path,
                                field.name()
                            ))
                        })?;
                        columns.push(deltalake::arrow::compute::cast(array, field.data_type())?);
                    }
                }
                writer
                    .write(RecordBatch::try_new(schema.clone(), columns)?)
                    .await?;
            }
        }
        let mut adds = writer.flush().await?;
        for add in &mut adds {
            add.data_change = false;
        }
        let mut actions: Vec<Action> = files
            .iter()
            .map(|file| Action::Remove(file.remove.clone()))
            .collect();
        written += adds.len();
        actions.extend(adds.into_iter().map(Action::Add));
        let snapshot = delta.snapshot()?;
        let result = CommitBuilder::from(CommitProperties::default())
            .with_actions(actions)
            .build(
                Some(snapshot),
                delta.log_store(),
                DeltaOperation::Optimize {
                    predicate: Some(format!("{column} = '{date}'")),
                    target_size: target as i64,
                },
            )
            .await;
        match result {
            Ok(_) => {
                compacted += files.len();
                tracing::info!(table = table.name(), %date, files = files.len(), "compacted");
            }
            Err(error) => {
                tracing::warn!(table = table.name(), %date, %error, "compaction not committed (a concurrent one won?); its files are left for vacuum");
            }
        }
        delta.update_state().await?;
    }
    Ok((compacted, written))
}
