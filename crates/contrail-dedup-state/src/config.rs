//! Configuration of the dedup-state stage (`CONTRAIL_…` variables, `--config` TOML).

use std::path::PathBuf;

use contrail_common::auth::AuthConfig;
use contrail_common::config::ListenConfig;
use contrail_common::kafka::{GroupConfig, KafkaConfig};
use contrail_common::telemetry::TelemetryConfig;
use contrail_common::topology::{self, topics};
use contrail_flight::flight::Rules;
use serde::{Deserialize, Serialize};

/// Everything the dedup-state stage can be told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DedupStateConfig {
    /// Instance name (pod name); defaults to `$HOSTNAME`. Also the static group member id when
    /// `group.static_membership` is on.
    pub instance: String,
    /// HTTP (probes, metrics) and gRPC (admin, checkpoint control) listen addresses.
    pub listen: ListenConfig,
    /// Logging.
    pub telemetry: TelemetryConfig,
    /// The broker.
    pub kafka: KafkaConfig,
    /// Topic names.
    pub topics: TopicsConfig,
    /// Consumer group membership.
    pub group: GroupConfig,
    /// Where the RocksDB shards live (`CONTRAIL_STATE_DIR`): one directory per input partition.
    pub state_dir: PathBuf,
    /// RocksDB memory shared by every shard of the process.
    pub storage: StorageConfig,
    /// The checkpoint store (`CONTRAIL_CHECKPOINT_URL`): a local directory path or `file:///path`
    /// (in Kubernetes, a mounted Azure Files volume shared by the pods), or Azure Blob / ADLS Gen2
    /// at `abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH`.
    pub checkpoint_url: String,
    /// Options of an `abfss://` checkpoint store (object_store's Azure keys, e.g.
    /// `azure_storage_account_key`; none with workload identity, which comes from the
    /// environment). Secret: never logged.
    pub checkpoint_storage_options: std::collections::BTreeMap<String, contrail_common::config::Secret>,
    /// Checkpoint coordination.
    pub checkpoint: CheckpointConfig,
    /// Which processor the stage runs on its input: `flight` (docs/CONTRACT.md, "Processing in
    /// dedup-state", on the raw events) or `rotation` (knock-on delay predictions, on flight states
    /// keyed by tail number: point `topics.raw` at the flight processor's `topics.by_tail`).
    pub processor: ProcessorKind,
    /// Processing rules of docs/CONTRACT.md ("Processing in dedup-state").
    pub rules: RulesConfig,
    /// Rules of the rotation processor.
    pub rotation: RotationConfig,
    /// Micro-batching.
    pub batch: BatchConfig,
    /// Authentication of the admin and control APIs.
    pub auth: AuthConfig,
}

impl Default for DedupStateConfig {
    fn default() -> Self {
        DedupStateConfig {
            instance: std::env::var("HOSTNAME").unwrap_or_else(|_| "dedup-state-0".to_owned()),
            listen: ListenConfig::of(topology::DEDUP_STATE),
            telemetry: TelemetryConfig::default(),
            kafka: KafkaConfig::default(),
            topics: TopicsConfig::default(),
            group: GroupConfig::with_id("contrail-dedup-state"),
            state_dir: PathBuf::from("./data/dedup-state/shards"),
            storage: StorageConfig::default(),
            checkpoint_url: "./data/dedup-state/checkpoints".to_owned(),
            checkpoint_storage_options: std::collections::BTreeMap::new(),
            checkpoint: CheckpointConfig::default(),
            processor: ProcessorKind::default(),
            rules: RulesConfig::default(),
            rotation: RotationConfig::default(),
            batch: BatchConfig::default(),
            auth: AuthConfig::default(),
        }
    }
}

/// Topics dedup-state reads and writes (docs/CONTRACT.md, "Stages and topics").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsConfig {
    /// Input: validated events from ingest.
    pub raw: String,
    /// One `FlightState` per accepted event.
    pub curated: String,
    /// Accepted events.
    pub accepted: String,
    /// Late events.
    pub late: String,
    /// Alerts (DEPARTURE_OVERDUE).
    pub alerts: String,
    /// Records that are not decodable events.
    pub dlq: String,
    /// The flight processor also writes every curated state here, keyed by its tail number (the
    /// rotation processor's input); empty (the default): not written.
    pub by_tail: String,
    /// The rotation processor's predictions (`FlightPrediction`, keyed by flight key).
    pub predictions: String,
    /// Create missing topics at start (local development; off against Event Hubs).
    pub create: bool,
    /// Partitions of created topics.
    pub partitions: i32,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        TopicsConfig {
            raw: topics::RAW.to_owned(),
            curated: topics::CURATED.to_owned(),
            accepted: topics::ACCEPTED.to_owned(),
            late: topics::LATE.to_owned(),
            alerts: topics::ALERTS.to_owned(),
            dlq: topics::DLQ.to_owned(),
            by_tail: String::new(),
            predictions: topics::PREDICTIONS.to_owned(),
            create: true,
            partitions: 4,
        }
    }
}

