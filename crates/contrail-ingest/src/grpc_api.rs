//! The gRPC ingest service and the ingest stage's admin service.
//!
//! gRPC records are turned into the JSON shape of docs/CONTRACT.md ("Events") and go through
//! exactly the validation and publish path of the HTTP API. Rejected records are reported per
//! record with status OK (like HTTP's per-record results); records the broker did not acknowledge
//! make the call fail with `UNAVAILABLE` (retry the batch), over capacity with
//! `RESOURCE_EXHAUSTED`.

use std::sync::Arc;

use contrail_common::admin::{AdminControls, StageAdmin, StageStatus};
use contrail_common::trace::{TRACEPARENT, TraceParent};
use contrail_events::BodyRecord;
use contrail_proto::admin::v1 as admin;
use contrail_proto::ingest::v1 as ingest;
use futures::StreamExt;
use serde_json::{Map, Value, json};
use tonic::{Request, Response, Status, Streaming};

use crate::error::IngestError;
use crate::pipeline::{BatchOutcome, Origin, Pipeline, RecordStatus};
use crate::sources::SourceRegistry;

/// Implements `contrail.ingest.v1.IngestService`.
#[derive(Clone)]
pub struct IngestGrpc {
    pipeline: Pipeline,
    max_records_per_request: usize,
}

impl IngestGrpc {
    /// A service over the shared pipeline.
    pub fn new(pipeline: Pipeline, max_records_per_request: usize) -> IngestGrpc {
        IngestGrpc {
            pipeline,
            max_records_per_request,
        }
    }

    async fn publish_batch(
        &self,
        events: Vec<ingest::EventInput>,
        first_index: usize,
        parent: Option<TraceParent>,
    ) -> Result<ingest::PublishResponse, Status> {
        if events.len() > self.max_records_per_request {
            return Err(Status::invalid_argument(format!(
                "batch holds {} records; limits.max_records_per_request = {}",
                events.len(),
                self.max_records_per_request
            )));
        }
        let records = events
            .into_iter()
            .enumerate()
            .map(|(index, event)| {
                let value = event_input_to_json(event);
                let raw = serde_json::to_vec(&value).unwrap_or_default();
                BodyRecord::Parsed { index, value, raw }
            })
            .collect();
        let outcome = self
            .pipeline
            .publish_traced(records, &Origin::Grpc, parent)
            .await
            .map_err(status_of)?;
        if outcome.failed > 0 {
            return Err(Status::unavailable(format!(
                "{} records were not acknowledged by the broker; retry the batch",
                outcome.failed
            )));
        }
        Ok(response_of(&outcome, first_index))
    }
}

fn status_of(error: IngestError) -> Status {
    match error {
        IngestError::OverCapacity { .. } => Status::resource_exhausted(error.to_string()),
        IngestError::BrokerUnavailable(_) => Status::unavailable(error.to_string()),
        other => Status::internal(other.to_string()),
    }
}

fn response_of(outcome: &BatchOutcome, first_index: usize) -> ingest::PublishResponse {
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    ingest::PublishResponse {
        accepted: count(outcome.accepted),
        rejected: count(outcome.rejected),
        failed: count(outcome.failed),
        results: outcome
            .records
            .iter()
            .map(|record| {
                let (status, errors) = match &record.status {
                    RecordStatus::Accepted => (ingest::RecordStatus::Accepted, Vec::new()),
                    RecordStatus::Rejected(errors) => (
                        ingest::RecordStatus::Rejected,
                        errors
                            .iter()
                            .map(|error| ingest::FieldErrorInfo {
                                field: error.field.clone(),
                                message: error.message.clone(),
                            })
                            .collect(),
                    ),
                    RecordStatus::Failed(reason) => (
                        ingest::RecordStatus::Failed,
                        vec![ingest::FieldErrorInfo {
                            field: String::new(),
                            message: reason.clone(),
                        }],
                    ),
                };
                ingest::RecordResult {
                    index: count(first_index + record.index),
                    event_id: record.event_id.clone().unwrap_or_default(),
                    status: status as i32,
                    errors,
                }
            })
            .collect(),
    }
}

/// The JSON ingest shape of a gRPC record; empty strings count as missing fields.
pub fn event_input_to_json(event: ingest::EventInput) -> Value {
    let mut object = Map::new();
    let mut put_text = |key: &str, text: String| {
        if !text.is_empty() {
            object.insert(key.to_owned(), Value::String(text));
        }
    };
    put_text("event_id", event.event_id);
    put_text("source", event.source);
    put_text("type", event.r#type);
    put_text("event_time", event.event_time);
    if let Some(flight) = event.flight {
        let mut flight_object = Map::new();
        for (key, text) in [
            ("carrier", flight.carrier),
            ("origin", flight.origin),
            ("date", flight.date),
        ] {
            if !text.is_empty() {
                flight_object.insert(key.to_owned(), Value::String(text));
            }
        }
        if flight.number != 0 {
            flight_object.insert("number".to_owned(), json!(flight.number));
        }
        object.insert("flight".to_owned(), Value::Object(flight_object));
    }
    if let Some(data) = event.data {
        object.insert("data".to_owned(), struct_to_json(data));
    }
    Value::Object(object)
}

fn struct_to_json(data: prost_types::Struct) -> Value {
    Value::Object(
        data.fields
            .into_iter()
            .map(|(key, value)| (key, protobuf_value_to_json(value)))
            .collect(),
    )
}

fn protobuf_value_to_json(value: prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(flag)) => Value::Bool(flag),
        // protobuf has only doubles: integral values become JSON integers (e.g. delay_minutes).
        Some(Kind::NumberValue(number)) if number.fract() == 0.0 && number.abs() < 9.0e15 => {
            json!(number as i64)
        }
        Some(Kind::NumberValue(number)) => {
            serde_json::Number::from_f64(number).map_or(Value::Null, Value::Number)
        }
        Some(Kind::StringValue(text)) => Value::String(text),
        Some(Kind::ListValue(list)) => {
            Value::Array(list.values.into_iter().map(protobuf_value_to_json).collect())
        }
        Some(Kind::StructValue(inner)) => struct_to_json(inner),
    }
}

