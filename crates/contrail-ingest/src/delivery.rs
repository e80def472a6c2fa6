//! Delivery reports per request: the producer's delivery callback counts a request's records down
//! and answers the request once, with the records that failed, when the broker resolved the last
//! one — instead of a future per record awaited one after the other.
//!
//! A [`Request`] also holds the batch's capacity permit: it is released (and the in-flight gauge
//! lowered) when the last reference goes, that is when every record was resolved by the broker or
//! dropped by the producer, even after the client was answered on a timeout.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::ClientContext;
use rdkafka::producer::{DeliveryResult, ProducerContext, ThreadedProducer};
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::metrics::IngestMetrics;

/// Ingest's producer: a polling thread runs [`Tracking::delivery`] for every record.
pub type IngestProducer = ThreadedProducer<Tracking>;

/// Indexes of a request's records that failed, with why (said for the client).
pub type Failures = Vec<(usize, String)>;

/// The producer context: routes each delivery report to its request.
pub struct Tracking;

impl ClientContext for Tracking {}

impl ProducerContext for Tracking {
    type DeliveryOpaque = Box<Pending>;

    fn delivery(&self, result: &DeliveryResult<'_>, pending: Box<Pending>) {
        let failure = result
            .as_ref()
            .err()
            .map(|(error, _)| format!("broker refused the record: {error}"));
        pending.request.resolve(pending.index, failure);
    }
}

/// One record of a request, travelling with it through the producer.
pub struct Pending {
    request: Arc<Request>,
    index: usize,
}

/// One batch's records on their way to the broker.
pub struct Request {
    /// Records not resolved yet, plus one while records are still being handed to the producer
    /// (so the request cannot complete before the last one is sent).
    remaining: AtomicUsize,
    failures: Mutex<Failures>,
    answer: Mutex<Option<oneshot::Sender<Failures>>>,
    count: usize,
    metrics: IngestMetrics,
    _permits: Vec<OwnedSemaphorePermit>,
}

impl Request {
    /// A request of `count` records holding `permits` (of the record and byte bounds); the
    /// receiver gets the failures once every record is resolved and [`Request::sent`] was called.
    pub fn new(
        count: usize,
        permits: Vec<OwnedSemaphorePermit>,
        metrics: IngestMetrics,
    ) -> (Arc<Request>, oneshot::Receiver<Failures>) {
        let (sender, receiver) = oneshot::channel();
        let request = Request {
            remaining: AtomicUsize::new(count + 1),
            failures: Mutex::new(Vec::new()),
            answer: Mutex::new(Some(sender)),
            count,
            metrics,
            _permits: permits,
        };
        (Arc::new(request), receiver)
    }

    /// The opaque for record `index`, to send with it.
    pub fn record(self: &Arc<Self>, index: usize) -> Box<Pending> {
        Box::new(Pending {
            request: Arc::clone(self),
            index,
        })
    }

    /// Record `index` is resolved: delivered (`None`) or failed with a reason. Call once per record
    /// (the delivery callback does for records the producer took).
    pub fn resolve(&self, index: usize, failure: Option<String>) {
        if let Some(reason) = failure {
            self.failures
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push((index, reason));
        }
        self.count_down();
    }

    /// Every record was handed to the producer (or resolved as refused).
    pub fn sent(&self) {
        self.count_down();
    }

    fn count_down(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let failures = std::mem::take(
                &mut *self
                    .failures
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            );
            if let Some(answer) = self
                .answer
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .take()
            {
                let _ = answer.send(failures);
            }
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        // Every record is resolved or gone with the producer: capacity is free again.
        self.metrics.in_flight_records.sub(self.count as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::Semaphore;

    fn request(count: usize, capacity: &Arc<Semaphore>) -> (Arc<Request>, oneshot::Receiver<Failures>) {
        let permit = capacity
            .clone()
            .try_acquire_many_owned(count as u32)
            .expect("permits");
        let registry = contrail_common::metrics::MetricsRegistry::new();
        Request::new(count, vec![permit], IngestMetrics::new(&registry))
    }

    #[test]
    fn answers_once_every_record_is_resolved_and_all_were_sent() {
        let capacity = Arc::new(Semaphore::new(10));
        let (request, mut answer) = request(3, &capacity);
        let opaques: Vec<_> = (0..3).map(|index| request.record(index)).collect();
        request.resolve(2, Some("refused".to_owned()));
        request.resolve(0, None);
        assert!(answer.try_recv().is_err(), "one record is still on its way");
        request.resolve(1, None);
        assert!(answer.try_recv().is_err(), "records are still being sent");
        request.sent();
        assert_eq!(
            answer.try_recv().expect("answer"),
            vec![(2, "refused".to_owned())]
        );
        assert_eq!(
            capacity.available_permits(),
            7,
            "the opaques still hold the request"
        );
        drop(opaques);
        drop(request);
        assert_eq!(capacity.available_permits(), 10);
    }

    #[test]
    fn a_request_dropped_unresolved_frees_its_capacity_and_closes_the_answer() {
        let capacity = Arc::new(Semaphore::new(4));
        let (request, mut answer) = request(4, &capacity);
        let opaque = request.record(0);
        drop(request);
        assert_eq!(capacity.available_permits(), 0);
        drop(opaque);
        assert_eq!(capacity.available_permits(), 4);
        assert!(matches!(
            answer.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
    }
}
