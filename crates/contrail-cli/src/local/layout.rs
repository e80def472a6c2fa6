//! Where each process of a local platform listens and what it is told: the ports (defaults plus
//! an offset), the instances of a scaled stage, their shard directories and environment.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use contrail_common::topology::topics;

use super::{MAX_LOCAL_INSTANCES, ROTATION_STAGES, STAGES, StageSpec};

/// The development key of the local Cosmos endpoint (it accepts any well-formed key; this one is
/// public and grants nothing anywhere else).
pub const DEV_COSMOS_KEY: &str = "Y29udHJhaWwtZGV2LWtleQ==";

/// Every port of a local platform: the defaults plus an offset (so two platforms, or a test
/// next to a developer's, can run side by side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// Added to every default port.
    pub offset: u16,
}

impl Ports {
    fn shift(self, port: u16) -> u16 {
        port.saturating_add(self.offset)
    }

    /// The Kafka-protocol broker.
    pub fn broker(self) -> u16 {
        self.shift(9092)
    }

    /// The local Cosmos DB endpoint.
    pub fn cosmos(self) -> u16 {
        self.shift(8900)
    }

    /// The flight board.
    pub fn board(self) -> u16 {
        self.shift(8000)
    }

    /// A stage's HTTP port.
    pub fn http(self, stage: &StageSpec) -> u16 {
        self.shift(stage.http)
    }

    /// A stage's gRPC admin port.
    pub fn grpc(self, stage: &StageSpec) -> u16 {
        self.shift(stage.grpc)
    }

    /// An instance's HTTP port.
    pub fn http_of(self, replica: &Replica) -> u16 {
        self.shift(replica.stage.http_of(replica.index))
    }

    /// An instance's gRPC admin port.
    pub fn grpc_of(self, replica: &Replica) -> u16 {
        self.shift(replica.stage.grpc_of(replica.index))
    }

    /// `http://127.0.0.1:PORT/` of the Cosmos endpoint.
    pub fn cosmos_endpoint(self) -> String {
        format!("http://127.0.0.1:{}/", self.cosmos())
    }
}

/// The `[cosmos]` settings of a tool reading `endpoint` (the local endpoint's development key when
/// no key is given); creates nothing unless `create`.
pub fn cosmos_config(endpoint: &str, key: Option<&str>, create: bool) -> contrail_cosmos::CosmosConfig {
    contrail_cosmos::CosmosConfig {
        endpoint: endpoint.to_owned(),
        key: contrail_common::config::Secret::new(key.unwrap_or(DEV_COSMOS_KEY)),
        create_if_missing: create,
        ..contrail_cosmos::CosmosConfig::default()
    }
}

/// One instance of a stage on this machine: instance `index` of `of`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replica {
    /// The stage.
    pub stage: StageSpec,
    /// Which instance (0-based).
    pub index: u16,
    /// How many instances of the stage run.
    pub of: u16,
}

impl Replica {
    /// The name shown to the user: the stage's, with the instance number when it runs several
    /// times (`dedup-state-1`).
    pub fn name(&self) -> String {
        if self.of > 1 {
            self.instance_id()
        } else {
            self.stage.name.to_owned()
        }
    }

    /// The instance id it runs under (`CONTRAIL_INSTANCE`, as the ordinal of a pod name).
    pub fn instance_id(&self) -> String {
        format!("{}-{}", self.stage.name, self.index)
    }
}

/// How many instances of each stage a local platform runs (`contrail up --scale`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scale {
    counts: std::collections::BTreeMap<&'static str, u16>,
    rotation: bool,
}

impl Scale {
    /// `stage=N` pairs (the last one of a stage wins); stages not named run once.
    pub fn new(pairs: &[(StageSpec, u16)]) -> Scale {
        Scale {
            counts: pairs.iter().map(|(stage, count)| (stage.name, *count)).collect(),
            rotation: false,
        }
    }

    /// With the knock-on delay extension (`contrail up --rotation`): its deployments run too
    /// ([`ROTATION_STAGES`]), the flight deployment writes its states by tail and
    /// delta-archiver archives the predictions.
    pub fn with_rotation(mut self, rotation: bool) -> Scale {
        self.rotation = rotation;
        self
    }

