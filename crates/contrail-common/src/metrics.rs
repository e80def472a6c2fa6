//! Prometheus metrics: one registry per process, rendered in the text exposition format.
//!
//! Each stage declares its metrics in one `metrics` module of its own crate and registers them here;
//! names are stable, prefixed `contrail_` and carry their unit (`_total`, `_seconds`, `_bytes`).

use prometheus::{Encoder, Registry, TextEncoder};

/// The registry of a process, cheap to clone.
#[derive(Clone, Default)]
pub struct MetricsRegistry {
    registry: Registry,
}

impl MetricsRegistry {
    /// A new, empty registry.
    pub fn new() -> MetricsRegistry {
        MetricsRegistry::default()
    }

    /// The underlying registry, to register collectors.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Registers a collector. A duplicate name is a programming error in the stage's metrics module:
    /// it is logged, not fatal, so metrics can never take a stage down.
    pub fn register<C: prometheus::core::Collector + Clone + 'static>(&self, collector: &C) {
        if let Err(error) = self.registry.register(Box::new(collector.clone())) {
            tracing::error!(%error, "metric registration failed");
        }
    }

    /// Everything in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(error) = encoder.encode(&self.registry.gather(), &mut buffer) {
            return format!("# encoding failed: {error}\n");
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}
