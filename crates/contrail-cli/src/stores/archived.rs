//! Whether delta-archiver has archived a topic up to where it ends: `contrail backfill` and
//! `reprocess` wait for it before reading the history, `contrail up` before its summary.
//!
//! A topic's end is read past the high watermark the broker reports (`args::read_ends`): the
//! local broker reports less than it holds.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use contrail_common::kafka::KafkaConfig;
use contrail_history::Table;
use contrail_history::reader::archived_offsets;
use indicatif::ProgressBar;
use rdkafka::consumer::BaseConsumer;

/// What to wait for: delta-archiver having archived `topic` into `table` under `delta_root` up to
/// where the topic ends now.
pub(crate) struct ArchiverWait<'a> {
    pub(crate) kafka: KafkaConfig,
    pub(crate) delta_root: &'a str,
    pub(crate) table: Table,
    pub(crate) topic: &'a str,
    pub(crate) timeout_secs: u64,
    pub(crate) quiet: bool,
}

/// The last offset of each partition of `topic` that holds records, read past the reported end.
pub(crate) async fn last_offsets(kafka: &KafkaConfig, topic: &str) -> Result<Vec<(i32, i64)>> {
    let kafka = kafka.clone();
    let reading = topic.to_owned();
    let ends = tokio::task::spawn_blocking(move || -> Result<Vec<(i32, i64, i64)>> {
        let consumer: BaseConsumer = kafka
            .client_config("contrail-archived")?
            .set("group.id", "contrail-archived")
            .set("enable.auto.commit", "false")
            .create()
            .with_context(|| format!("a Kafka client for {}", crate::args::describe(&kafka)))?;
        crate::args::read_ends(&consumer, &kafka, &reading)
    })
    .await
    .context("the broker reader stopped")??;
    Ok(ends
        .iter()
        .filter(|(_, low, high)| high > low)
        .map(|(partition, _, high)| (*partition, high - 1))
        .collect())
}

/// The partitions of `targets` (partition, last offset) that `table` has not archived up to,
/// as `partition P: ARCHIVED of LAST`; empty when every one is archived.
pub(crate) async fn behind(
    delta_root: &str,
    table: Table,
    topic: &str,
    targets: &[(i32, i64)],
) -> Result<Vec<String>> {
    let partitions: Vec<i32> = targets.iter().map(|(partition, _)| *partition).collect();
    let archived = archived_offsets(delta_root, &HashMap::new(), table, topic, &partitions)
        .await
        .with_context(|| format!("reading {}'s archived offsets under {delta_root}", table.name()))?;
    Ok(targets
        .iter()
        .zip(&archived)
        .filter(|((_, target), archived)| archived.is_none_or(|offset| offset < *target))
        .map(|((partition, target), archived)| {
            let done = archived.map_or_else(|| "nothing".to_owned(), |offset| offset.to_string());
            format!("partition {partition}: {done} of {target}")
        })
        .collect())
}

/// Waits until delta-archiver has archived the topic up to its current end (an error after the
/// timeout names the partitions behind).
pub(crate) async fn wait_for_archiver(wait: ArchiverWait<'_>) -> Result<()> {
    let topic = wait.topic;
    let targets = last_offsets(&wait.kafka, topic).await.with_context(|| {
        format!("finding where {topic} ends, to wait for delta-archiver (--no-wait-for-archiver reads the history as it is)")
    })?;
    let deadline = Instant::now() + Duration::from_secs(wait.timeout_secs);
    let spinner = if wait.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    loop {
        let behind = behind(wait.delta_root, wait.table, topic, &targets).await?;
        if behind.is_empty() {
            spinner.finish_and_clear();
            println!(
                "delta-archiver has archived {topic} up to its end ({} partitions with records)",
                targets.len()
            );
            return Ok(());
        }
        if Instant::now() >= deadline {
            spinner.finish_and_clear();
            bail!(
                "delta-archiver has not archived {topic} up to its end after {} s ({}); is it running? --no-wait-for-archiver reads the history as it is",
                wait.timeout_secs,
                behind.join(", ")
            );
        }
        spinner.set_message(format!(
            "waiting for delta-archiver to archive {topic} up to its end: {}",
            behind.join(", ")
        ));
        spinner.tick();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
