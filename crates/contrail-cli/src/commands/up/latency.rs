//! Latency in the summary: to Delta for every event (its file's commit time − ingest time), and
//! to Cosmos DB for every N-th flight (ingest's acknowledgement of its first events → the first
//! point read that finds its document; polled every 50 ms, 16 flights at a time).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::stores::Stores;

/// Samples the latency to Cosmos DB of every `every`-th flight (0: none).
pub(super) struct CosmosSampler {
    task: tokio::task::JoinHandle<()>,
    latencies: Arc<Mutex<Vec<f64>>>,
}

impl CosmosSampler {
    /// Starts the sampler; the returned function is called with every batch ingest acknowledged
    /// (drop it to end the sampling once the pending flights showed up).
    pub(super) fn start(stores: Stores, every: u64) -> (CosmosSampler, impl Fn(&[Value]) + Sync) {
        let latencies = Arc::new(Mutex::new(Vec::<f64>::new()));
        let (samples, mut sample_queue) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
        let task = tokio::spawn({
            let latencies = latencies.clone();
            async move {
                let limit = Arc::new(tokio::sync::Semaphore::new(16));
                let mut pollers = tokio::task::JoinSet::new();
                while let Some((key, acknowledged)) = sample_queue.recv().await {
                    let Ok(permit) = limit.clone().acquire_owned().await else {
                        break;
                    };
                    let (stores, latencies) = (stores.clone(), latencies.clone());
                    pollers.spawn(async move {
                        let _permit = permit;
                        while acknowledged.elapsed() < Duration::from_secs(120) {
                            if let Ok(Some(_)) = stores.flight(&key).await {
                                let ms = acknowledged.elapsed().as_secs_f64() * 1000.0;
                                latencies
                                    .lock()
                                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                                    .push(ms);
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    });
                }
                while pollers.join_next().await.is_some() {}
            }
        });
        let seen_flights = Mutex::new(HashSet::<String>::new());
        let on_ack = move |batch: &[Value]| {
            if every == 0 {
                return;
            }
            let acknowledged = Instant::now();
            let mut seen = seen_flights
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            for event in batch {
                let (key, _) = crate::input::identity(event);
                if seen.contains(&key) {
                    continue;
                }
                seen.insert(key.clone());
                if (seen.len() as u64).is_multiple_of(every) {
                    let _ = samples.send((key, acknowledged));
                }
            }
        };
        (CosmosSampler { task, latencies }, on_ack)
    }

    /// Waits for the pending samples; their distribution.
    pub(super) async fn finish(self) -> Value {
        let _ = self.task.await;
        let mut values = self
            .latencies
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        distribution(&mut values)
    }
}

/// p50 / p90 / p99 / max of `values` (ms), and their count.
pub(super) fn distribution(values: &mut [f64]) -> Value {
    if values.is_empty() {
        return json!({ "samples": 0 });
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    json!({
        "samples": values.len(),
        "p50": at(0.50).round(),
        "p90": at(0.90).round(),
        "p99": at(0.99).round(),
        "max": at(1.0).round(),
    })
}

/// Per accepted event: when its Delta file was committed − when ingest accepted it, ms.
pub(super) async fn delta_latencies(stores: &Stores) -> Result<Vec<f64>> {
    use contrail_history::arrow::array::{Array, TimestampMicrosecondArray};
    let scan = stores.scan_events(&["ingested_at"]).await?;
    let mut values = Vec::with_capacity(scan.rows());
    for file in &scan.files {
        for batch in &file.batches {
            let Some(column) = batch
                .column_by_name("ingested_at")
                .and_then(|column| column.as_any().downcast_ref::<TimestampMicrosecondArray>())
            else {
                bail!("events.ingested_at is not a microsecond timestamp");
            };
            for row in 0..column.len() {
                if column.is_valid(row) {
                    values.push((file.added_at_ms * 1000 - column.value(row)) as f64 / 1000.0);
                }
            }
        }
    }
    Ok(values)
}

/// When the stores held everything, from their own commit times: the newest commit of `events`,
/// `flight_states` and `serving_changes` (the last follows every Cosmos write, through
/// changefeed-sync), ms since the epoch. The settle loop's "settled" comes later: it confirms
/// by reading every store, every 3 s, and the topics' ends past a quiet period.
pub(super) async fn stores_complete_ms(stores: &Stores) -> Result<Option<i64>> {
    use contrail_history::Table;
    let mut newest = None;
    for (table, column) in [
        (Table::Events, "flight_key"),
        (Table::FlightStates, "flight_key"),
        (Table::ServingChanges, "id"),
    ] {
        newest = newest.max(stores.last_commit_ms(table, column).await?);
    }
    Ok(newest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distributions_are_nearest_rank_percentiles() {
        let mut values: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let summary = distribution(&mut values);
        assert_eq!(summary["samples"], 100);
        assert_eq!(summary["p50"], 51.0);
        assert_eq!(summary["p99"], 99.0);
        assert_eq!(summary["max"], 100.0);
        assert_eq!(distribution(&mut [])["samples"], 0);
    }
}
