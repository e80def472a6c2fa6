//! The `dedup-state` stage: the stateful heart of contrail
//! (docs/CONTRACT.md, "Processing in dedup-state" and "Guarantees across restarts").
//!
//! Consumes `ops.events.raw` as a consumer-group member; each assigned partition is a shard — a
//! RocksDB instance of the `contrail-state` engine — opened at the offset stored in it (reopened,
//! restored from the newest complete checkpoint, or empty). The flight processor dedups by event
//! id, routes late events to `ops.events.late`, orders each flight's accepted events by
//! (event_time, event_id), folds them into a `FlightState` (to `ops.flights.curated`, version =
//! accepted count), forwards accepted events to `ops.events.accepted` and raises
//! DEPARTURE_OVERDUE alerts from event-time timers. State, timers, outputs (an outbox) and the
//! input offset of each micro-batch are one RocksDB write batch; outputs are produced after commit
//! and deleted from the outbox when the broker acknowledges them.
//!
//! Checkpoints are coordinated over gRPC (`contrail.control.v1`): see [`checkpointing`].

pub mod admin;
pub mod checkpointing;
pub mod cli;
pub mod config;
pub mod error;
pub mod in_flight;
pub mod metrics;
pub mod opening;
pub mod processor;
pub mod records;
pub mod rotation;
pub mod shards;
pub mod worker;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use contrail_common::server;
use contrail_common::shutdown::Shutdown;
use contrail_common::stage::StageContext;
use contrail_common::topology;
use contrail_proto::control::v1::checkpoint_control_server::CheckpointControlServer;
use contrail_state::checkpoints::CheckpointStore;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::ThreadedProducer;

pub use config::DedupStateConfig;
pub use error::DedupStateError;

use crate::checkpointing::{ControlServer, Coordinator};
use crate::shards::{OutputContext, Processing, ShardSet};
use crate::worker::{GroupContext, WorkerSettings};
use contrail_common::consume::GapWatch;

/// librdkafka settings of the output producer: idempotent, all replicas, and no delivery timeout
/// (`message.timeout.ms = 0`): an output waits for the broker however long it is away. A timed-out
/// output would have to be re-sent behind newer ones, and downstream de-duplication relies on
/// each topic receiving a partition's outputs in input order (docs/CONTRACT.md,
/// "Exact de-duplication"); the outbox, not a timeout, bounds what is in flight
/// (`batch.max_unacknowledged`).
pub fn producer_config(config: &DedupStateConfig) -> Result<ClientConfig, DedupStateError> {
    let mut client = config.kafka.producer_config("dedup-state")?;
    client.set("message.timeout.ms", "0");
    Ok(client)
}

/// librdkafka settings of the group consumer. Offsets are never auto-committed: the offset of
/// record is the one stored in each shard.
pub fn consumer_config(config: &DedupStateConfig) -> Result<ClientConfig, DedupStateError> {
    Ok(config
        .kafka
        .consumer_config("dedup-state", &config.group, &config.instance)?)
}