/// Checkpoints (docs/CONTRACT.md, "Checkpoints").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Whether this instance runs the checkpoint coordinator (exactly one instance should: in the
    /// Helm chart, ordinal 0 of the StatefulSet).
    pub coordinator: bool,
    /// The control endpoints (`http://host:port`, the gRPC ports) of every shard owner, this one
    /// included. Empty: only this instance.
    pub peers: Vec<String>,
    /// Time between checkpoints; 0 disables periodic checkpoints (the admin API can still trigger).
    pub interval_ms: u64,
    /// How long a barrier (checkpoint + upload) may take per owner.
    pub barrier_timeout_ms: u64,
    /// Complete epochs kept; older ones are garbage-collected.
    pub keep: usize,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            coordinator: true,
            peers: Vec::new(),
            interval_ms: 60_000,
            barrier_timeout_ms: 120_000,
            keep: 2,
        }
    }
}

/// The processor a dedup-state deployment runs (one per deployment: each reads its own input).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessorKind {
    /// The flight processor (docs/CONTRACT.md, "Processing in dedup-state"): dedup, per-flight
    /// order, the fold, DEPARTURE_OVERDUE.
    #[default]
    Flight,
    /// Knock-on delay by aircraft rotation, on flight states keyed by tail number.
    Rotation,
}

/// The rotation processor's rules, in minutes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RotationConfig {
    /// Minimum turn time of an aircraft between an inbound flight's arrival and its next
    /// departure.
    pub min_turn_minutes: u32,
    /// Per carrier code (of the departing flight), overriding `min_turn_minutes`.
    pub min_turn_minutes_by_carrier: std::collections::BTreeMap<String, u32>,
    /// A KNOCK_ON_DELAY alert is raised when a flight's predicted departure, set by its inbound,
    /// is this long or more beyond its schedule.
    pub alert_after_minutes: u32,
}

impl Default for RotationConfig {
    fn default() -> Self {
        RotationConfig {
            min_turn_minutes: 30,
            min_turn_minutes_by_carrier: std::collections::BTreeMap::new(),
            alert_after_minutes: 15,
        }
    }
}

impl RotationConfig {
    /// The rules in microseconds.
    pub fn rules(&self) -> contrail_flight::rotation::TurnRules {
        let minutes = |value: u32| i64::from(value) * contrail_flight::rotation::MINUTE_US;
        contrail_flight::rotation::TurnRules {
            min_turn_us: minutes(self.min_turn_minutes),
            per_carrier: self
                .min_turn_minutes_by_carrier
                .iter()
                .map(|(carrier, value)| (carrier.clone(), minutes(*value)))
                .collect(),
            alert_after_us: minutes(self.alert_after_minutes),
        }
    }
}

/// The time rules of docs/CONTRACT.md ("Processing in dedup-state"), in seconds of event time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RulesConfig {
    /// How far behind a flight's newest event an event may be and still be applied.
    pub allowed_lateness_secs: i64,
    /// How long after its event time a dedup entry is kept.
    pub dedup_ttl_secs: i64,
    /// How long after a flight's last event its state is kept.
    pub state_ttl_secs: i64,
    /// DEPARTURE_OVERDUE after `scheduled_out` + this without OUT/CANCELLED.
    pub overdue_after_secs: i64,
    /// How far ahead of dedup-state's processing clock an event's time may be; a record further
    /// ahead (a source with a broken clock writing to the raw topic directly) is dead-lettered and
    /// never moves the watermark (docs/CONTRACT.md, "Plausible time").
    pub max_clock_skew_secs: i64,
    /// Most events one flight accepts in its life; a new event past it is dead-lettered with the
    /// reason (`flight_full`), so one flight's stored record (its dedup entries and pending
    /// events) stays bounded whatever a source sends (docs/CONTRACT.md, "Bounded state").
    pub max_events_per_flight: u64,
}

