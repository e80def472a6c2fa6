//! Parallel pull ingestion: fetch from many slow sources at once, with bounded concurrency, retry
//! with backoff, and a durable cursor per source.
//!
//! Each source is read page by page in its own task (a page's cursor depends on the previous one);
//! sources run concurrently, at most `source_concurrency` fetches in flight across all of them —
//! the async equivalent of a thread pool sized for I/O, without a thread per source. A page is
//! published through the same [`Pipeline`](crate::pipeline::Pipeline) as the HTTP API, and the
//! cursor after it is persisted only once the broker acknowledged the page: a restart resumes from
//! the last acknowledged page — at worst it re-fetches one page, whose events carry the same ids.

mod cursor;
mod http_poll;
#[cfg(feature = "replay")]
mod replay;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use contrail_events::BodyRecord;
use rand::RngExt;
use tokio::sync::Semaphore;

pub use cursor::CursorStore;
pub use http_poll::HttpPollSource;
#[cfg(feature = "replay")]
pub use replay::ReplaySource;

use crate::error::IngestError;
use crate::pipeline::{BatchOutcome, Origin};

/// One page of a source.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    /// Records in the JSON ingest format, one JSON object's bytes each (validated downstream like
    /// any other input, on the fast path).
    pub records: Vec<bytes::Bytes>,
    /// The cursor to resume after this page.
    pub next_cursor: Option<String>,
    /// Whether more is available right now; `false` means caught up.
    pub has_more: bool,
}

/// A boxed future returned by [`Source::fetch`].
pub type FetchFuture<'a> = Pin<Box<dyn Future<Output = Result<Page, IngestError>> + Send + 'a>>;

/// A system ingest pulls events from.
pub trait Source: Send + Sync {
    /// Unique name (cursor key, metrics label).
    fn name(&self) -> &str;
    /// Fetches the page after `cursor` (`None`: from the beginning).
    fn fetch<'a>(&'a self, cursor: Option<&'a str>) -> FetchFuture<'a>;
    /// How long to wait before polling again once caught up; `None` for a finite source that is
    /// done once caught up.
    fn poll_interval(&self) -> Option<Duration>;
}

/// Where pages go. The ingest pipeline in production; a counting sink in benchmarks.
pub trait PageSink: Send + Sync {
    /// Publishes a page's records; resolves once they are durable (or failed).
    fn publish<'a>(
        &'a self,
        records: Vec<BodyRecord>,
        origin: &'a Origin,
    ) -> Pin<Box<dyn Future<Output = Result<BatchOutcome, IngestError>> + Send + 'a>>;
}

impl PageSink for crate::pipeline::Pipeline {
    fn publish<'a>(
        &'a self,
        records: Vec<BodyRecord>,
        origin: &'a Origin,
    ) -> Pin<Box<dyn Future<Output = Result<BatchOutcome, IngestError>> + Send + 'a>> {
        Box::pin(crate::pipeline::Pipeline::publish(self, records, origin))
    }
}

/// Retry policy: exponential backoff with full jitter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// First delay.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (from 1): uniform in `[0, min(max, initial·2^(attempt-1))]`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(20);
        let ceiling = self.initial.saturating_mul(1u32 << exponent).min(self.max);
        let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(rand::rng().random_range(0..=millis))
    }
}

/// Live status of every source, for the admin API.
#[derive(Default)]
pub struct SourceRegistry {
    states: Mutex<BTreeMap<String, contrail_proto::admin::v1::SourceStatus>>,
}

impl SourceRegistry {
    fn update(&self, name: &str, change: impl FnOnce(&mut contrail_proto::admin::v1::SourceStatus)) {
        if let Ok(mut states) = self.states.lock() {
            let entry =
                states
                    .entry(name.to_owned())
                    .or_insert_with(|| contrail_proto::admin::v1::SourceStatus {
                        name: name.to_owned(),
                        ..Default::default()
                    });
            change(entry);
        }
    }

