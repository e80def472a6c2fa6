//! An OTLP/gRPC trace receiver on loopback: what a collector would receive from the stages, kept
//! for the test to read (the OpenTelemetry protocol's own messages and service, from
//! `opentelemetry-proto`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use tonic::codec::CompressionEncoding;

/// One received span, ids as lowercase hex (empty: none).
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// The exporting process's `service.name`.
    pub service: String,
    /// The span's name.
    pub name: String,
    /// Its trace.
    pub trace_id: String,
    /// Its id.
    pub span_id: String,
    /// Its parent's id (empty for a root span).
    pub parent_span_id: String,
    /// Its attributes, as JSON values.
    pub attributes: BTreeMap<String, serde_json::Value>,
    /// The `(trace id, span id)` of every span it links to.
    pub links: Vec<(String, String)>,
}

impl ReceivedSpan {
    /// Attribute `key` as text (strings as they are, numbers printed).
    pub fn attribute(&self, key: &str) -> Option<String> {
        self.attributes.get(key).map(|value| match value {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        })
    }
}

/// The receiver: started on a free loopback port, stopped when dropped.
pub struct OtlpReceiver {
    endpoint: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    server: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    /// Starts it on the current Tokio runtime.
    pub async fn start() -> Result<OtlpReceiver> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the OTLP receiver")?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let spans = Arc::new(Mutex::new(Vec::new()));
        let service = TraceServiceServer::new(Collector {
            spans: Arc::clone(&spans),
        })
        .accept_compressed(CompressionEncoding::Gzip);
        let server = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            if let Err(error) = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await
            {
                eprintln!("OTLP receiver stopped: {error}");
            }
        });
        Ok(OtlpReceiver {
            endpoint,
            spans,
            server,
        })
    }

    /// Its URL, for `OTEL_EXPORTER_OTLP_ENDPOINT` or `contrail up --otlp-endpoint`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().map(|spans| spans.clone()).unwrap_or_default()
    }

    /// The spans of trace `trace_id` (hex) received so far.
    pub fn trace(&self, trace_id: &str) -> Vec<ReceivedSpan> {
        self.spans()
            .into_iter()
            .filter(|span| span.trace_id == trace_id)
            .collect()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

struct Collector {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|resource| {
                    resource
                        .attributes
                        .iter()
                        .find(|attribute| attribute.key == "service.name")
                })
                .and_then(|attribute| attribute.value.as_ref())
                .map(json_of)
                .and_then(|value| value.as_str().map(str::to_owned))
                .unwrap_or_default();
            for span in resource_spans
                .scope_spans
                .into_iter()
                .flat_map(|scope| scope.spans)
            {
                received.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: attributes(&span.attributes),
                    links: span
                        .links
                        .iter()
                        .map(|link| (hex(&link.trace_id), hex(&link.span_id)))
                        .collect(),
                });
            }
        }
        if let Ok(mut spans) = self.spans.lock() {
            spans.extend(received);
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn attributes(attributes: &[KeyValue]) -> BTreeMap<String, serde_json::Value> {
    attributes
        .iter()
        .filter_map(|attribute| {
            attribute
                .value
                .as_ref()
                .map(|value| (attribute.key.clone(), json_of(value)))
        })
        .collect()
}

fn json_of(value: &AnyValue) -> serde_json::Value {
    match &value.value {
        Some(any_value::Value::StringValue(text)) => serde_json::Value::from(text.as_str()),
        Some(any_value::Value::BoolValue(flag)) => serde_json::Value::from(*flag),
        Some(any_value::Value::IntValue(number)) => serde_json::Value::from(*number),
        Some(any_value::Value::DoubleValue(number)) => serde_json::Value::from(*number),
        Some(any_value::Value::ArrayValue(array)) => array.values.iter().map(json_of).collect(),
        Some(any_value::Value::BytesValue(bytes)) => serde_json::Value::from(hex(bytes)),
        _ => serde_json::Value::Null,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