    /// Whether the knock-on delay extension runs.
    pub fn rotation(&self) -> bool {
        self.rotation
    }

    /// Every stage that runs, in pipeline order (the extension's after the five).
    pub fn stages(&self) -> Vec<StageSpec> {
        let extension: &[StageSpec] = if self.rotation { &ROTATION_STAGES } else { &[] };
        STAGES.iter().chain(extension).copied().collect()
    }

    /// Instances of `stage`.
    pub fn count(&self, stage: &StageSpec) -> u16 {
        self.counts.get(stage.name).copied().unwrap_or(1)
    }

    /// Every instance of every stage, in pipeline order.
    pub fn replicas(&self) -> Vec<Replica> {
        self.stages()
            .into_iter()
            .flat_map(|stage| {
                let of = self.count(&stage);
                (0..of).map(move |index| Replica { stage, index, of })
            })
            .collect()
    }

    /// Checks the counts against the platform: ingest runs once (the replay posts to one
    /// address), at most [`MAX_LOCAL_INSTANCES`] of a stage, and no more instances of a Kafka
    /// consumer than partitions (the extra ones would own nothing).
    pub fn check(&self, partitions: i32) -> Result<()> {
        for (name, count) in &self.counts {
            if *name == "ingest" && *count != 1 {
                bail!(
                    "--scale ingest={count}: contrail up runs one ingest (the replay posts to one address); behind a load balancer ingest scales like the other stages"
                );
            }
            if !self.rotation && ROTATION_STAGES.iter().any(|stage| stage.name == *name) {
                bail!("--scale {name}={count}: {name} runs with --rotation only");
            }
            let consumer = matches!(
                *name,
                "dedup-state" | "cosmos-writer" | "delta-archiver" | "rotation" | "cosmos-predictions"
            );
            if consumer && i32::from(*count) > partitions {
                bail!(
                    "--scale {name}={count}: more instances than the {partitions} partitions of each topic (--partitions) — the extra ones would own nothing"
                );
            }
        }
        Ok(())
    }
}

/// Parses one `--scale` value, `STAGE=N`; the error names the bad value.
pub fn parse_scale(value: &str) -> Result<(StageSpec, u16), String> {
    let Some((name, count)) = value.split_once('=') else {
        return Err(format!("{value:?} is not STAGE=N (e.g. dedup-state=2)"));
    };
    let Some(stage) = contrail_common::topology::stage(name.trim()) else {
        let valid: Vec<&str> = STAGES.iter().map(|stage| stage.name).collect();
        return Err(format!(
            "unknown stage {:?} in {value:?}: expected one of {}",
            name.trim(),
            valid.join(", ")
        ));
    };
    match count.trim().parse::<u16>() {
        Ok(count) if (1..=MAX_LOCAL_INSTANCES).contains(&count) => Ok((stage, count)),
        _ => Err(format!(
            "{count:?} in {value:?} is not an instance count from 1 to {MAX_LOCAL_INSTANCES}"
        )),
    }
}

/// Where an instance of dedup-state keeps its RocksDB shards under `workdir`.
pub fn shard_dir(workdir: &Path, replica: &Replica) -> PathBuf {
    workdir.join("shards").join(replica.instance_id())
}

