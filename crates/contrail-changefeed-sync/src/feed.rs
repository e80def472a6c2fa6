//! Reading one feed range: pages from the lease's stored continuation, each page's changes
//! published in order and acknowledged before the page's continuation is stored in the lease.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use azure_data_cosmos::FeedScope;
use azure_data_cosmos::feed::ContinuationToken;
use azure_data_cosmos::options::{ChangeFeedOptions, ChangeFeedStartFrom, MaxItemCountHint};
use contrail_common::trace::{TraceParent, traceparent_headers};
use contrail_proto::v1::ServingChange;
use futures::StreamExt;
use prost::Message as _;
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::change::serving_change;
use crate::error::ChangefeedError;
use crate::lease::{OwnedLease, change_label, now_ms};
use crate::shared::{Shared, update_board};

/// One poll: pages from the stored continuation until caught up; each page published and
/// acknowledged before its continuation is stored.
pub(crate) async fn poll_once(
    shared: &Shared,
    lease: &OwnedLease,
    stop: &AtomicBool,
    range: &azure_data_cosmos::feed::FeedRange,
    range_text: &str,
    page_size: NonZeroU32,
    poll: Duration,
) -> Result<(), ChangefeedError> {
    let (continuation, incarnation) = {
        let document = lease.lock().await;
        (document.continuation.clone(), document.incarnation)
    };
    let max_message_bytes = shared.config.kafka.max_message_bytes();
    // The highest `_lsn` published per physical range in this poll (see `label_physical_ranges`).
    let mut published_lsn: HashMap<String, i64> = HashMap::new();
    let mut options = ChangeFeedOptions::default().with_max_item_count(MaxItemCountHint::Limit(page_size));
    if let Some(token) = continuation {
        options = options.with_continuation_token(ContinuationToken::from_string(token));
    }
    let mut pages = shared
        .store
        .monitored()
        .query_change_feed::<serde_json::Value>(
            FeedScope::range(range.clone()),
            ChangeFeedStartFrom::Beginning,
            Some(options),
        )
        .await
        .map_err(|error| contrail_cosmos::CosmosStoreError::service("query change feed", &error))?;
    // The stream never ends: an empty page means this (sub-)range has nothing new. A range split
    // into children answers one empty page per child, so two in a row end the poll; a child not
    // reached this poll is read from the same continuation on the next.
    let mut empty_pages = 0;
    while empty_pages < 2 && !stop.load(Ordering::Relaxed) {
        let Some(page) = pages.next().await else { break };
        let page = page
            .map_err(|error| contrail_cosmos::CosmosStoreError::service("read change feed page", &error))?;
        shared.metrics.pages.inc();
        let items = page.into_items();
        if items.is_empty() {
            empty_pages += 1;
            let document = lease.lock().await.clone();
            update_board(shared, &document, 0.0);
            continue;
        }
        empty_pages = 0;
        let read_at = Instant::now();
        // A span per page, from its arrival until its changes are published and the lease
        // advanced (serving documents carry no trace context: the page starts its own trace).
        let page_span = tracing::info_span!(
            "changefeed-sync.page",
            cosmos.feed_range = range_text,
            items = items.len(),
            published = tracing::field::Empty,
            last_lsn = tracing::field::Empty,
        );
        let mut changes: Vec<ServingChange> = Vec::with_capacity(items.len());
        for item in &items {
            let Some(document) = item.current() else {
                tracing::warn!(
                    range = range_text,
                    "change feed item without a current document skipped"
                );
                continue;
            };
            match serving_change(document, range_text, max_message_bytes) {
                Ok(change) => changes.push(change),
                Err(reason) => tracing::warn!(%reason, "change feed item skipped"),
            }
        }
        label_physical_ranges(shared, &mut changes, &mut published_lsn, incarnation).await?;
        // Handed to the producer one after the other, in the page's order (a full queue is
        // waited out before the next change), then every acknowledgement is awaited.
        // The changes carry the page's context: their Delta rows continue the page's trace.
        let page_trace = TraceParent::of_span(&page_span).map(|context| context.header());
        let mut deliveries = Vec::with_capacity(changes.len());
        for change in &changes {
            let payload = change.encode_to_vec();
            deliveries.push(
                enqueue(
                    &shared.producer,
                    &shared.config.topics.changes,
                    &change.flight_key,
                    &payload,
                    page_trace.as_deref(),
                )
                .await?,
            );
        }
        for delivery in deliveries {
            match delivery.await {
                Ok(Ok(_)) => {}
                Ok(Err((error, _))) => {
                    return Err(ChangefeedError::Broker(format!("publish change: {error}")));
                }
                Err(_) => {
                    return Err(ChangefeedError::Broker(
                        "publish change: producer gone".to_owned(),
                    ));
                }
            }
        }
        shared
            .metrics
            .publish_seconds
            .observe(read_at.elapsed().as_secs_f64());
        let missing = changes.iter().filter(|change| change.lsn == 0).count();
        shared.metrics.missing_lsn.inc_by(missing as u64);
        shared.metrics.published.inc_by(changes.len() as u64);
        let token = pages
            .to_continuation_token()
            .map_err(|error| contrail_cosmos::CosmosStoreError::service("continuation token", &error))?;
        let mut document = lease.lock().await;
        let mut next = document.clone();
        next.continuation = Some(token.as_str().to_owned());
        if let Some(last) = changes.iter().max_by_key(|change| (change.ts, change.lsn)) {
            next.last_lsn = next.last_lsn.max(last.lsn);
            next.last_ts = next.last_ts.max(last.ts);
        }
        next.published = next.published.saturating_add(changes.len() as u64);
        next.renewed_at_ms = now_ms();
        *document = shared.store.replace(&next).await?;
        page_span.record("published", changes.len());
        page_span.record("last_lsn", document.last_lsn);
        let lag = (now_ms() / 1000 - document.last_ts).max(0) as f64;
        update_board(shared, &document, lag);
        drop(document);
        if items.len() < (page_size.get() as usize).div_ceil(2) {
            // A page well short of the page size (a page the service cut for its size is not):
            // this range is caught up. Reading on at once would cost one request per few changes
            // under a steady trickle — each read of a feed costs at the service, and the local
            // endpoint copies the whole partition per read — so the next page waits a poll
            // interval and reads what arrived meanwhile as one batch.
            wait_unless_stopped(poll, stop).await;
        }
    }
    Ok(())
}