impl Default for RulesConfig {
    fn default() -> Self {
        RulesConfig {
            allowed_lateness_secs: 3_600,
            dedup_ttl_secs: 72 * 3_600,
            state_ttl_secs: 48 * 3_600,
            overdue_after_secs: 15 * 60,
            max_clock_skew_secs: 3_600,
            max_events_per_flight: contrail_flight::flight::DEFAULT_MAX_EVENTS_PER_FLIGHT,
        }
    }
}

impl RulesConfig {
    /// The rules in microseconds.
    pub fn rules(&self) -> Rules {
        const SECOND: i64 = 1_000_000;
        Rules {
            allowed_lateness_us: self.allowed_lateness_secs.saturating_mul(SECOND),
            dedup_ttl_us: self.dedup_ttl_secs.saturating_mul(SECOND),
            state_ttl_us: self.state_ttl_secs.saturating_mul(SECOND),
            overdue_after_us: self.overdue_after_secs.saturating_mul(SECOND),
            max_clock_skew_us: self.max_clock_skew_secs.saturating_mul(SECOND),
            max_events_per_flight: self.max_events_per_flight,
        }
    }
}

/// RocksDB memory the shards of one process share (docs/BENCHMARKS.md, "State bigger than
/// memory"): RocksDB's own defaults would give each column family of each shard its own block
/// cache and memtables, so memory would grow with the partitions a pod owns. Not bounded by it:
/// the in-memory timer index (every committed timer; a flight has one or two).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Block cache (SST data blocks read back), MiB.
    pub block_cache_mib: usize,
    /// All memtables together, MiB (a soft target): once the mutable ones pass 7/8 of it, the
    /// shard being written flushes its oldest memtable.
    pub memtable_mib: usize,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            block_cache_mib: 256,
            memtable_mib: 256,
        }
    }
}

impl StorageConfig {
    /// The shared cache and memtable budget this configures.
    pub fn memory(&self) -> contrail_state::StorageMemory {
        contrail_state::StorageMemory::new(self.block_cache_mib << 20, self.memtable_mib << 20)
    }
}

/// When a shard writes its held batches ([`BatchConfig::commit_interval_ms`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitPolicy {
    /// How long batches are held at most (once acknowledged); `None`: every batch commits itself.
    pub interval: Option<std::time::Duration>,
    /// Held bytes above which a shard commits at its first chance.
    pub max_held_bytes: usize,
}

impl CommitPolicy {
    /// Whether a shard holding `held` is due: something held, every output acknowledged, and the
    /// oldest batch older than the interval or the state over its budget (`force`: whenever the
    /// outputs are acknowledged — a revocation, a checkpoint barrier).
    pub fn due(&self, held: &contrail_state::HeldSummary, force: bool) -> bool {
        held.batches > 0
            && held.unacknowledged == 0
            && (force
                || held.bytes >= self.max_held_bytes
                || match (self.interval, held.since) {
                    (Some(interval), Some(since)) => since.elapsed() >= interval,
                    _ => true,
                })
    }
}

/// Micro-batching: a batch holds what has arrived, up to `max_records`; only an empty batch waits
/// (at most `max_wait_ms`) for its first record. Under load batches fill from the consumer's
/// prefetched records; at low load a record is processed as soon as it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Records per micro-batch of one shard.
    pub max_records: usize,
    /// Threads running batches: batches of different shards (input partitions) run at once, one
    /// batch per shard at a time. `0`: one per CPU available to the process (its cgroup limit
    /// included); `1`: the polling thread runs every batch itself. More threads than owned shards
    /// stay idle.
    pub threads: usize,
    /// How long an empty batch waits for a first record before the loop goes round (timers,
    /// checkpoints, pauses are served between batches).
    pub max_wait_ms: u64,
    /// Outputs produced but not yet acknowledged by the broker above which consumption waits.
    pub max_unacknowledged: usize,
    /// Commit points: a shard's batches are held in memory (state, timers, offset; outputs are
    /// not kept) and written to RocksDB together once this long has passed since the oldest and
    /// every output of them is acknowledged by the broker; a crash before that reprocesses them
    /// from the previous commit point and regenerates the same outputs, which downstream drops by
    /// position (docs/CONTRACT.md, "Guarantees across restarts"). `0`: every batch is committed
    /// with its outputs in the outbox.
    pub commit_interval_ms: u64,
    /// A shard's held state (bytes of the entries written since its last commit point) above
    /// which it commits as soon as its outputs are acknowledged, however short the interval.
    pub max_held_mib: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            max_records: 2_000,
            threads: 0,
            max_wait_ms: 50,
            max_unacknowledged: 50_000,
            commit_interval_ms: 1_000,
            max_held_mib: 64,
        }
    }
}