    /// A snapshot of every source.
    pub fn status(&self) -> Vec<contrail_proto::admin::v1::SourceStatus> {
        self.states
            .lock()
            .map(|states| states.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// Runs sources concurrently until they finish or shutdown.
pub struct SourceRunner {
    /// The sink pages go to.
    pub sink: Arc<dyn PageSink>,
    /// Cursor persistence.
    pub cursors: CursorStore,
    /// Fetch slots shared by all sources.
    pub fetch_slots: Arc<Semaphore>,
    /// Retry policy.
    pub backoff: Backoff,
    /// Status for the admin API.
    pub registry: Arc<SourceRegistry>,
    /// Metrics, when running inside the stage.
    pub metrics: Option<crate::metrics::IngestMetrics>,
}

/// What one source did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceReport {
    /// Pages fetched.
    pub pages: u64,
    /// Records fetched.
    pub records: u64,
    /// Fetch or publish attempts that failed and were retried.
    pub retries: u64,
}

impl SourceRunner {
    /// Runs one source until it is done (finite sources) or `stop` fires. Returns what it did.
    pub async fn run_source(
        &self,
        source: Arc<dyn Source>,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<SourceReport, IngestError> {
        let name = source.name().to_owned();
        let origin = Origin::Source(name.clone());
        let mut cursor = self.cursors.load(&name)?;
        let mut report = SourceReport::default();
        tracing::info!(source = %name, cursor = ?cursor, "source starting");
        self.registry
            .update(&name, |status| status.cursor = cursor.clone().unwrap_or_default());
        loop {
            if stop.is_cancelled() {
                return Ok(report);
            }
            let Some(page) = self
                .fetch_with_retry(source.as_ref(), cursor.as_deref(), &stop, &mut report)
                .await
            else {
                return Ok(report);
            };
            report.pages += 1;
            report.records += page.records.len() as u64;
            if let Some(metrics) = &self.metrics {
                metrics.source_pages.with_label_values(&[&name]).inc();
            }
            let records: Vec<BodyRecord> = page
                .records
                .into_iter()
                .enumerate()
                .map(|(index, raw)| BodyRecord::Raw { index, raw })
                .collect();
            if !self
                .publish_with_retry(records, &origin, &stop, &mut report)
                .await
            {
                return Ok(report);
            }
            // Only now is the page durable: advance the cursor.
            if page.next_cursor.is_some() && page.next_cursor != cursor {
                cursor = page.next_cursor;
                if let Some(position) = &cursor {
                    self.cursors.save(&name, position)?;
                }
            }
            let record_count = report.records;
            let pages = report.pages;
            self.registry.update(&name, |status| {
                status.cursor = cursor.clone().unwrap_or_default();
                status.events_fetched = record_count;
                status.pages_fetched = pages;
                status.caught_up = !page.has_more;
            });
            if !page.has_more {
                match source.poll_interval() {
                    None => {
                        tracing::info!(source = %name, pages = report.pages, records = report.records, "source finished");
                        return Ok(report);
                    }
                    Some(interval) => {
                        tokio::select! {
                            _ = stop.cancelled() => return Ok(report),
                            _ = tokio::time::sleep(interval) => {}
                        }
                    }
                }
            }
        }
    }

    async fn fetch_with_retry(
        &self,
        source: &dyn Source,
        cursor: Option<&str>,
        stop: &tokio_util::sync::CancellationToken,
        report: &mut SourceReport,
    ) -> Option<Page> {
        let mut attempt = 0u32;
        loop {
            let fetched = {
                let _slot = tokio::select! {
                    _ = stop.cancelled() => return None,
                    slot = self.fetch_slots.acquire() => slot.ok()?,
                };
                tokio::select! {
                    _ = stop.cancelled() => return None,
                    result = source.fetch(cursor) => result,
                }
            };
            match fetched {
                Ok(page) => return Some(page),
                Err(error) => {
                    attempt += 1;
                    report.retries += 1;
                    if let Some(metrics) = &self.metrics {
                        metrics.source_errors.with_label_values(&[source.name()]).inc();
                    }
                    let message = error.to_string();
                    self.registry.update(source.name(), |status| {
                        status.errors += 1;
                        status.last_error = message.clone();
                    });
                    // Non-retryable errors (e.g. 4xx) still get retried, slowly: a source must not be
                    // abandoned silently; the error is visible in logs, metrics and admin status.
                    let delay = if error.is_retryable() {
                        self.backoff.delay(attempt)
                    } else {
                        self.backoff.max
                    };
                    tracing::warn!(source = source.name(), attempt, ?delay, %error, "fetch failed, retrying");
                    tokio::select! {
                        _ = stop.cancelled() => return None,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    async fn publish_with_retry(
        &self,
        records: Vec<BodyRecord>,
        origin: &Origin,
        stop: &tokio_util::sync::CancellationToken,
        report: &mut SourceReport,
    ) -> bool {
        let mut attempt = 0u32;
        loop {
            match self.sink.publish(records.clone(), origin).await {
                Ok(outcome) if outcome.failed == 0 => return true,
                Ok(outcome) => {
                    tracing::warn!(origin = %origin.describe(), failed = outcome.failed, "page not fully acknowledged, retrying");
                }
                Err(error) => {
                    tracing::warn!(origin = %origin.describe(), %error, "page not published, retrying");
                }
            }
            attempt += 1;
            report.retries += 1;
            tokio::select! {
                _ = stop.cancelled() => return false,
                _ = tokio::time::sleep(self.backoff.delay(attempt)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    /// A finite source of `pages` pages that fails every third fetch.
    struct FlakySource {
        pages: u64,
        fetches: AtomicU64,
    }

    impl Source for FlakySource {
        fn name(&self) -> &str {
            "flaky"
        }
        fn fetch<'a>(&'a self, cursor: Option<&'a str>) -> FetchFuture<'a> {
            Box::pin(async move {
                let call = self.fetches.fetch_add(1, Ordering::SeqCst);
                if call % 3 == 2 {
                    return Err(IngestError::Source {
                        source_name: "flaky".into(),
                        message: "timeout".into(),
                        retryable: true,
                    });
                }
                let position: u64 = cursor.map_or(0, |c| c.parse().unwrap_or(0));
                Ok(Page {
                    records: vec![bytes::Bytes::from(
                        serde_json::json!({"page": position}).to_string(),
                    )],
                    next_cursor: Some((position + 1).to_string()),
                    has_more: position + 1 < self.pages,
                })
            })
        }
        fn poll_interval(&self) -> Option<Duration> {
            None
        }
    }

    #[derive(Default)]
    struct CountingSink {
        records: AtomicUsize,
        pages_seen: Mutex<Vec<Value>>,
    }

    impl PageSink for CountingSink {
        fn publish<'a>(
            &'a self,
            records: Vec<BodyRecord>,
            _origin: &'a Origin,
        ) -> Pin<Box<dyn Future<Output = Result<BatchOutcome, IngestError>> + Send + 'a>> {
            Box::pin(async move {
                self.records.fetch_add(records.len(), Ordering::SeqCst);
                for record in &records {
                    if let BodyRecord::Raw { raw, .. } = record {
                        let value = serde_json::from_slice(raw).expect("test records are JSON");
                        self.pages_seen.lock().expect("lock").push(value);
                    }
                }
                Ok(BatchOutcome {
                    accepted: records.len(),
                    ..BatchOutcome::default()
                })
            })
        }
    }

    fn runner(sink: Arc<CountingSink>, dir: &std::path::Path) -> SourceRunner {
        SourceRunner {
            sink,
            cursors: CursorStore::new(dir.to_owned()),
            fetch_slots: Arc::new(Semaphore::new(4)),
            backoff: Backoff {
                initial: Duration::from_millis(1),
                max: Duration::from_millis(5),
            },
            registry: Arc::new(SourceRegistry::default()),
            metrics: None,
        }
    }

    #[tokio::test]
    async fn retries_failures_and_delivers_every_page_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sink = Arc::new(CountingSink::default());
        let source = Arc::new(FlakySource {
            pages: 10,
            fetches: AtomicU64::new(0),
        });
        let report = runner(sink.clone(), dir.path())
            .run_source(source, tokio_util::sync::CancellationToken::new())
            .await
            .expect("run");
        assert_eq!(report.pages, 10);
        assert!(report.retries >= 4, "every third fetch failed: {report:?}");
        let pages: Vec<u64> = sink
            .pages_seen
            .lock()
            .expect("lock")
            .iter()
            .map(|v| v["page"].as_u64().expect("page"))
            .collect();
        assert_eq!(pages, (0..10).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_restart_resumes_from_the_saved_cursor() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first_sink = Arc::new(CountingSink::default());
        let source = Arc::new(FlakySource {
            pages: 5,
            fetches: AtomicU64::new(0),
        });
        runner(first_sink, dir.path())
            .run_source(source, tokio_util::sync::CancellationToken::new())
            .await
            .expect("run");
        // A longer feed now: the restarted runner must continue at page 5, not re-fetch 0..5.
        let second_sink = Arc::new(CountingSink::default());
        let longer = Arc::new(FlakySource {
            pages: 8,
            fetches: AtomicU64::new(0),
        });
        runner(second_sink.clone(), dir.path())
            .run_source(longer, tokio_util::sync::CancellationToken::new())
            .await
            .expect("run");
        let pages: Vec<u64> = second_sink
            .pages_seen
            .lock()
            .expect("lock")
            .iter()
            .map(|v| v["page"].as_u64().expect("page"))
            .collect();
        assert_eq!(pages, vec![5, 6, 7]);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        for attempt in 1..30 {
            assert!(backoff.delay(attempt) <= Duration::from_secs(1));
        }
        assert!(backoff.delay(1) <= Duration::from_millis(100));
    }
}