/// Runs the stage until `shutdown`.
pub async fn run(config: DedupStateConfig, shutdown: Shutdown) -> Result<(), DedupStateError> {
    let stage = StageContext::start(topology::DEDUP_STATE, config.validate(), shutdown)?;
    let metrics = metrics::DedupMetrics::new(&stage.registry);
    let tokens = stage.tokens(&config.auth, "auth", "the admin and control APIs", &config.listen)?;
    let t = &config.topics;
    let mut names: Vec<&str> = vec![&t.raw, &t.dlq, &t.alerts];
    match config.processor {
        config::ProcessorKind::Flight => names.extend([&t.curated, &t.accepted, &t.late].map(String::as_str)),
        config::ProcessorKind::Rotation => names.push(&t.predictions),
    }
    if !t.by_tail.is_empty() && config.processor == config::ProcessorKind::Flight {
        names.push(&t.by_tail);
    }
    stage
        .create_topics(&config.kafka, t.create, &names, t.partitions)
        .await?;
    let (health, shutdown) = (stage.health.clone(), stage.shutdown.clone());
    let store = CheckpointStore::open(&config.checkpoint_url, &config.checkpoint_options())?;

    let (delivery_sender, delivery_receiver) = std::sync::mpsc::channel();
    let producer: ThreadedProducer<OutputContext> = producer_config(&config)?
        .create_with_context(shards::output_context(delivery_sender))
        .map_err(|error| DedupStateError::Broker(format!("producer: {error}")))?;
    let shards = Arc::new(ShardSet::new(
        config.state_dir.clone(),
        store.clone(),
        tokio::runtime::Handle::current(),
        producer,
        delivery_receiver,
        Processing {
            topics: config.topics.clone(),
            rules: config.rules.rules(),
            processor: config.processor,
            turn: config.rotation.rules(),
            max_message_bytes: config.kafka.max_message_bytes(),
            memory: config.storage.memory(),
            commit: config.batch.commit_policy(),
            sampler: contrail_common::trace::Sampler::from_env(),
        },
        metrics.clone(),
    )?);
    let watermarks: Arc<BaseConsumer> = Arc::new(config.kafka.watermark_client("dedup-state")?);

    let listeners = server::Listeners::bind(&config.listen).await?;
    let grpc_port = listeners
        .grpc
        .local_addr()
        .map(|address| address.port())
        .unwrap_or(0);

    let (command_sender, command_receiver) = std::sync::mpsc::channel();
    let coordinator = if config.checkpoint.coordinator {
        let peers = if config.checkpoint.peers.is_empty() {
            vec![format!("http://127.0.0.1:{grpc_port}")]
        } else {
            config.checkpoint.peers.clone()
        };
        let lookup_client = watermarks.clone();
        let input_topic = config.topics.raw.clone();
        let partitions = Arc::new(move || -> Result<BTreeSet<i32>, String> {
            let metadata = lookup_client
                .fetch_metadata(Some(&input_topic), Duration::from_secs(5))
                .map_err(|error| format!("metadata of {input_topic}: {error}"))?;
            let topic = metadata
                .topics()
                .iter()
                .find(|topic| topic.name() == input_topic)
                .ok_or_else(|| format!("topic {input_topic} not found"))?;
            Ok(topic
                .partitions()
                .iter()
                .map(|partition| partition.id())
                .collect())
        });
        let token = config
            .auth
            .secrets()?
            .first()
            .map(|token| token.expose().to_owned());
        Some(Arc::new(Coordinator::new(
            config.instance.clone(),
            peers,
            token,
            store.clone(),
            Duration::from_millis(config.checkpoint.barrier_timeout_ms),
            config.checkpoint.keep,
            partitions,
            metrics.clone(),
        )))
    } else {
        None
    };

    let paused = stage.controls.pause_flag();
    let admin = admin::DedupAdmin {
        instance: config.instance.clone(),
        input_topic: config.topics.raw.clone(),
        shards: shards.clone(),
        watermarks: watermarks.clone(),
        coordinator: coordinator.clone(),
        store: store.clone(),
        controls: stage.controls.clone(),
        metrics: metrics.clone(),
        rules: config.rules.rules(),
    };
    let control = ControlServer::new(
        config.instance.clone(),
        command_sender,
        store.clone(),
        metrics.clone(),
    );
    let admin = contrail_common::admin::AdminApi::new(admin, stage.controls.clone())
        .service(&tokens, Some(&stage.registry));
    let routes = tonic::service::Routes::new(admin).add_service(CheckpointControlServer::with_interceptor(
        control,
        tokens.grpc_interceptor(),
    ));
    let servers = server::Servers::spawn(
        listeners,
        axum::Router::new(),
        routes,
        &[
            "contrail.admin.v1.AdminService",
            "contrail.control.v1.CheckpointControl",
        ],
        &health,
        stage.registry.clone(),
        &shutdown,
    );

    if let Some(coordinator) = &coordinator
        && config.checkpoint.interval_ms > 0
    {
        shutdown.spawn(coordinator.clone().run(
            Duration::from_millis(config.checkpoint.interval_ms),
            shutdown.token().clone(),
        ));
    }

    // The processing thread: RocksDB and librdkafka calls are blocking, so it is a plain thread.
    let stop = Arc::new(AtomicBool::new(false));
    let consumer: BaseConsumer<GroupContext> = consumer_config(&config)?
        .create_with_context(worker::group_context(
            shards.clone(),
            &config.topics.raw,
            stage.controls.gaps(),
        ))
        .map_err(|error| DedupStateError::Broker(format!("consumer: {error}")))?;
    let settings = WorkerSettings {
        input_topic: config.topics.raw.clone(),
        max_records: config.batch.max_records,
        max_wait: Duration::from_millis(config.batch.max_wait_ms),
        max_unacknowledged: config.batch.max_unacknowledged,
        lateness_us: config.rules.rules().allowed_lateness_us,
        threads: config.batch.processing_threads(),
    };
    let watch = GapWatch::new(
        stage.controls.gaps(),
        config.kafka.client_config("dedup-state-probe")?,
        &config.topics.raw,
    );
    let (done_sender, done) = tokio::sync::oneshot::channel();
    let thread_stop = stop.clone();
    let thread_paused = paused.clone();
    let thread_shards = shards.clone();
    std::thread::Builder::new()
        .name("dedup-worker".to_owned())
        .spawn(move || {
            let result = worker::run(
                &consumer,
                &thread_shards,
                &settings,
                &command_receiver,
                &thread_stop,
                &thread_paused,
                &watch,
            );
            drop(consumer);
            let _ = done_sender.send(result);
        })
        .map_err(|error| DedupStateError::Worker(format!("cannot start: {error}")))?;
    health.set_ready(true);
    tracing::info!(
        instance = %config.instance,
        state_dir = %config.state_dir.display(),
        processing_threads = config.batch.processing_threads(),
        "dedup-state running"
    );

    let mut done = done;
    let finished_first = tokio::select! {
        () = shutdown.triggered() => None,
        result = &mut done => Some(result),
    };
    let worker_result = match finished_first {
        None => {
            tracing::info!("shutdown: finishing the batch in flight");
            health.set_ready(false);
            stop.store(true, Ordering::Relaxed);
            done.await
        }
        Some(result) => {
            shutdown.trigger();
            result
        }
    };
    let result = worker_result.unwrap_or_else(|_| {
        Err(DedupStateError::Worker(
            "the processing thread panicked".to_owned(),
        ))
    });
    servers.join().await;
    // A checkpoint round in flight finishes (its manifest and the garbage collection after it):
    // stopping between the two would leave one complete epoch more than `checkpoint.keep`.
    if !shutdown.wait_for_tasks(Duration::from_secs(30)).await {
        tracing::warn!("a checkpoint round was still running at exit; the next round collects what it left");
    }
    result
}
