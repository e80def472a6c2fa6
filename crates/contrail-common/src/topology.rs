//! The platform's shape in one place: the five stages with their default ports, and the topic
//! names of docs/CONTRACT.md, "Stages and topics". Every stage's config defaults, `contrail up`,
//! `contrail admin` and the tests read them from here, so a name or a port is written once.

/// A stage of the pipeline and its default ports (HTTP probes and metrics, gRPC admin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageSpec {
    /// Stage name (logs, status, `--scale`); for the five pipeline stages also their binary, the
    /// Kafka client id prefix and the `stage` metric label.
    pub name: &'static str,
    /// The binary it runs (a deployment of the rotation extension runs a pipeline stage's binary
    /// with other settings).
    pub binary: &'static str,
    /// Default HTTP port (`/healthz`, `/readyz`, `/metrics`; ingest's event API).
    pub http: u16,
    /// Default gRPC port (the admin API; ingest's event API).
    pub grpc: u16,
}

/// `ingest`: HTTP/gRPC and pull sources → `ops.events.raw`.
pub const INGEST: StageSpec = StageSpec {
    name: "ingest",
    binary: "ingest",
    http: 8080,
    grpc: 9090,
};
/// `dedup-state`: dedup, ordering, the fold, timers → accepted, late, curated, alerts.
pub const DEDUP_STATE: StageSpec = StageSpec {
    name: "dedup-state",
    binary: "dedup-state",
    http: 8081,
    grpc: 9091,
};
/// `cosmos-writer`: curated states → Cosmos DB `flights`.
pub const COSMOS_WRITER: StageSpec = StageSpec {
    name: "cosmos-writer",
    binary: "cosmos-writer",
    http: 8082,
    grpc: 9192,
};
/// `changefeed-sync`: the Cosmos DB change feed → `ops.flights.changes`.
pub const CHANGEFEED_SYNC: StageSpec = StageSpec {
    name: "changefeed-sync",
    binary: "changefeed-sync",
    http: 8083,
    grpc: 9193,
};
/// `delta-archiver`: accepted, curated, late and changes → Delta Lake history.
pub const DELTA_ARCHIVER: StageSpec = StageSpec {
    name: "delta-archiver",
    binary: "delta-archiver",
    http: 8084,
    grpc: 9194,
};

/// The five stages in pipeline order.
pub const STAGES: [StageSpec; 5] = [
    INGEST,
    DEDUP_STATE,
    COSMOS_WRITER,
    CHANGEFEED_SYNC,
    DELTA_ARCHIVER,
];

/// The knock-on delay extension: dedup-state with `processor = "rotation"` on the
/// by-tail states.
pub const ROTATION: StageSpec = StageSpec {
    name: "rotation",
    binary: "dedup-state",
    http: 8085,
    grpc: 9195,
};
/// The knock-on delay extension: cosmos-writer with `input = "predictions"`, setting the
/// predictions on the flight documents.
pub const COSMOS_PREDICTIONS: StageSpec = StageSpec {
    name: "cosmos-predictions",
    binary: "cosmos-writer",
    http: 8086,
    grpc: 9196,
};

/// The deployments of the knock-on delay extension, in pipeline order.
pub const ROTATION_STAGES: [StageSpec; 2] = [ROTATION, COSMOS_PREDICTIONS];

/// The stage called `name` (a pipeline stage or an extension's deployment).
pub fn stage(name: &str) -> Option<StageSpec> {
    STAGES
        .into_iter()
        .chain(ROTATION_STAGES)
        .find(|stage| stage.name == name)
}

/// How far apart the ports of a stage's instances on one machine are (`contrail up --scale`):
/// instance `i` listens on the default ports + `i` × this.
pub const INSTANCE_PORT_STRIDE: u16 = 100;

/// The most instances of one stage on one machine (their ports stay clear of every other port).
pub const MAX_LOCAL_INSTANCES: u16 = 8;

impl StageSpec {
    /// HTTP port of instance `index` (0 = the default port) on one machine.
    pub fn http_of(&self, index: u16) -> u16 {
        self.http + index * INSTANCE_PORT_STRIDE
    }

    /// gRPC admin port of instance `index` (0 = the default port) on one machine.
    pub fn grpc_of(&self, index: u16) -> u16 {
        self.grpc + index * INSTANCE_PORT_STRIDE
    }
}

/// The topic names (docs/CONTRACT.md, "Stages and topics"), each stage's default.
pub mod topics {
    /// Validated raw events from ingest (key: flight key).
    pub const RAW: &str = "ops.events.raw";
    /// Events dedup-state accepted (one per `(flight_key, event_id)`).
    pub const ACCEPTED: &str = "ops.events.accepted";
    /// Events older than their flight's watermark, or of a flight past its horizon.
    pub const LATE: &str = "ops.events.late";
    /// One `FlightState` per accepted event (the flight's new version).
    pub const CURATED: &str = "ops.flights.curated";
    /// Timer alerts (DEPARTURE_OVERDUE).
    pub const ALERTS: &str = "ops.alerts";
    /// The Cosmos DB change feed as records.
    pub const CHANGES: &str = "ops.flights.changes";
    /// Dead letters of every stage.
    pub const DLQ: &str = "ops.events.dlq";

    /// Curated flight states keyed by tail number (the rotation processor's input; written by the
    /// flight processor when `topics.by_tail` is set).
    pub const BY_TAIL: &str = "ops.flights.by-tail";
    /// Knock-on delay predictions (`FlightPrediction`), keyed by flight key.
    pub const PREDICTIONS: &str = "ops.flights.predictions";

    /// Every topic of the flight pipeline, in pipeline order (the rotation processor's topics
    /// are created by the deployments that use them).
    pub const ALL: [&str; 7] = [RAW, DLQ, ACCEPTED, LATE, CURATED, CHANGES, ALERTS];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ports_are_unique() {
        let every: Vec<StageSpec> = STAGES.into_iter().chain(ROTATION_STAGES).collect();
        let mut names: Vec<_> = every.iter().map(|stage| stage.name).collect();
        let mut ports: Vec<_> = every.iter().flat_map(|stage| [stage.http, stage.grpc]).collect();
        names.sort_unstable();
        names.dedup();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(names.len(), every.len());
        assert_eq!(ports.len(), 2 * every.len());
        assert!(STAGES.iter().all(|stage| stage.binary == stage.name));
        assert!(
            ROTATION_STAGES
                .iter()
                .all(|extension| stage(extension.binary).is_some())
        );
        assert_eq!(stage("rotation"), Some(ROTATION));
        let mut topics = topics::ALL.to_vec();
        topics.sort_unstable();
        topics.dedup();
        assert_eq!(topics.len(), topics::ALL.len());
        assert_eq!(stage("cosmos-writer"), Some(COSMOS_WRITER));
        assert_eq!(stage("cosmos"), None);
    }

    #[test]
    fn every_instance_of_every_stage_has_ports_of_its_own() {
        // The broker (9092), the Cosmos endpoint (8900) and the board (8000) of `contrail up` too.
        let mut ports = vec![9092, 8900, 8000];
        for stage in STAGES.iter().chain(&ROTATION_STAGES) {
            for index in 0..MAX_LOCAL_INSTANCES {
                ports.extend([stage.http_of(index), stage.grpc_of(index)]);
            }
        }
        let count = ports.len();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), count, "a port is shared");
        assert_eq!((DEDUP_STATE.http_of(0), DEDUP_STATE.grpc_of(2)), (8081, 9291));
    }
}