/// Sleeps `pause`, returning early once `stop` is set (checked every 50 ms).
async fn wait_unless_stopped(pause: Duration, stop: &AtomicBool) {
    let until = Instant::now() + pause;
    while !stop.load(Ordering::Relaxed) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(Duration::from_millis(50))).await;
    }
}

/// Sets each change's `feed_range` to the physical range that holds its document. `_lsn` grows
/// within a physical partition, and delta-archiver keeps, per (topic partition, `feed_range`), the
/// highest `_lsn` it archived, dropping anything at or below it (docs/CONTRACT.md, "Change feed").
/// A lease's range keeps covering the children of a split, whose `_lsn` sequences interleave:
/// labelled with the lease's range, a child's changes could fall below its sibling's and be taken
/// for copies. A change whose `_lsn` is not above what this poll already published for its range
/// means the routing map is stale (a split since it was read): it is read again and the change
/// labelled anew. Changes of a replaced container carry its incarnation too ([`change_label`]).
async fn label_physical_ranges(
    shared: &Shared,
    changes: &mut [ServingChange],
    published_lsn: &mut HashMap<String, i64>,
    incarnation: u32,
) -> Result<(), ChangefeedError> {
    for change in changes.iter_mut() {
        let mut range = shared.store.physical_range(&change.flight_key, false).await?;
        if published_lsn.get(&range).is_some_and(|&last| change.lsn <= last) {
            range = shared.store.physical_range(&change.flight_key, true).await?;
            if published_lsn.get(&range).is_some_and(|&last| change.lsn <= last) {
                tracing::error!(id = %change.id, lsn = change.lsn, %range, "a change's _lsn is not above its partition's last published one: history may take it for a copy");
            }
        }
        let last = published_lsn.entry(range.clone()).or_insert(i64::MIN);
        *last = (*last).max(change.lsn);
        change.feed_range = change_label(&range, incarnation);
    }
    Ok(())
}

/// Hands one record to the producer, waiting while its queue is full (so records are enqueued in
/// the caller's order).
async fn enqueue(
    producer: &FutureProducer,
    topic: &str,
    key: &str,
    payload: &[u8],
    traceparent: Option<&str>,
) -> Result<rdkafka::producer::DeliveryFuture, ChangefeedError> {
    loop {
        let mut record = FutureRecord::to(topic).key(key).payload(payload);
        if let Some(traceparent) = traceparent {
            record = record.headers(traceparent_headers(traceparent.as_bytes()));
        }
        match producer.send_result(record) {
            Ok(delivery) => return Ok(delivery),
            Err((
                rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                _,
            )) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err((error, _)) => return Err(ChangefeedError::Broker(format!("publish change: {error}"))),
        }
    }
}