#[tonic::async_trait]
impl ingest::ingest_service_server::IngestService for IngestGrpc {
    async fn publish(
        &self,
        request: Request<ingest::PublishRequest>,
    ) -> Result<Response<ingest::PublishResponse>, Status> {
        let parent = traceparent_of(request.metadata());
        self.publish_batch(request.into_inner().events, 0, parent)
            .await
            .map(Response::new)
    }

    async fn publish_stream(
        &self,
        request: Request<Streaming<ingest::PublishRequest>>,
    ) -> Result<Response<ingest::PublishResponse>, Status> {
        let parent = traceparent_of(request.metadata());
        let mut stream = request.into_inner();
        let mut total = ingest::PublishResponse::default();
        let mut next_index = 0usize;
        while let Some(message) = stream.next().await {
            let events = message?.events;
            let batch_size = events.len();
            let response = self.publish_batch(events, next_index, parent).await?;
            next_index += batch_size;
            total.accepted += response.accepted;
            total.rejected += response.rejected;
            total.results.extend(response.results);
        }
        Ok(Response::new(total))
    }
}

/// The request's trace context (`traceparent` metadata), if it carries a valid one.
fn traceparent_of(metadata: &tonic::metadata::MetadataMap) -> Option<TraceParent> {
    metadata
        .get(TRACEPARENT)
        .and_then(|value| TraceParent::parse(value.as_bytes()))
}

/// What ingest answers in the admin API (served by [`contrail_common::admin::AdminApi`]): its
/// status; it keeps no checkpoints or key state.
#[derive(Clone)]
pub struct IngestAdmin {
    pipeline: Pipeline,
    sources: Arc<SourceRegistry>,
    controls: AdminControls,
    instance: String,
    metrics: crate::metrics::IngestMetrics,
}

impl IngestAdmin {
    /// ingest's part of the admin service; `controls` give the uptime.
    pub fn new(
        pipeline: Pipeline,
        sources: Arc<SourceRegistry>,
        controls: AdminControls,
        instance: String,
        metrics: crate::metrics::IngestMetrics,
    ) -> IngestAdmin {
        IngestAdmin {
            pipeline,
            sources,
            controls,
            instance,
            metrics,
        }
    }
}

fn sum_counter(counter: &prometheus::IntCounterVec) -> f64 {
    use prometheus::core::Collector;
    counter
        .collect()
        .iter()
        .flat_map(|family| {
            family
                .get_metric()
                .iter()
                .map(|metric| metric.get_counter().get_value())
        })
        .sum()
}

#[tonic::async_trait]
impl StageStatus for IngestAdmin {
    async fn status(&self) -> Result<admin::StatusResponse, Status> {
        let counters = [
            ("records_received_total", &self.metrics.records_received),
            ("events_accepted_total", &self.metrics.events_accepted),
            ("records_rejected_total", &self.metrics.records_rejected),
            ("records_failed_total", &self.metrics.records_failed),
            ("requests_throttled_total", &self.metrics.requests_throttled),
        ]
        .into_iter()
        .map(|(name, counter)| (name.to_owned(), sum_counter(counter)))
        .collect();
        let uptime = self.controls.uptime_seconds();
        Ok(admin::StatusResponse {
            instance: self.instance.clone(),
            uptime_seconds: uptime as i64,
            partitions: Vec::new(),
            events_per_second: sum_counter(&self.metrics.events_accepted) / uptime,
            counters,
            sources: self.sources.status(),
            in_flight: self.pipeline.in_flight() as u64,
            leases: Vec::new(),
            ..admin::StatusResponse::default()
        })
    }
}

impl StageAdmin for IngestAdmin {
    fn no_checkpoints(&self) -> &'static str {
        "ingest is stateless: it keeps no checkpoints and no per-key state"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_records_become_contract_json() {
        let mut fields = std::collections::BTreeMap::new();
        fields.insert(
            "delay_minutes".to_owned(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::NumberValue(25.0)),
            },
        );
        let event = ingest::EventInput {
            event_id: "e1".into(),
            source: "aodb".into(),
            r#type: "DELAYED".into(),
            event_time: "2013-01-01T10:00:00Z".into(),
            flight: Some(ingest::FlightInput {
                carrier: "UA".into(),
                number: 1545,
                origin: "EWR".into(),
                date: "2013-01-01".into(),
            }),
            data: Some(prost_types::Struct {
                fields: fields.into_iter().collect(),
            }),
        };
        let value = event_input_to_json(event);
        let validated =
            contrail_events::validate_record(&value, &contrail_events::Limits::default(), 0).expect("valid");
        assert_eq!(validated.data.and_then(|d| d.delay_minutes), Some(25));
    }

    #[test]
    fn empty_grpc_fields_are_reported_missing() {
        let value = event_input_to_json(ingest::EventInput::default());
        let errors = contrail_events::validate_record(&value, &contrail_events::Limits::default(), 0)
            .expect_err("empty");
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["event_id", "source", "type", "event_time", "flight"]);
    }
}