impl BatchConfig {
    /// When a shard's held batches are due for a commit point.
    pub fn commit_policy(&self) -> CommitPolicy {
        CommitPolicy {
            interval: (self.commit_interval_ms > 0)
                .then(|| std::time::Duration::from_millis(self.commit_interval_ms)),
            max_held_bytes: self.max_held_mib << 20,
        }
    }

    /// The processing threads to run ([`BatchConfig::threads`] with `0` resolved).
    pub fn processing_threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            threads => threads,
        }
    }
}

impl DedupStateConfig {
    /// The processor's own topics: a rotation deployment reads the by-tail topic (never the raw
    /// events, never the flight deployment's group), and writes its predictions somewhere; the
    /// flight deployment never writes its by-tail states into its own input.
    fn validate_processor(&self) -> Result<(), String> {
        let topics = &self.topics;
        match self.processor {
            ProcessorKind::Flight if !topics.by_tail.is_empty() && topics.by_tail == topics.raw => Err(format!(
                "topics.by_tail = {:?} is the input topic (topics.raw): the flight processor would read its own outputs",
                topics.by_tail
            )),
            ProcessorKind::Rotation if topics.raw == topology::topics::RAW => Err(format!(
                "processor = \"rotation\" with topics.raw = {:?}: the rotation processor reads flight states keyed by tail \
                 (the flight deployment's topics.by_tail, e.g. {:?}), not the raw events",
                topics.raw,
                topology::topics::BY_TAIL
            )),
            ProcessorKind::Rotation if self.group.id == GroupConfig::with_id("contrail-dedup-state").id => Err(
                "processor = \"rotation\" in the flight deployment's consumer group (group.id = \"contrail-dedup-state\"): \
                 give the rotation deployment its own, e.g. \"contrail-rotation\""
                    .to_owned(),
            ),
            ProcessorKind::Rotation if topics.predictions.trim().is_empty() => {
                Err("processor = \"rotation\" with an empty topics.predictions".to_owned())
            }
            _ => Ok(()),
        }
    }
}

/// The largest `rules.max_events_per_flight` accepted: a flight's record (read and written whole
/// for each of its events) holds one dedup entry per accepted event.
const MAX_EVENTS_PER_FLIGHT_LIMIT: u64 = 100_000;

