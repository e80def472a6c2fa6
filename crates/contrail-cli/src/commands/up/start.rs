//! Starting `contrail up`'s platform (the processes themselves are `crate::local`'s), with its
//! phases on the board.

use std::path::Path;

use anyhow::Result;
use tokio::sync::RwLock;

use super::UpArgs;
use crate::commands::board::{BoardMeta, set_phase};
use crate::local::{
    Platform, PlatformOptions, Ports, Scale, create_stores, start_broker, start_cosmos, start_stages,
};

/// Starts the platform, phase by phase on the board.
pub(super) async fn start_platform(
    args: &UpArgs,
    scale: &Scale,
    ports: Ports,
    workdir: &Path,
    ingest_token: &str,
    meta: &RwLock<BoardMeta>,
) -> Result<Platform> {
    let options = PlatformOptions {
        durable_broker: args.durable_broker,
        partitions: args.partitions,
        ingest_token: ingest_token.to_owned(),
        stage_env: otlp_env(args),
    };
    set_phase(meta, "starting: the local broker").await;
    let broker = start_broker(&options, ports, workdir).await?;
    set_phase(meta, "starting: the local Cosmos DB endpoint").await;
    let cosmos = start_cosmos(ports, workdir).await?;
    set_phase(meta, "starting: topics, containers and the stages").await;
    create_stores(&options, ports).await?;
    let (stages, replicas) = start_stages(&options, scale, ports, workdir).await?;
    Ok(Platform {
        broker,
        cosmos,
        stages,
        replicas,
        stopping: false,
        broker_restarts: 0,
        volume_losses: 0,
        cosmos_freezes: 0,
    })
}

/// The `[cosmos]` settings of a tool reading the local endpoint.
pub(super) fn cosmos_config(ports: Ports, create: bool) -> contrail_cosmos::CosmosConfig {
    crate::local::cosmos_config(&ports.cosmos_endpoint(), None, create)
}

/// The OpenTelemetry settings of every stage under `--otlp-endpoint` (none without it).
fn otlp_env(args: &UpArgs) -> Vec<(String, String)> {
    let Some(endpoint) = &args.otlp_endpoint else {
        return Vec::new();
    };
    [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio".to_owned()),
        ("OTEL_TRACES_SAMPLER_ARG", args.trace_ratio.to_string()),
        // Spans leave every second, not every five (the SDK's default).
        ("OTEL_BSP_SCHEDULE_DELAY", "1000".to_owned()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value))
    .collect()
}
