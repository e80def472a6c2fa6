//! nycflights13 as a pull source: the replay stream, paged, rate-limited, resumable.
//!
//! The cursor is the number of deliveries already published. The stream is deterministic for a
//! given configuration, so after a restart the source regenerates it and skips that many.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::NaiveDate;
use contrail_flightdata::{FlightData, ReplayConfig, ReplayStream};

use super::{FetchFuture, Page, Source};
use crate::config::ReplaySourceConfig;
use crate::error::IngestError;

/// Replays real flights.
pub struct ReplaySource {
    config: ReplaySourceConfig,
    state: Mutex<ReplayState>,
}

struct ReplayState {
    stream: Option<ReplayStream>,
    position: u64,
    started: Instant,
    published_since_start: u64,
}

impl ReplaySource {
    /// A replay source; the data is loaded on first fetch.
    pub fn new(config: ReplaySourceConfig) -> ReplaySource {
        ReplaySource {
            config,
            state: Mutex::new(ReplayState {
                stream: None,
                position: 0,
                started: Instant::now(),
                published_since_start: 0,
            }),
        }
    }

    fn error(&self, message: String) -> IngestError {
        IngestError::Source {
            source_name: self.config.name.clone(),
            message,
            retryable: false,
        }
    }

    fn open_stream(&self) -> Result<ReplayStream, IngestError> {
        let data_dir = match &self.config.data_dir {
            Some(dir) => dir.clone(),
            None => contrail_flightdata::default_data_dir().ok_or_else(|| {
                self.error(
                    "no data_dir configured and the shipped nycflights13 data was not found (data/nycflights13 in the working directory or one above it; or set CONTRAIL_FLIGHT_DATA)".to_owned(),
                )
            })?,
        };
        let parse_date = |key: &str, value: &Option<String>| -> Result<Option<NaiveDate>, IngestError> {
            value
                .as_deref()
                .map(|text| {
                    NaiveDate::parse_from_str(text, "%Y-%m-%d")
                        .map_err(|error| self.error(format!("{key} {text:?}: {error}")))
                })
                .transpose()
        };
        let from = parse_date("from", &self.config.from)?;
        let to = parse_date("to", &self.config.to)?;
        let data = FlightData::load(&data_dir, from, to).map_err(|error| self.error(error.to_string()))?;
        let replay = ReplayConfig {
            seed: self.config.seed,
            duplicate_rate: self.config.duplicate_rate,
            max_disorder: chrono::Duration::minutes(self.config.max_disorder_minutes),
            straggler_rate: self.config.straggler_rate,
            ..ReplayConfig::default()
        };
        Ok(ReplayStream::new(data, replay))
    }

    fn next_page(&self, cursor: Option<&str>) -> Result<(Page, Duration), IngestError> {
        let wanted: u64 = match cursor {
            None => 0,
            Some(text) => text
                .parse()
                .map_err(|_| self.error(format!("cursor {text:?} is not a position")))?,
        };
        let mut state = self
            .state
            .lock()
            .map_err(|_| self.error("replay state poisoned".to_owned()))?;
        if state.stream.is_none() || state.position != wanted {
            let mut stream = self.open_stream()?;
            for _ in 0..wanted {
                if stream.next().is_none() {
                    break;
                }
            }
            state.stream = Some(stream);
            state.position = wanted;
        }
        let page_size = self.config.page_size.max(1);
        let mut records = Vec::with_capacity(page_size);
        if let Some(stream) = state.stream.as_mut() {
            for delivery in stream.by_ref().take(page_size) {
                records.push(bytes::Bytes::from(delivery.event.to_json().to_string()));
            }
        }
        let fetched = records.len() as u64;
        state.position += fetched;
        state.published_since_start += fetched;
        // Rate limit: how long until this page is due at `rate_limit` events/s.
        let wait = if self.config.rate_limit > 0 {
            let due =
                Duration::from_secs_f64(state.published_since_start as f64 / self.config.rate_limit as f64);
            due.saturating_sub(state.started.elapsed())
        } else {
            Duration::ZERO
        };
        let page = Page {
            has_more: fetched == page_size as u64,
            next_cursor: Some(state.position.to_string()),
            records,
        };
        Ok((page, wait))
    }
}

impl Source for ReplaySource {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn fetch<'a>(&'a self, cursor: Option<&'a str>) -> FetchFuture<'a> {
        Box::pin(async move {
            let cursor_owned = cursor.map(str::to_owned);
            // Loading and generating is CPU work: off the async workers.
            let (page, wait) = tokio::task::block_in_place(|| self.next_page(cursor_owned.as_deref()))?;
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            Ok(page)
        })
    }

    fn poll_interval(&self) -> Option<Duration> {
        None
    }
}