impl DedupStateConfig {
    /// Checks values serde cannot; the message names the key and the bad value.
    pub fn validate(&self) -> Result<(), String> {
        self.validate_processor()?;
        let rules = &self.rules;
        for (name, value) in [
            ("rules.allowed_lateness_secs", rules.allowed_lateness_secs),
            ("rules.dedup_ttl_secs", rules.dedup_ttl_secs),
            ("rules.state_ttl_secs", rules.state_ttl_secs),
            ("rules.overdue_after_secs", rules.overdue_after_secs),
            ("rules.max_clock_skew_secs", rules.max_clock_skew_secs),
        ] {
            if value < 0 {
                return Err(format!("{name} = {value}: must not be negative"));
            }
        }
        if rules.dedup_ttl_secs < rules.allowed_lateness_secs {
            return Err(format!(
                "rules.dedup_ttl_secs = {} is shorter than rules.allowed_lateness_secs = {}: a duplicate \
                 arriving within the lateness bound would be accepted twice",
                rules.dedup_ttl_secs, rules.allowed_lateness_secs
            ));
        }
        if rules.dedup_ttl_secs < rules.state_ttl_secs {
            return Err(format!(
                "rules.dedup_ttl_secs = {} is shorter than rules.state_ttl_secs = {}: dedup entries must \
                 live at least as long as a flight's state, or a redelivery to a live flight would be \
                 applied twice",
                rules.dedup_ttl_secs, rules.state_ttl_secs
            ));
        }
        if !(1..=MAX_EVENTS_PER_FLIGHT_LIMIT).contains(&rules.max_events_per_flight) {
            return Err(format!(
                "rules.max_events_per_flight = {}: must be between 1 and {MAX_EVENTS_PER_FLIGHT_LIMIT} \
                 (each accepted event keeps a dedup entry in its flight's record until the flight expires)",
                rules.max_events_per_flight
            ));
        }
        if self.batch.max_records == 0 {
            return Err("batch.max_records = 0: must be at least 1".to_owned());
        }
        for (name, value) in [
            ("storage.block_cache_mib", self.storage.block_cache_mib),
            ("storage.memtable_mib", self.storage.memtable_mib),
        ] {
            if !(8..=1 << 20).contains(&value) {
                return Err(format!("{name} = {value}: must be between 8 and 1048576 (MiB)"));
            }
        }
        // The outputs' order and completeness rest on these producer settings (see
        // `producer_config`): they are not the operator's to change.
        for (key, required) in [("message.timeout.ms", "0"), ("enable.idempotence", "true")] {
            if let Some(value) = self.kafka.properties.get(key)
                && value != required
            {
                return Err(format!(
                    "kafka.properties.{key} = {value:?}: dedup-state needs {required} (an output that \
                     times out or is retried without idempotence would reach its topic out of order or \
                     twice); remove the setting"
                ));
            }
        }
        if self.checkpoint.keep == 0 {
            return Err("checkpoint.keep = 0: must keep at least one complete checkpoint".to_owned());
        }
        if let Some((scheme, _)) = self.checkpoint_url.split_once("://")
            && !["file", "abfss", "abfs"].contains(&scheme.to_ascii_lowercase().as_str())
        {
            return Err(format!(
                "checkpoint_url = {:?}: use a path, file://PATH or \
                 abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH",
                self.checkpoint_url
            ));
        }
        for peer in &self.checkpoint.peers {
            if peer.starts_with("https://") {
                // This build speaks to its peers in clear only: an https:// peer would be
                // accepted and then spoken to without TLS, which is worse than refusing it.
                return Err(format!(
                    "checkpoint.peers: {peer:?}: TLS to checkpoint peers is not supported by this build; \
                     use http:// inside the cluster network (or a service mesh that adds mTLS)"
                ));
            }
            if !peer.starts_with("http://") {
                return Err(format!("checkpoint.peers: {peer:?} must start with http://"));
            }
        }
        if !["cooperative-sticky", "range", "roundrobin"].contains(&self.group.assignment_strategy.as_str()) {
            return Err(format!(
                "group.assignment_strategy = {:?}: use cooperative-sticky, range or roundrobin",
                self.group.assignment_strategy
            ));
        }
        Ok(())
    }

