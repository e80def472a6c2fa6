//! The `ingest` stage: the front door of contrail.
//!
//! Source systems push operational events over HTTP (`POST /v1/events`) or gRPC
//! (`contrail.ingest.v1.IngestService`), or ingest pulls them from configured sources in parallel.
//! Every record is validated against the contract (docs/CONTRACT.md, "Events"); valid ones are
//! produced as `OperationalEvent` protobuf to `ops.events.raw` keyed by flight key (idempotent
//! producer, `acks=all`), rejected ones as `DeadLetter` to `ops.events.dlq`. A request is
//! acknowledged only after the broker acknowledged every record of it; memory is bounded by an
//! in-flight limit.

pub mod cli;
pub mod config;
pub mod delivery;
pub mod error;
pub mod grpc_api;
pub mod http_api;
pub mod metrics;
pub mod pipeline;
pub mod sources;

use std::sync::Arc;
use std::time::Duration;

use contrail_common::server;
use contrail_common::shutdown::Shutdown;
use contrail_common::stage::StageContext;
use contrail_common::topology;
use rdkafka::ClientConfig;
use rdkafka::producer::Producer;
use tokio::sync::Semaphore;

pub use config::IngestConfig;
pub use error::IngestError;

use crate::pipeline::{Pipeline, PipelineLimits, PipelineTopics};
#[cfg(feature = "replay")]
use crate::sources::ReplaySource;
use crate::sources::{Backoff, CursorStore, HttpPollSource, Source, SourceRegistry, SourceRunner};

/// The producer settings ingest relies on: idempotence (no duplicates or reordering from retries),
/// `acks=all`, and a bounded delivery timeout.
pub fn producer_config(config: &IngestConfig) -> Result<ClientConfig, IngestError> {
    let mut client = config.kafka.client_config("ingest")?;
    client
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set(
            "message.timeout.ms",
            config.limits.delivery_timeout_ms.to_string(),
        );
    // Operator overrides win over our defaults (but not over the Event Hubs limits, checked above).
    for (key, value) in &config.kafka.properties {
        client.set(key, value);
    }
    Ok(client)
}

/// Creates the raw and dead-letter topics if they are missing (`topics.create`).
pub async fn ensure_topics(config: &IngestConfig) -> Result<(), IngestError> {
    let topics = [config.topics.raw.as_str(), config.topics.dlq.as_str()];
    contrail_common::kafka::create_topics(&config.kafka, "ingest", &topics, config.topics.partitions)
        .await
        .map_err(|error| IngestError::BrokerUnavailable(error.to_string()))
}

fn build_sources(config: &IngestConfig) -> Result<Vec<Arc<dyn Source>>, IngestError> {
    config
        .sources
        .iter()
        .map(|source| -> Result<Arc<dyn Source>, IngestError> {
            Ok(match source {
                config::SourceConfig::HttpPoll(poll) => Arc::new(HttpPollSource::new(poll.clone())?),
                #[cfg(feature = "replay")]
                config::SourceConfig::Replay(replay) => Arc::new(ReplaySource::new(replay.clone())),
                // `validate` refuses a replay source in a build without it.
                #[cfg(not(feature = "replay"))]
                config::SourceConfig::Replay(replay) => {
                    return Err(
                        contrail_common::CommonError::Config(config::replay_not_built(&replay.name)).into(),
                    );
                }
            })
        })
        .collect()
}

