//! W3C trace context across stages (<https://www.w3.org/TR/trace-context/>).
//!
//! A record carries its trace in the Kafka header [`TRACEPARENT`], exactly as an HTTP request does.
//! ingest starts the trace from the request's `traceparent` (or a new root span); every stage
//! continues it for the records it emits. A stage makes a span for a record only when the record's
//! context says *sampled* — so tracing costs nothing for the records nobody traces — and when spans
//! are not exported (no OTLP endpoint, or the span filtered out) it forwards the record's context
//! unchanged, so a trace stays one trace across a stage that does not export.
//!
//! [`TraceParent`] is the header's value as plain data: parsing is pure and never panics (tested
//! on arbitrary bytes), so dedup-state can keep it with an output in its outbox and re-send the
//! output after a restart with the context it was first emitted with.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header (HTTP, gRPC metadata, Kafka record) that carries the trace context.
pub const TRACEPARENT: &str = "traceparent";

/// The length of a version-00 `traceparent` value: `00-{32 hex}-{16 hex}-{2 hex}`.
pub const TRACEPARENT_LEN: usize = 55;

/// A `traceparent` value: which trace, which span is the parent, and whether it is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// The trace (never all zeros).
    pub trace_id: [u8; 16],
    /// The parent span (never all zeros).
    pub span_id: [u8; 8],
    /// Trace flags; bit 0 is *sampled*.
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` value; `None` when it is not one (W3C §3.2: lowercase hex, version
    /// `ff` invalid, all-zero ids invalid; a future version's value is read by its first four
    /// fields when the fifth is separated by `-`).
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        let value = value.trim_ascii();
        if value.len() < TRACEPARENT_LEN {
            return None;
        }
        let version = hex_byte(value.get(0..2)?)?;
        if version == 0xff || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        match (version, value.len()) {
            (0, TRACEPARENT_LEN) => {}
            (0, _) => return None,
            (_, TRACEPARENT_LEN) => {}
            (_, _) if value[TRACEPARENT_LEN] == b'-' => {}
            _ => return None,
        }
        let mut trace_id = [0u8; 16];
        for (index, byte) in trace_id.iter_mut().enumerate() {
            *byte = hex_byte(&value[3 + 2 * index..5 + 2 * index])?;
        }
        let mut span_id = [0u8; 8];
        for (index, byte) in span_id.iter_mut().enumerate() {
            *byte = hex_byte(&value[36 + 2 * index..38 + 2 * index])?;
        }
        let flags = hex_byte(&value[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The version-00 header value.
    pub fn header(&self) -> String {
        let mut text = String::with_capacity(TRACEPARENT_LEN);
        text.push_str("00-");
        push_hex(&mut text, &self.trace_id);
        text.push('-');
        push_hex(&mut text, &self.span_id);
        text.push('-');
        push_hex(&mut text, &[self.flags]);
        text
    }

    /// The trace id as 32 lowercase hex digits (as trace viewers show it).
    pub fn trace_id_hex(&self) -> String {
        let mut text = String::with_capacity(32);
        push_hex(&mut text, &self.trace_id);
        text
    }

    /// Whether the trace is sampled: stages make spans for sampled records only.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// This context with the *sampled* flag set to `sampled` (the other flags kept): ingest
    /// replaces a caller's decision with contrail's own ([`Sampler`]).
    pub fn with_sampled(self, sampled: bool) -> TraceParent {
        TraceParent {
            flags: (self.flags & !1) | u8::from(sampled),
            ..self
        }
    }

    /// The OpenTelemetry span context (remote) of this parent.
    pub fn span_context(&self) -> SpanContext {
        SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.span_id),
            TraceFlags::new(self.flags),
            true,
            TraceState::default(),
        )
    }

    /// The context of `span` when it is exported (an OTLP endpoint is set and the span enabled).
    pub fn of_span(span: &tracing::Span) -> Option<TraceParent> {
        let context = span.context();
        let span_context = context.span().span_context().clone();
        if !span_context.is_valid() {
            return None;
        }
        Some(TraceParent {
            trace_id: span_context.trace_id().to_bytes(),
            span_id: span_context.span_id().to_bytes(),
            flags: span_context.trace_flags().to_u8(),
        })
    }

    /// Makes `span` (not yet entered) a child of this context.
    pub fn adopt(&self, span: &tracing::Span) {
        let context = opentelemetry::Context::new().with_remote_span_context(self.span_context());
        // Only fails when spans are not exported (no OpenTelemetry layer) or the span is disabled:
        // then there is nothing to parent.
        let _ = span.set_parent(context);
    }

    /// Links `span` (not yet entered) to this context: a batch span to the records it processed.
    pub fn link_from(&self, span: &tracing::Span) {
        span.add_link(self.span_context());
    }

    /// The context of a Kafka record, if it carries a valid one.
    pub fn of_record<H: Headers>(headers: Option<&H>) -> Option<TraceParent> {
        let headers = headers?;
        (0..headers.count())
            .filter_map(|index| headers.try_get(index))
            .find(|header| header.key.eq_ignore_ascii_case(TRACEPARENT))
            .and_then(|header| header.value)
            .and_then(TraceParent::parse)
    }

    /// Kafka record headers carrying this context.
    pub fn record_headers(&self) -> OwnedHeaders {
        traceparent_headers(self.header().as_bytes())
    }
}

/// Kafka record headers carrying the `traceparent` value `value` as it is: a value printed once
/// ([`TraceParent::header`]) for many records, or one kept as bytes (dedup-state's outbox).
pub fn traceparent_headers(value: &[u8]) -> OwnedHeaders {
    OwnedHeaders::new_with_capacity(1).insert(Header {
        key: TRACEPARENT,
        value: Some(value),
    })
}

/// contrail's sampling decision for a trace a caller started: whether its records get spans in
/// every stage is contrail's to decide, not the caller's — a producer that flags every request
/// sampled must not make every stage build spans. Nothing is sampled while spans are not
/// exported; when they are, a share `ratio` of the traces, chosen by trace id (the same trace gets
/// the same answer everywhere, as OpenTelemetry's trace-id-ratio sampler does).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// Whether spans are exported at all (an OTLP endpoint is set).
    pub exporting: bool,
    /// Share of traces sampled when exporting, 0.0–1.0.
    pub ratio: f64,
}

impl Sampler {
    /// The sampler of this process: exporting when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, sampling
    /// as the standard `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` say
    /// ([`Sampler::from_settings`]), so callers' traces are sampled like contrail's own. A value
    /// it cannot use is logged, naming it, and the default (every trace) applies, as
    /// OpenTelemetry's SDKs do.
    pub fn from_env() -> Sampler {
        let exporting = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").is_ok_and(|value| !value.is_empty());
        let sampler = std::env::var("OTEL_TRACES_SAMPLER").ok();
        let arg = std::env::var("OTEL_TRACES_SAMPLER_ARG").ok();
        Sampler::from_settings(exporting, sampler.as_deref(), arg.as_deref()).unwrap_or_else(|message| {
            tracing::warn!(%message, "trace sampling settings not usable; sampling every trace");
            Sampler {
                exporting,
                ratio: 1.0,
            }
        })
    }

    /// The sampler the standard settings describe: `always_on` and `parentbased_always_on` (the
    /// default) sample every trace, `always_off` and `parentbased_always_off` none,
    /// `traceidratio` and `parentbased_traceidratio` the share `arg` (0.0–1.0; 1.0 when unset).
    /// The `parentbased_` ones sample as their root sampler: contrail decides for a caller's
    /// trace too (a caller's sampled flag is not followed). `Err` names a value it cannot use.
    pub fn from_settings(
        exporting: bool,
        sampler: Option<&str>,
        arg: Option<&str>,
    ) -> Result<Sampler, String> {
        let name = sampler.map(str::trim).filter(|name| !name.is_empty());
        let ratio = match name.unwrap_or("parentbased_always_on") {
            "always_on" | "parentbased_always_on" => 1.0,
            "always_off" | "parentbased_always_off" => 0.0,
            "traceidratio" | "parentbased_traceidratio" => match arg.map(str::trim) {
                None | Some("") => 1.0,
                Some(text) => match text.parse::<f64>() {
                    Ok(ratio) if (0.0..=1.0).contains(&ratio) => ratio,
                    _ => {
                        return Err(format!(
                            "OTEL_TRACES_SAMPLER_ARG = {text:?}: must be a number from 0.0 to 1.0"
                        ));
                    }
                },
            },
            other => {
                return Err(format!(
                    "OTEL_TRACES_SAMPLER = {other:?}: contrail knows always_on, always_off, \
                     traceidratio and their parentbased_ forms"
                ));
            }
        };
        Ok(Sampler { exporting, ratio })
    }

    /// Whether the trace `trace_id` is sampled.
    pub fn samples(&self, trace_id: &[u8; 16]) -> bool {
        if !self.exporting || self.ratio <= 0.0 {
            return false;
        }
        let mut low = [0u8; 8];
        low.copy_from_slice(&trace_id[8..]);
        let point = u64::from_be_bytes(low) >> 1;
        point as f64 <= (u64::MAX >> 1) as f64 * self.ratio
    }

    /// `parent` with contrail's decision in place of the caller's.
    pub fn decide(&self, parent: TraceParent) -> TraceParent {
        parent.with_sampled(self.samples(&parent.trace_id))
    }
}

/// The context a record's outputs carry: that of `span` (the stage's span for the record, a child
/// of `parent`) when it is exported, else `parent` unchanged — a stage that exports nothing keeps
/// the trace whole.
pub fn continued(parent: Option<TraceParent>, span: &tracing::Span) -> Option<TraceParent> {
    TraceParent::of_span(span).or(parent)
}

fn hex_byte(pair: &[u8]) -> Option<u8> {
    fn digit(byte: u8) -> Option<u8> {
        match byte {
            b'0'..=b'9' => Some(byte - b'0'),
            b'a'..=b'f' => Some(byte - b'a' + 10),
            _ => None,
        }
    }
    match pair {
        [high, low] => Some(digit(*high)? << 4 | digit(*low)?),
        _ => None,
    }
}

fn push_hex(text: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        text.push(DIGITS[usize::from(byte >> 4)] as char);
        text.push(DIGITS[usize::from(byte & 0x0f)] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn contrail_decides_sampling_not_the_caller() {
        let flagged =
            TraceParent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").expect("valid");
        assert!(flagged.sampled(), "the caller says sampled");
        let silent = Sampler {
            exporting: false,
            ratio: 1.0,
        };
        assert!(
            !silent.decide(flagged).sampled(),
            "nothing exported: no spans anywhere"
        );
        let none = Sampler {
            exporting: true,
            ratio: 0.0,
        };
        assert!(!none.decide(flagged).sampled());
        let all = Sampler {
            exporting: true,
            ratio: 1.0,
        };
        let unflagged = flagged.with_sampled(false);
        assert!(all.decide(unflagged).sampled());
        assert_eq!(
            all.decide(unflagged).trace_id,
            flagged.trace_id,
            "the trace is kept"
        );
        // 10 %: about a tenth of 10,000 trace ids (counted by hand, not by the sampler's formula).
        let tenth = Sampler {
            exporting: true,
            ratio: 0.1,
        };
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let sampled = (0..10_000)
            .filter(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let mut trace_id = [1u8; 16];
                trace_id[8..].copy_from_slice(&state.to_be_bytes());
                tenth.samples(&trace_id)
            })
            .count();
        assert!((800..1_200).contains(&sampled), "{sampled} of 10,000");
    }

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_w3c_example_parses_and_prints_back() {
        let parent = TraceParent::parse(EXAMPLE.as_bytes()).expect("valid");
        assert_eq!(parent.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parent.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert!(parent.sampled());
        assert_eq!(parent.header(), EXAMPLE);
        assert_eq!(
            TraceParent::parse(format!("  {EXAMPLE}\r\n").as_bytes()),
            Some(parent),
            "surrounding whitespace is not part of the value"
        );
    }

    #[test]
    fn invalid_values_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad:?}");
        }
        let future = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        assert!(
            TraceParent::parse(future.as_bytes()).is_some(),
            "a future version is read by its known fields"
        );
    }

    #[test]
    fn a_record_header_round_trips_and_other_headers_are_ignored() {
        let parent = TraceParent::parse(EXAMPLE.as_bytes()).expect("valid");
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "other",
                value: Some(b"x".as_slice()),
            })
            .insert(Header {
                key: "TraceParent",
                value: Some(parent.header().as_bytes()),
            });
        assert_eq!(TraceParent::of_record(Some(&headers)), Some(parent));
        assert_eq!(
            TraceParent::of_record(Some(&parent.record_headers())),
            Some(parent)
        );
        assert_eq!(TraceParent::of_record::<OwnedHeaders>(None), None);
        let broken = OwnedHeaders::new().insert(Header {
            key: TRACEPARENT,
            value: Some(b"garbage".as_slice()),
        });
        assert_eq!(TraceParent::of_record(Some(&broken)), None);
    }

    #[test]
    fn without_an_exporter_a_stage_forwards_the_context_it_received() {
        let parent = TraceParent::parse(EXAMPLE.as_bytes()).expect("valid");
        let span = tracing::info_span!("no subscriber");
        parent.adopt(&span);
        assert_eq!(continued(Some(parent), &span), Some(parent));
        assert_eq!(continued(None, &span), None);
    }

    proptest! {
        /// Any bytes: no panic; whatever parses prints back to a value that parses the same.
        #[test]
        fn parsing_never_panics_and_round_trips(bytes in prop::collection::vec(any::<u8>(), 0..80)) {
            if let Some(parent) = TraceParent::parse(&bytes) {
                prop_assert_eq!(TraceParent::parse(parent.header().as_bytes()), Some(parent));
            }
        }

        /// Every valid context survives header → parse unchanged.
        #[test]
        fn valid_contexts_round_trip(
            trace_id in any::<[u8; 16]>().prop_filter("non-zero", |id| *id != [0; 16]),
            span_id in any::<[u8; 8]>().prop_filter("non-zero", |id| *id != [0; 8]),
            flags in any::<u8>(),
        ) {
            let parent = TraceParent { trace_id, span_id, flags };
            let header = parent.header();
            prop_assert_eq!(header.len(), TRACEPARENT_LEN);
            prop_assert_eq!(TraceParent::parse(header.as_bytes()), Some(parent));
        }
    }

    #[test]
    fn the_standard_sampler_settings_are_honoured_and_bad_ones_named() {
        let ratio = |sampler: Option<&str>, arg: Option<&str>| {
            Sampler::from_settings(true, sampler, arg).map(|sampler| sampler.ratio)
        };
        assert_eq!(ratio(None, None), Ok(1.0), "default: parentbased_always_on");
        assert_eq!(
            ratio(None, Some("0.25")),
            Ok(1.0),
            "an argument alone changes nothing"
        );
        assert_eq!(ratio(Some("always_on"), None), Ok(1.0));
        assert_eq!(ratio(Some("always_off"), Some("0.5")), Ok(0.0));
        assert_eq!(ratio(Some("parentbased_always_off"), None), Ok(0.0));
        assert_eq!(ratio(Some("traceidratio"), Some("0.25")), Ok(0.25));
        assert_eq!(ratio(Some("parentbased_traceidratio"), Some(" 0.01 ")), Ok(0.01));
        assert_eq!(ratio(Some("parentbased_traceidratio"), None), Ok(1.0));
        let bad_arg = ratio(Some("traceidratio"), Some("1.5")).expect_err("out of range");
        assert!(bad_arg.contains("OTEL_TRACES_SAMPLER_ARG = \"1.5\""), "{bad_arg}");
        let bad_name = ratio(Some("jaeger_remote"), None).expect_err("unknown");
        assert!(
            bad_name.contains("OTEL_TRACES_SAMPLER = \"jaeger_remote\""),
            "{bad_name}"
        );
        let off = Sampler::from_settings(true, Some("always_off"), None).expect("valid");
        assert!(
            !off.samples(&[0xff; 16]) && !off.samples(&[0; 16]),
            "always_off samples nothing"
        );
    }
}