    /// The checkpoint store's options with their secret values (for the store's client only).
    pub fn checkpoint_options(&self) -> std::collections::BTreeMap<String, String> {
        self.checkpoint_storage_options
            .iter()
            .map(|(key, value)| (key.clone(), value.expose().to_owned()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_point_is_due_only_once_every_held_output_is_acknowledged() {
        let policy = BatchConfig::default().commit_policy();
        let old = std::time::Instant::now() - std::time::Duration::from_secs(2);
        let held = contrail_state::HeldSummary {
            batches: 3,
            records: 100,
            bytes: 1_000,
            outputs: 200,
            unacknowledged: 0,
            since: Some(old),
            ..Default::default()
        };
        assert!(
            policy.due(&held, false),
            "acknowledged and older than the interval"
        );
        let waiting = contrail_state::HeldSummary {
            unacknowledged: 1,
            ..held
        };
        assert!(!policy.due(&waiting, false) && !policy.due(&waiting, true));
        let young = contrail_state::HeldSummary {
            since: Some(std::time::Instant::now()),
            ..held
        };
        assert!(!policy.due(&young, false), "younger than the interval");
        assert!(policy.due(&young, true), "forced");
        let big = contrail_state::HeldSummary {
            bytes: 64 << 20,
            ..young
        };
        assert!(policy.due(&big, false), "over the held budget");
        assert!(
            !policy.due(&contrail_state::HeldSummary::default(), true),
            "nothing held"
        );
        let every_batch = BatchConfig {
            commit_interval_ms: 0,
            ..BatchConfig::default()
        };
        assert_eq!(every_batch.commit_policy().interval, None);
    }

    #[test]
    fn a_rotation_deployment_must_read_the_by_tail_topic_in_a_group_of_its_own() {
        let mut config = DedupStateConfig {
            processor: ProcessorKind::Rotation,
            ..DedupStateConfig::default()
        };
        let error = config.validate().expect_err("raw events refused");
        assert!(error.contains("topics.raw = \"ops.events.raw\""), "{error}");
        config.topics.raw = topics::BY_TAIL.to_owned();
        let error = config.validate().expect_err("the flight group refused");
        assert!(error.contains("group.id"), "{error}");
        config.group.id = "contrail-rotation".to_owned();
        assert_eq!(config.validate(), Ok(()));
        let mut flight = DedupStateConfig::default();
        flight.topics.by_tail = flight.topics.raw.clone();
        let error = flight.validate().expect_err("own input refused");
        assert!(error.contains("topics.by_tail"), "{error}");
    }

    #[test]
    fn defaults_are_valid_and_match_the_contract() {
        let config = DedupStateConfig::default();
        assert_eq!(config.validate(), Ok(()));
        let rules = config.rules.rules();
        assert_eq!(
            rules,
            Rules::default(),
            "the contract's defaults: 1 h lateness, 72 h dedup, 48 h state"
        );
    }

    /// The annotated example in deploy/config parses with the real loader and is valid.
    #[test]
    fn the_example_configuration_is_valid() {
        let path = std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo"))
            .join("../../deploy/config/dedup-state.example.toml");
        let no_environment = figment::providers::Env::prefixed("CONTRAIL_EXAMPLE_TEST_UNSET_");
        let config: DedupStateConfig =
            contrail_common::config::load_from(Some(&path), no_environment).expect("example parses");
        assert_eq!(config.validate(), Ok(()));
        assert!(config.group.static_membership);
        assert_eq!(config.checkpoint.peers.len(), 2);
    }

    /// An output that times out would be re-sent behind newer ones: the producer settings that
    /// keep each topic in input order are refused when changed.
    #[test]
    fn a_delivery_timeout_or_a_non_idempotent_producer_is_refused() {
        for (key, value) in [("message.timeout.ms", "3000"), ("enable.idempotence", "false")] {
            let mut config = DedupStateConfig::default();
            config.kafka.properties.insert(key.to_owned(), value.to_owned());
            let error = config.validate().expect_err(key);
            assert!(error.contains(&format!("kafka.properties.{key}")), "{error}");
        }
        let mut config = DedupStateConfig::default();
        config
            .kafka
            .properties
            .insert("message.timeout.ms".to_owned(), "0".to_owned());
        assert_eq!(config.validate(), Ok(()));
        let producer = crate::producer_config(&DedupStateConfig::default()).expect("producer config");
        assert_eq!(producer.get("message.timeout.ms"), Some("0"));
        assert_eq!(producer.get("enable.idempotence"), Some("true"));
    }

    #[test]
    fn bad_values_are_named() {
        let mut config = DedupStateConfig::default();
        config.rules.dedup_ttl_secs = 10;
        let error = config.validate().expect_err("dedup ttl below lateness");
        assert!(error.contains("rules.dedup_ttl_secs = 10"), "{error}");
        let mut config = DedupStateConfig::default();
        config.rules.state_ttl_secs = 100 * 3_600;
        let error = config.validate().expect_err("dedup ttl below state ttl");
        assert!(
            error.contains("rules.dedup_ttl_secs = 259200")
                && error.contains("rules.state_ttl_secs = 360000"),
            "{error}"
        );
        let mut config = DedupStateConfig::default();
        config.rules.max_clock_skew_secs = -1;
        let error = config.validate().expect_err("negative skew");
        assert!(error.contains("rules.max_clock_skew_secs = -1"), "{error}");
        let mut config = DedupStateConfig::default();
        config.checkpoint.peers = vec!["dedup-0:9091".to_owned()];
        assert!(config.validate().expect_err("scheme").contains("dedup-0:9091"));
        let mut config = DedupStateConfig::default();
        config.checkpoint.peers = vec!["https://dedup-1.dedup:9091".to_owned()];
        let error = config
            .validate()
            .expect_err("https peers are refused, not spoken to in clear");
        assert!(
            error.contains("https://dedup-1.dedup:9091") && error.contains("TLS"),
            "{error}"
        );
        let mut config = DedupStateConfig::default();
        config.group.assignment_strategy = "sticky".to_owned();
        assert!(config.validate().expect_err("strategy").contains("\"sticky\""));
        let mut config = DedupStateConfig::default();
        config.storage.memtable_mib = 0;
        let error = config.validate().expect_err("no memtables");
        assert!(error.contains("storage.memtable_mib = 0"), "{error}");
    }
}