/// The settings (`CONTRAIL_*` variables) of one instance of a stage of a local platform under
/// `workdir`; `rotation`: the knock-on delay extension runs too.
pub fn stage_env(
    replica: &Replica,
    ports: Ports,
    workdir: &Path,
    partitions: i32,
    rotation: bool,
) -> Vec<(String, String)> {
    let stage = &replica.stage;
    let dir = |name: &str| workdir.join(name).display().to_string();
    let mut env: Vec<(&str, String)> = vec![
        ("CONTRAIL_KAFKA__BROKERS", format!("127.0.0.1:{}", ports.broker())),
        (
            "CONTRAIL_LISTEN__HTTP",
            format!("127.0.0.1:{}", ports.http_of(replica)),
        ),
        (
            "CONTRAIL_LISTEN__GRPC",
            format!("127.0.0.1:{}", ports.grpc_of(replica)),
        ),
        ("CONTRAIL_INSTANCE", replica.instance_id()),
    ];
    let consumer = [
        ("CONTRAIL_GROUP__SESSION_TIMEOUT_MS", "6000".to_owned()),
        // One instance per stage that comes back under the same id after a kill: static
        // membership hands it its partitions at once instead of after the session timeout.
        // Several instances: dynamic membership — with two static members killed in turn the
        // local broker's group coordinator (tansu 0.6) left the group with no assignment at all.
        ("CONTRAIL_GROUP__STATIC_MEMBERSHIP", (replica.of == 1).to_string()),
    ];
    let cosmos = [
        ("CONTRAIL_COSMOS__ENDPOINT", ports.cosmos_endpoint()),
        ("CONTRAIL_COSMOS__KEY", DEV_COSMOS_KEY.to_owned()),
    ];
    match stage.name {
        "ingest" => {
            env.push(("CONTRAIL_CURSOR_DIR", dir("cursors")));
            env.push(("CONTRAIL_TOPICS__PARTITIONS", partitions.to_string()));
        }
        "dedup-state" | "rotation" => {
            env.extend(consumer.clone());
            if stage.name == "rotation" {
                // The second processor: its own input (the flight deployment's by-tail states),
                // group, shards and checkpoints.
                env.push(("CONTRAIL_PROCESSOR", "rotation".to_owned()));
                env.push(("CONTRAIL_TOPICS__RAW", topics::BY_TAIL.to_owned()));
                env.push(("CONTRAIL_GROUP__ID", "contrail-rotation".to_owned()));
            } else if rotation {
                env.push(("CONTRAIL_TOPICS__BY_TAIL", topics::BY_TAIL.to_owned()));
            }
            env.push((
                "CONTRAIL_STATE_DIR",
                shard_dir(workdir, replica).display().to_string(),
            ));
            if replica.of > 1 {
                // Instance 0 coordinates the checkpoints of every instance (the Helm chart's
                // ordinal 0); the barrier goes to each one's admin port.
                let peers: Vec<String> = (0..replica.of)
                    .map(|index| {
                        let peer = Replica { index, ..*replica };
                        format!("http://127.0.0.1:{}", ports.grpc_of(&peer))
                    })
                    .collect();
                env.push((
                    "CONTRAIL_CHECKPOINT__COORDINATOR",
                    (replica.index == 0).to_string(),
                ));
                env.push((
                    "CONTRAIL_CHECKPOINT__PEERS",
                    serde_json::to_string(&peers).unwrap_or_default(),
                ));
            }
            let checkpoints = if stage.name == "rotation" {
                "checkpoints-rotation"
            } else {
                "checkpoints"
            };
            env.push(("CONTRAIL_CHECKPOINT_URL", dir(checkpoints)));
            env.push(("CONTRAIL_CHECKPOINT__INTERVAL_MS", "10000".to_owned()));
            env.push(("CONTRAIL_TOPICS__PARTITIONS", partitions.to_string()));
        }
        "cosmos-writer" | "cosmos-predictions" => {
            env.extend(consumer.clone());
            env.extend(cosmos.clone());
            if stage.name == "cosmos-predictions" {
                env.push(("CONTRAIL_INPUT", "predictions".to_owned()));
            }
            env.push(("CONTRAIL_TOPICS__PARTITIONS", partitions.to_string()));
        }
        "changefeed-sync" => {
            env.extend(cosmos.clone());
            env.push(("CONTRAIL_LEASES__RENEW_INTERVAL_MS", "500".to_owned()));
            env.push(("CONTRAIL_LEASES__EXPIRY_MS", "3000".to_owned()));
            // Once a second: a change feed read of the local Cosmos endpoint copies every
            // document of its range (the SDK emulator's limit), and at 200 ms the reads of four
            // ranges took most of its CPU while cosmos-writer drained (the month run settled 152 s
            // after its first event at 200 ms, 109 s at 1,000; docs/TESTING.md).
            env.push(("CONTRAIL_LEASES__POLL_INTERVAL_MS", "1000".to_owned()));
            env.push(("CONTRAIL_TOPICS__PARTITIONS", partitions.to_string()));
        }
        _ => {
            env.extend(consumer);
            env.push(("CONTRAIL_DELTA_ROOT", dir("delta")));
            if rotation {
                env.push(("CONTRAIL_TOPICS__PREDICTIONS", topics::PREDICTIONS.to_owned()));
            }
            // Small batches: history shows up on the board within seconds.
            env.push(("CONTRAIL_BATCH__MAX_LATENCY_MS", "2000".to_owned()));
            env.push(("CONTRAIL_TOPICS__PARTITIONS", partitions.to_string()));
        }
    }
    env.into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_shift_by_the_offset() {
        let ports = Ports { offset: 1000 };
        assert_eq!(ports.broker(), 10092);
        assert_eq!(ports.cosmos_endpoint(), "http://127.0.0.1:9900/");
        let dedup = &STAGES[1];
        assert_eq!(dedup.name, "dedup-state");
        assert_eq!((ports.http(dedup), ports.grpc(dedup)), (9081, 10091));
    }

    #[test]
    fn every_stage_gets_its_own_ports_and_the_shared_broker() {
        let ports = Ports { offset: 7 };
        let dir = Path::new("/w");
        let mut seen = std::collections::BTreeSet::new();
        for replica in Scale::default().replicas() {
            let env = stage_env(&replica, ports, dir, 4, false);
            let get = |key: &str| {
                env.iter()
                    .find(|(name, _)| name == key)
                    .map(|(_, value)| value.clone())
            };
            assert_eq!(get("CONTRAIL_KAFKA__BROKERS").as_deref(), Some("127.0.0.1:9099"));
            assert!(seen.insert(get("CONTRAIL_LISTEN__HTTP")));
            assert!(seen.insert(get("CONTRAIL_LISTEN__GRPC")));
        }
        let delta = stage_env(&Scale::default().replicas()[4], ports, dir, 4, false);
        assert!(delta.contains(&("CONTRAIL_DELTA_ROOT".to_owned(), "/w/delta".to_owned())));
    }

    #[test]
    fn scaled_instances_get_their_own_ports_ids_and_shards_and_one_coordinator() {
        let scale = Scale::new(&[parse_scale("dedup-state=3").expect("parses")]);
        let replicas = scale.replicas();
        assert_eq!(replicas.len(), 7);
        let dedup: Vec<&Replica> = replicas
            .iter()
            .filter(|replica| replica.stage.name == "dedup-state")
            .collect();
        let names: Vec<String> = dedup.iter().map(|replica| replica.name()).collect();
        assert_eq!(names, ["dedup-state-0", "dedup-state-1", "dedup-state-2"]);
        assert_eq!(
            replicas[0].name(),
            "ingest",
            "a stage running once keeps its name"
        );
        let ports = Ports { offset: 0 };
        let dir = Path::new("/w");
        let mut seen = std::collections::BTreeSet::new();
        let mut coordinators = 0;
        for replica in &replicas {
            let env = stage_env(replica, ports, dir, 4, false);
            let get = |key: &str| {
                env.iter()
                    .find(|(name, _)| name == key)
                    .map(|(_, value)| value.clone())
            };
            assert!(seen.insert(get("CONTRAIL_LISTEN__HTTP")), "{replica:?}");
            assert!(seen.insert(get("CONTRAIL_LISTEN__GRPC")), "{replica:?}");
            assert!(seen.insert(get("CONTRAIL_INSTANCE")), "{replica:?}");
            if replica.stage.name == "dedup-state" {
                assert!(seen.insert(get("CONTRAIL_STATE_DIR")), "{replica:?}");
                assert_eq!(
                    get("CONTRAIL_CHECKPOINT__PEERS").as_deref(),
                    Some(r#"["http://127.0.0.1:9091","http://127.0.0.1:9191","http://127.0.0.1:9291"]"#)
                );
                coordinators +=
                    usize::from(get("CONTRAIL_CHECKPOINT__COORDINATOR").as_deref() == Some("true"));
            }
        }
        assert_eq!(coordinators, 1);
    }

    #[test]
    fn the_rotation_extension_runs_two_more_deployments_wired_to_the_flight_deployment() {
        let scale = Scale::default().with_rotation(true);
        let replicas = scale.replicas();
        let names: Vec<String> = replicas.iter().map(Replica::name).collect();
        assert_eq!(
            names,
            [
                "ingest",
                "dedup-state",
                "cosmos-writer",
                "changefeed-sync",
                "delta-archiver",
                "rotation",
                "cosmos-predictions"
            ]
        );
        let ports = Ports { offset: 0 };
        let dir = Path::new("/w");
        let envs: Vec<Vec<(String, String)>> = replicas
            .iter()
            .map(|replica| stage_env(replica, ports, dir, 4, true))
            .collect();
        let get = |index: usize, key: &str| {
            envs[index]
                .iter()
                .find(|(name, _)| name == key)
                .map(|(_, value)| value.as_str())
        };
        let mut seen = std::collections::BTreeSet::new();
        for (index, name) in names.iter().enumerate() {
            for key in [
                "CONTRAIL_LISTEN__HTTP",
                "CONTRAIL_LISTEN__GRPC",
                "CONTRAIL_INSTANCE",
            ] {
                assert!(seen.insert(get(index, key)), "{key} of {name}");
            }
        }
        // The flight deployment feeds the rotation deployment, which has its own group, shards and
        // checkpoints; the predictions reach Cosmos DB and Delta.
        assert_eq!(get(1, "CONTRAIL_TOPICS__BY_TAIL"), Some("ops.flights.by-tail"));
        assert_eq!(get(5, "CONTRAIL_TOPICS__RAW"), Some("ops.flights.by-tail"));
        assert_eq!(get(5, "CONTRAIL_PROCESSOR"), Some("rotation"));
        assert_eq!(get(5, "CONTRAIL_GROUP__ID"), Some("contrail-rotation"));
        assert_ne!(get(5, "CONTRAIL_STATE_DIR"), get(1, "CONTRAIL_STATE_DIR"));
        assert_ne!(
            get(5, "CONTRAIL_CHECKPOINT_URL"),
            get(1, "CONTRAIL_CHECKPOINT_URL")
        );
        assert_eq!(get(6, "CONTRAIL_INPUT"), Some("predictions"));
        assert_eq!(
            get(4, "CONTRAIL_TOPICS__PREDICTIONS"),
            Some("ops.flights.predictions")
        );
        // Without the extension nothing of it is set.
        let plain = stage_env(&replicas[1], ports, dir, 4, false);
        assert!(!plain.iter().any(|(key, _)| key == "CONTRAIL_TOPICS__BY_TAIL"));
        let error = Scale::new(&[parse_scale("rotation=2").expect("parses")])
            .check(4)
            .expect_err("rotation without --rotation")
            .to_string();
        assert!(error.contains("--rotation"), "{error}");
        assert!(
            Scale::new(&[parse_scale("rotation=2").expect("parses")])
                .with_rotation(true)
                .check(4)
                .is_ok()
        );
    }

    #[test]
    fn a_bad_scale_is_refused_with_the_value_named() {
        let unknown = parse_scale("dedup=2").expect_err("unknown stage");
        assert!(
            unknown.contains("\"dedup\"") && unknown.contains("dedup-state"),
            "{unknown}"
        );
        let zero = parse_scale("cosmos-writer=0").expect_err("zero");
        assert!(zero.contains("\"0\""), "{zero}");
        assert!(parse_scale("cosmos-writer").is_err());
        assert!(parse_scale("cosmos-writer=9").is_err());
        let too_many = Scale::new(&[parse_scale("delta-archiver=5").expect("parses")]);
        let error = too_many.check(4).expect_err("more than partitions").to_string();
        assert!(
            error.contains("delta-archiver=5") && error.contains("4 partitions"),
            "{error}"
        );
        assert!(too_many.check(8).is_ok());
        let ingest = Scale::new(&[parse_scale("ingest=2").expect("parses")]);
        assert!(ingest.check(4).is_err());
        let standby = Scale::new(&[parse_scale("changefeed-sync=6").expect("parses")]);
        assert!(
            standby.check(4).is_ok(),
            "change-feed leases: extra instances stand by"
        );
    }
}