/// Runs the stage until `shutdown` fires, then drains: stops accepting, lets in-flight requests and
/// pages finish, flushes the producer.
pub async fn run(config: IngestConfig, shutdown: Shutdown) -> Result<(), IngestError> {
    let stage = StageContext::start(topology::INGEST, config.validate(), shutdown)?;
    let metrics = metrics::IngestMetrics::new(&stage.registry);
    let tokens = stage.tokens(&config.auth, "auth", "the ingest API", &config.listen)?;
    let admin_tokens = stage.tokens(&config.admin_auth, "admin_auth", "the admin API", &config.listen)?;
    if tokens.shares_a_token_with(&admin_tokens) {
        return Err(contrail_common::CommonError::Config(
            "auth and admin_auth share a token: a data producer could pause or drain ingest; give \
             the operators (admin_auth) their own tokens"
                .to_owned(),
        )
        .into());
    }
    let (registry, health, shutdown) = (
        stage.registry.clone(),
        stage.health.clone(),
        stage.shutdown.clone(),
    );

    if config.topics.create {
        ensure_topics(&config).await?;
    }
    let producer: delivery::IngestProducer = producer_config(&config)?
        .create_with_context(delivery::Tracking)
        .map_err(|error| IngestError::BrokerUnavailable(format!("producer: {error}")))?;
    let pipeline = Pipeline::new(
        Arc::new(producer),
        PipelineTopics {
            raw: config.topics.raw.clone(),
            dlq: config.topics.dlq.clone(),
        },
        PipelineLimits {
            max_in_flight: config.limits.max_in_flight_records,
            max_in_flight_bytes: config.limits.max_in_flight_bytes,
            produce_timeout: Duration::from_millis(config.limits.produce_timeout_ms),
            max_record_bytes: config.limits.max_record_bytes,
            max_message_bytes: config.kafka.max_message_bytes(),
            max_clock_skew_us: config.limits.max_clock_skew_secs.saturating_mul(1_000_000),
        },
        metrics.clone(),
    );

    let http_listener = server::bind(&config.listen.http, "HTTP").await?;
    let grpc_listener = server::bind(&config.listen.grpc, "gRPC").await?;

    let source_registry = Arc::new(SourceRegistry::default());
    let http_routes = http_api::routes(http_api::HttpApiState {
        pipeline: pipeline.clone(),
        tokens: tokens.clone(),
        max_body_bytes: config.limits.max_body_bytes,
        max_records_per_request: config.limits.max_records_per_request,
    });
    let ingest_service = tonic::service::interceptor::InterceptedService::new(
        contrail_proto::ingest::v1::ingest_service_server::IngestServiceServer::new(
            grpc_api::IngestGrpc::new(pipeline.clone(), config.limits.max_records_per_request),
        )
        .max_decoding_message_size(config.limits.max_body_bytes),
        tokens.grpc_interceptor(),
    );
    let controls = stage.controls.clone().with_pause_flag(pipeline.pause_flag());
    let admin_service = contrail_common::admin::AdminApi::new(
        grpc_api::IngestAdmin::new(
            pipeline.clone(),
            source_registry.clone(),
            controls.clone(),
            config.instance.clone(),
            metrics.clone(),
        ),
        controls,
    )
    .service(&admin_tokens, None);
    let grpc_routes = tonic::service::Routes::new(ingest_service).add_service(admin_service);

    shutdown.spawn(log_failure(
        "http server",
        server::serve_http(
            http_listener,
            http_routes,
            health.clone(),
            registry.clone(),
            shutdown.clone(),
        ),
        shutdown.clone(),
    ));
    let grpc_shutdown = shutdown.clone();
    shutdown.spawn(log_failure(
        "grpc server",
        async move {
            server::serve_grpc(
                grpc_listener,
                grpc_routes,
                &[
                    "contrail.ingest.v1.IngestService",
                    "contrail.admin.v1.AdminService",
                ],
                grpc_shutdown,
            )
            .await
        },
        shutdown.clone(),
    ));

    // Readiness follows broker reachability: a metadata round trip every few seconds.
    {
        let pipeline = pipeline.clone();
        let health = health.clone();
        let topic = config.topics.raw.clone();
        let stop = shutdown.clone();
        shutdown.spawn(async move {
            loop {
                let producer = pipeline.producer().clone();
                let probe_topic = topic.clone();
                let reachable = tokio::task::spawn_blocking(move || {
                    producer
                        .client()
                        .fetch_metadata(Some(&probe_topic), Duration::from_secs(3))
                        .is_ok()
                })
                .await
                .unwrap_or(false);
                health.set_ready(reachable && !stop.is_triggered());
                tokio::select! {
                    _ = stop.triggered() => break,
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                }
            }
            health.set_ready(false);
        });
    }

    // Pull sources.
    let runner = Arc::new(SourceRunner {
        sink: Arc::new(pipeline.clone()),
        cursors: CursorStore::new(config.cursor_dir.clone()),
        fetch_slots: Arc::new(Semaphore::new(config.source_concurrency)),
        backoff: Backoff::default(),
        registry: source_registry,
        metrics: Some(metrics.clone()),
    });
    for source in build_sources(&config)? {
        let runner = runner.clone();
        let stop = shutdown.token().clone();
        shutdown.spawn(async move {
            let name = source.name().to_owned();
            if let Err(error) = runner.run_source(source, stop).await {
                tracing::error!(source = %name, %error, "source stopped");
            }
        });
    }

    tracing::info!(instance = %config.instance, raw = %config.topics.raw, dlq = %config.topics.dlq, "ingest running");
    shutdown.triggered().await;
    tracing::info!("draining: no new requests; waiting for in-flight work");
    health.set_ready(false);
    let drained = shutdown.wait_for_tasks(Duration::from_secs(30)).await;
    let producer = pipeline.producer().clone();
    let flushed = tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(10)))
        .await
        .map(|result| result.is_ok())
        .unwrap_or(false);
    tracing::info!(drained, flushed, "ingest stopped");
    Ok(())
}

/// Runs a server future; if it fails, logs why and shuts the process down (a stage without its
/// API is useless and should be restarted by its supervisor).
async fn log_failure<F>(what: &'static str, server: F, shutdown: Shutdown)
where
    F: std::future::Future<Output = Result<(), contrail_common::CommonError>>,
{
    if let Err(error) = server.await {
        tracing::error!(%error, "{what} failed");
        shutdown.trigger();
    }
}
