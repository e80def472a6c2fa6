//! Tracing setup: structured logs to stderr (text or JSON), filtered by `RUST_LOG` or the config,
//! and OpenTelemetry OTLP export of spans when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.

use opentelemetry::trace::TracerProvider as _;
use serde::{Deserialize, Serialize};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::CommonError;

/// Log output settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// `text` (human) or `json` (one object per line, for log pipelines).
    pub log_format: LogFormat,
    /// `tracing` filter directives; `RUST_LOG` overrides.
    pub log_filter: String,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable.
    #[default]
    Text,
    /// JSON lines.
    Json,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            log_format: LogFormat::Text,
            log_filter: "info,rdkafka=warn,h2=warn,tower=warn,hyper=warn".to_owned(),
        }
    }
}

/// Keeps the OTLP exporter alive; flushes spans on drop.
#[must_use = "dropping the guard stops span export"]
pub struct TelemetryGuard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Log targets kept at WARN unless the filter names them.
const QUIET_LIBRARIES: [&str; 4] = ["deltalake_core", "delta_kernel", "buoyant_kernel", "object_store"];

/// Installs the global subscriber for `service_name`. Call once, inside the Tokio runtime.
pub fn init(service_name: &str, config: &TelemetryConfig) -> Result<TelemetryGuard, CommonError> {
    let directives = std::env::var("RUST_LOG")
        .ok()
        .filter(|value| !value.trim().is_empty())
        .unwrap_or_else(|| config.log_filter.clone());
    let mut filter = EnvFilter::try_new(&directives)
        .map_err(|error| CommonError::Telemetry(format!("invalid log filter {directives:?}: {error}")))?;
    // Libraries that log every table snapshot and file at INFO: quiet unless asked for by name.
    for noisy in QUIET_LIBRARIES {
        if !directives.contains(noisy)
            && let Ok(directive) = format!("{noisy}=warn").parse()
        {
            filter = filter.add_directive(directive);
        }
    }
    let format_layer = match config.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_target(false)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let otlp_endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .ok()
        .filter(|value| !value.is_empty());
    let mut provider = None;
    let otel_layer = match otlp_endpoint {
        Some(_) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .build()
                .map_err(|error| CommonError::Telemetry(format!("OTLP exporter: {error}")))?;
            let resource = opentelemetry_sdk::Resource::builder()
                .with_service_name(service_name.to_owned())
                .build();
            let tracer_provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource)
                .build();
            let tracer = tracer_provider.tracer(service_name.to_owned());
            provider = Some(tracer_provider);
            Some(tracing_opentelemetry::layer().with_tracer(tracer))
        }
        None => None,
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(format_layer)
        .with(otel_layer)
        .try_init()
        .map_err(|error| CommonError::Telemetry(error.to_string()))?;
    Ok(TelemetryGuard { provider })
}
