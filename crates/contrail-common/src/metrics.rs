//! Prometheus metrics: one registry per process, rendered in the text exposition format.
//!
//! Each stage declares its metrics in one `metrics` module of its own crate, built with the
//! constructors below (each creates and registers one metric); names are stable, prefixed
//! `contrail_` and carry their unit (`_total`, `_seconds`, `_bytes`).

use prometheus::{
    Counter, Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

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

    /// A counter of events (`…_total`).
    pub fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.registered(IntCounter::new(name, help))
    }

    /// A counter of a fractional quantity (e.g. request units).
    pub fn float_counter(&self, name: &str, help: &str) -> Counter {
        self.registered(Counter::new(name, help))
    }

    /// A counter per value of `labels`.
    pub fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.registered(IntCounterVec::new(Opts::new(name, help), labels))
    }

    /// A gauge.
    pub fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.registered(IntGauge::new(name, help))
    }

    /// A gauge per value of `labels`.
    pub fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.registered(IntGaugeVec::new(Opts::new(name, help), labels))
    }

    /// A fractional gauge per value of `labels`.
    pub fn float_gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        self.registered(GaugeVec::new(Opts::new(name, help), labels))
    }

    /// A histogram with the given bucket bounds.
    pub fn histogram(&self, name: &str, help: &str, buckets: &[f64]) -> Histogram {
        self.registered(Histogram::with_opts(
            HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        ))
    }

    /// A histogram per value of `labels`.
    pub fn histogram_vec(&self, name: &str, help: &str, buckets: &[f64], labels: &[&str]) -> HistogramVec {
        self.registered(HistogramVec::new(
            HistogramOpts::new(name, help).buckets(buckets.to_vec()),
            labels,
        ))
    }

    /// Registers a metric just built. Its definition is static (a name and help the stage writes
    /// in its metrics module), so an invalid one is a programming error caught by every test that
    /// starts the stage.
    fn registered<C>(&self, metric: prometheus::Result<C>) -> C
    where
        C: prometheus::core::Collector + Clone + 'static,
    {
        #[allow(clippy::expect_used)]
        let metric = metric.expect("a static metric definition is valid");
        self.register(&metric);
        metric
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructed_metrics_are_registered_and_rendered() {
        let registry = MetricsRegistry::new();
        let records = registry.counter("contrail_test_records_total", "Records");
        let by_table = registry.counter_vec("contrail_test_rows_total", "Rows", &["table"]);
        let latency = registry.histogram("contrail_test_seconds", "Latency", &[0.1, 1.0]);
        records.inc_by(3);
        by_table.with_label_values(&["events"]).inc();
        latency.observe(0.5);
        let text = registry.render();
        assert!(text.contains("contrail_test_records_total 3"), "{text}");
        assert!(
            text.contains("contrail_test_rows_total{table=\"events\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("contrail_test_seconds_bucket{le=\"1\"} 1"),
            "{text}"
        );
        // A second metric of the same name is refused by the registry, logged, and not fatal.
        let again = registry.counter("contrail_test_records_total", "Records");
        again.inc();
        assert!(registry.render().contains("contrail_test_records_total 3"));
    }
}
