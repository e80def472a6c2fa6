//! A paged HTTP endpoint as a pull source.
//!
//! Protocol: `GET {url}?cursor={cursor}&limit={page_size}` (no `cursor` on the first call) answers
//! `{"events": [...], "next_cursor": "…", "has_more": true|false}`. `5xx`, `408`, `429` and
//! connection errors are retried with backoff (honouring `Retry-After`); other `4xx` are reported
//! and retried slowly.

use std::time::Duration;

use serde::Deserialize;

use super::{FetchFuture, Page, Source};
use crate::config::HttpPollConfig;
use crate::error::IngestError;

/// Polls one endpoint.
pub struct HttpPollSource {
    config: HttpPollConfig,
    client: reqwest::Client,
}

#[derive(Deserialize)]
struct PageBody<'a> {
    #[serde(borrow)]
    events: Vec<&'a serde_json::value::RawValue>,
    #[serde(default)]
    next_cursor: Option<String>,
    #[serde(default)]
    has_more: bool,
}

impl HttpPollSource {
    /// A source with its own connection pool.
    pub fn new(config: HttpPollConfig) -> Result<HttpPollSource, IngestError> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(config.request_timeout_ms))
            .pool_max_idle_per_host(4)
            .build()
            .map_err(|error| IngestError::Source {
                source_name: config.name.clone(),
                message: format!("cannot build HTTP client: {error}"),
                retryable: false,
            })?;
        Ok(HttpPollSource { config, client })
    }

    async fn fetch_page(&self, cursor: Option<&str>) -> Result<Page, IngestError> {
        let failure = |message: String, retryable: bool| IngestError::Source {
            source_name: self.config.name.clone(),
            message,
            retryable,
        };
        let mut query = vec![("limit", self.config.page_size.to_string())];
        if let Some(cursor) = cursor {
            query.push(("cursor", cursor.to_owned()));
        }
        let mut request = self.client.get(&self.config.url).query(&query);
        if !self.config.token.is_empty() {
            request = request.bearer_auth(self.config.token.expose());
        }
        let response = request
            .send()
            .await
            .map_err(|error| failure(format!("GET {}: {error}", self.config.url), true))?;
        let status = response.status();
        if !status.is_success() {
            let retryable = status.is_server_error() || status.as_u16() == 408 || status.as_u16() == 429;
            if let Some(seconds) = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.parse::<u64>().ok())
            {
                tokio::time::sleep(Duration::from_secs(seconds.min(60))).await;
            }
            return Err(failure(
                format!("GET {} answered {status}", self.config.url),
                retryable,
            ));
        }
        let body = response.bytes().await.map_err(|error| {
            failure(
                format!("GET {}: reading the body: {error}", self.config.url),
                true,
            )
        })?;
        // Each record stays a zero-copy slice of the page: validated on the fast path downstream.
        let page: PageBody<'_> = serde_json::from_slice(&body).map_err(|error| {
            failure(
                format!("GET {}: body is not a page: {error}", self.config.url),
                true,
            )
        })?;
        Ok(Page {
            records: page
                .events
                .iter()
                .map(|record| body.slice_ref(record.get().as_bytes()))
                .collect(),
            next_cursor: page.next_cursor,
            has_more: page.has_more,
        })
    }
}

impl Source for HttpPollSource {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn fetch<'a>(&'a self, cursor: Option<&'a str>) -> FetchFuture<'a> {
        Box::pin(self.fetch_page(cursor))
    }

    fn poll_interval(&self) -> Option<Duration> {
        Some(Duration::from_millis(self.config.poll_interval_ms))
    }
}
