//! Sending a consumed record a stage cannot process to the dead-letter topic.

use std::time::Duration;

use contrail_proto::v1::SourcePosition;
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::dead_letter::Unprocessable;
use crate::trace::TraceParent;

/// How long a dead letter may wait for the broker's acknowledgement.
const SEND_TIMEOUT: Duration = Duration::from_secs(300);

/// A stage's dead-letter topic: each letter carries the record (fitted to one message), its
/// position, what it should have been and why it was refused, keyed and traced as the record.
pub struct DeadLetters<'a> {
    /// The producer (idempotent, acks=all).
    pub producer: &'a FutureProducer,
    /// The dead-letter topic.
    pub topic: &'a str,
    /// The stage that refuses the record (the letter's `stage`).
    pub stage: &'static str,
    /// The broker's largest message.
    pub max_message_bytes: usize,
}

impl DeadLetters<'_> {
    /// Sends `message`'s dead letter and waits for the broker to acknowledge it: without that
    /// acknowledgement the record's partition must not be committed past it. `content_type` is
    /// what the record should have been; `rejected_at_us` is 0 where outputs are deterministic.
    pub async fn send(
        &self,
        message: &OwnedMessage,
        reason: String,
        content_type: String,
        rejected_at_us: i64,
    ) -> Result<(), KafkaError> {
        let key = message.key().unwrap_or_default();
        let payload = Unprocessable {
            position: SourcePosition {
                topic: message.topic().to_owned(),
                partition: message.partition(),
                offset: message.offset(),
            },
            key,
            payload: message.payload().unwrap_or_default(),
            content_type,
        }
        .dead_letter(self.stage, reason, rejected_at_us, self.max_message_bytes);
        let mut record = FutureRecord::to(self.topic).key(key).payload(&payload);
        if let Some(trace) = TraceParent::of_record(message.headers()) {
            record = record.headers(trace.record_headers());
        }
        self.producer
            .send(record, SEND_TIMEOUT)
            .await
            .map(|_| ())
            .map_err(|(error, _)| error)
    }
}
