//! Helpers for the Cosmos DB stages' tests: the dev endpoint as a real process, a realistic curated
//! stream computed from nycflights13 independently of dedup-state, the stages as real processes,
//! and a reader that checks documents through the ordinary `azure_data_cosmos` client.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use contrail_flight::document::flight_document;
use contrail_proto::v1::{FlightState, OperationalEvent};
use prost::Message as _;
use rdkafka::producer::Producer as _;

pub use crate::oracles::serving::{compare_documents, contract_differences, contract_documents};
use crate::{Probe, StageProcess, answers_200, free_port, http_get, workspace_binary};

/// The key every test process uses against the dev endpoint (which checks no signature).
pub const DEV_KEY: &str = "Y29udHJhaWwtZGV2LWtleQ==";

/// A running `cosmos-dev`.
pub struct CosmosDev {
    /// The process.
    pub process: StageProcess,
    /// `http://127.0.0.1:PORT/`.
    pub endpoint: String,
    /// The account key clients sign with.
    pub key: String,
}

impl CosmosDev {
    /// Starts the dev endpoint on a free port, logging into `dir`; it accepts any key.
    pub fn start(dir: &Path) -> Result<CosmosDev> {
        CosmosDev::start_with_key(dir, None)
    }

    /// Starts the dev endpoint; with `key`, requests must be signed with it, as the service
    /// checks.
    pub fn start_with_key(dir: &Path, key: Option<&str>) -> Result<CosmosDev> {
        std::fs::create_dir_all(dir)?;
        let port = free_port();
        let binary = workspace_binary("cosmos-dev")?;
        let mut env = vec![
            (
                "CONTRAIL_COSMOS_DEV_LISTEN".to_owned(),
                format!("127.0.0.1:{port}"),
            ),
            ("RUST_LOG".to_owned(), "warn".to_owned()),
        ];
        if let Some(key) = key {
            env.push(("CONTRAIL_COSMOS_DEV_KEY".to_owned(), key.to_owned()));
        }
        let mut process = StageProcess::spawn(&binary, &env, &dir.join("cosmos-dev.log"))?;
        let health = format!("http://127.0.0.1:{port}/_dev/healthz");
        process.wait_until(&format!("GET {health} → 200"), Duration::from_secs(60), || {
            Ok(answers_200(&health))
        })?;
        Ok(CosmosDev {
            process,
            endpoint: format!("http://127.0.0.1:{port}/"),
            key: key.unwrap_or(DEV_KEY).to_owned(),
        })
    }

    /// Replaces the account key (as regenerating it in Azure does): clients signing with the old
    /// one are refused from now on. [`CosmosDev::env`] and [`CosmosDev::containers`] use the new.
    pub fn rotate_key(&mut self, key: &str) -> Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let answer = runtime.block_on(
            reqwest::Client::new()
                .post(format!("{}_dev/key", self.endpoint))
                .body(key.to_owned())
                .send(),
        )?;
        if !answer.status().is_success() {
            bail!("rotating the key: {}", answer.status());
        }
        self.key = key.to_owned();
        Ok(())
    }

    /// The `[cosmos]` settings of a stage using this endpoint, as `CONTRAIL_COSMOS__*` variables.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("CONTRAIL_COSMOS__ENDPOINT".to_owned(), self.endpoint.clone()),
            ("CONTRAIL_COSMOS__KEY".to_owned(), self.key.clone()),
        ]
    }

    /// A client of this endpoint in the test process, with the containers created.
    pub async fn containers(&self) -> Result<contrail_cosmos::Containers> {
        containers_with_key(&self.endpoint, &self.key).await
    }
}

/// A client of the dev endpoint at `endpoint` (e.g. from another thread), with the containers
/// created.
pub async fn containers_at(endpoint: &str) -> Result<contrail_cosmos::Containers> {
    containers_with_key(endpoint, DEV_KEY).await
}

/// A client of the endpoint signing with `key`, with the containers created.
pub async fn containers_with_key(endpoint: &str, key: &str) -> Result<contrail_cosmos::Containers> {
    let config = contrail_cosmos::CosmosConfig {
        endpoint: endpoint.to_owned(),
        key: contrail_common::config::Secret::new(key),
        ..contrail_cosmos::CosmosConfig::default()
    };
    Ok(config.open("contrail-tests").await?)
}

/// A curated stream: for every flight of `events`, one `FlightState` per distinct accepted event
/// (duplicates by event id dropped), version k = the fold of the flight's first k events in
/// event-time order (the oracles' own model of the fold) — what dedup-state emits, computed
/// here without it. In arrival order; each
/// state carries the input position of the event that produced it (when the event has one).
pub fn curated_stream(events: &[OperationalEvent]) -> Vec<FlightState> {
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    let mut per_flight: HashMap<&str, Vec<&OperationalEvent>> = HashMap::new();
    let mut states = Vec::new();
    for event in events {
        if !seen.insert((event.flight_key.as_str(), event.event_id.as_str())) {
            continue;
        }
        let accepted = per_flight.entry(event.flight_key.as_str()).or_default();
        accepted.push(event);
        let mut state = crate::oracles::fold::folded_state(accepted);
        state.version = accepted.len() as u64;
        state.input = event.input.clone();
        states.push(state);
    }
    states
}

/// The highest version of each flight in `states`, with its document.
pub fn expected_documents(states: &[FlightState]) -> BTreeMap<String, serde_json::Value> {
    let mut expected: BTreeMap<String, (u64, serde_json::Value)> = BTreeMap::new();
    for state in states {
        let entry = expected
            .entry(state.flight_key.clone())
            .or_insert((0, serde_json::Value::Null));
        if state.version > entry.0 {
            *entry = (state.version, flight_document(state));
        }
    }
    expected
        .into_iter()
        .map(|(key, (_, document))| (key, document))
        .collect()
}

/// Produces `states` to `topic` keyed by flight key and waits for every acknowledgement.
pub fn produce_states(brokers: &str, topic: &str, states: &[FlightState]) -> Result<()> {
    let producer = crate::test_producer(brokers)?;
    for state in states {
        crate::send_waiting(&producer, topic, &state.flight_key, &state.encode_to_vec())?;
    }
    producer.flush(Duration::from_secs(60)).context("flush")?;
    Ok(())
}

/// Produces `predictions` to `topic` keyed by flight key and waits for every acknowledgement.
pub fn produce_predictions(
    brokers: &str,
    topic: &str,
    predictions: &[contrail_proto::v1::FlightPrediction],
) -> Result<()> {
    let producer = crate::test_producer(brokers)?;
    for prediction in predictions {
        crate::send_waiting(
            &producer,
            topic,
            &prediction.flight_key,
            &prediction.encode_to_vec(),
        )?;
    }
    producer.flush(Duration::from_secs(60)).context("flush")?;
    Ok(())
}

/// One document by point read (`None`: not found), system properties included.
pub async fn point_read(
    containers: &contrail_cosmos::Containers,
    key: &str,
) -> Result<Option<serde_json::Value>> {
    match containers.flights.read_item(key.to_owned(), key, None).await {
        Ok(response) => Ok(Some(response.into_model()?)),
        Err(error) if u16::from(error.status().status_code()) == 404 => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// Every document of the `flights` container, by id, without system properties: the ids a
/// cross-partition query lists plus `keys`, each read by point read. (The emulator's queries can
/// trail point reads by a few milliseconds right after writes: a query alone showed an older
/// version of a document just replaced, so contents always come from point reads.)
pub async fn read_documents<'a>(
    containers: &contrail_cosmos::Containers,
    keys: impl IntoIterator<Item = &'a String>,
) -> Result<BTreeMap<String, serde_json::Value>> {
    use futures::StreamExt;
    let mut items = containers
        .flights
        .query_items::<serde_json::Value>(
            "SELECT c.id FROM c",
            azure_data_cosmos::FeedScope::full_container(),
            None,
        )
        .await?;
    let mut ids: BTreeSet<String> = keys.into_iter().cloned().collect();
    let mut listed = 0usize;
    while let Some(item) = items.next().await {
        let item = item?;
        ids.insert(item["id"].as_str().unwrap_or_default().to_owned());
        listed += 1;
    }
    let mut documents = BTreeMap::new();
    for id in ids {
        if let Some(mut document) = point_read(containers, &id).await? {
            if let Some(object) = document.as_object_mut() {
                object.retain(|key, _| !key.starts_with('_'));
            }
            documents.insert(id, document);
        }
    }
    if listed > documents.len() {
        bail!(
            "the query lists {listed} documents but only {} ids exist: an id is stored twice",
            documents.len()
        );
    }
    Ok(documents)
}

/// Every document of the `flights` container by one cross-partition query, without system
/// properties (for large containers, where a point read per document is slow on the local
/// endpoint). Only after the writers settled: right after a write a query can trail point reads.
pub async fn query_documents(
    containers: &contrail_cosmos::Containers,
) -> Result<BTreeMap<String, serde_json::Value>> {
    use futures::StreamExt;
    let mut items = containers
        .flights
        .query_items::<serde_json::Value>(
            "SELECT * FROM c",
            azure_data_cosmos::FeedScope::full_container(),
            None,
        )
        .await?;
    let mut documents = BTreeMap::new();
    while let Some(item) = items.next().await {
        let mut document = item?;
        if let Some(object) = document.as_object_mut() {
            object.retain(|key, _| !key.starts_with('_'));
        }
        let id = document["id"].as_str().unwrap_or_default().to_owned();
        if documents.insert(id.clone(), document).is_some() {
            bail!("the query lists {id} twice: an id is stored twice");
        }
    }
    Ok(documents)
}

/// so a restart after `kill -9` gets its partitions back without waiting for the session timeout).
pub fn writer_env(brokers: &str, topic: &str, group: &str, dev: &CosmosDev) -> Vec<(String, String)> {
    let mut env = vec![
        ("CONTRAIL_KAFKA__BROKERS".to_owned(), brokers.to_owned()),
        ("CONTRAIL_TOPICS__CURATED".to_owned(), topic.to_owned()),
        ("CONTRAIL_TOPICS__DLQ".to_owned(), format!("{topic}.dlq")),
        ("CONTRAIL_GROUP__ID".to_owned(), group.to_owned()),
        ("CONTRAIL_GROUP__SESSION_TIMEOUT_MS".to_owned(), "6000".to_owned()),
        ("CONTRAIL_GROUP__STATIC_MEMBERSHIP".to_owned(), "true".to_owned()),
        ("CONTRAIL_INSTANCE".to_owned(), "cosmos-writer-0".to_owned()),
    ];
    env.extend(dev.env());
    env
}

/// Settings of changefeed-sync instance `instance` publishing to `topic`, with short lease timing
/// (renew 0.5 s, expiry 3 s, poll 0.2 s).
pub fn sync_env(brokers: &str, topic: &str, instance: &str, dev: &CosmosDev) -> Vec<(String, String)> {
    let mut env = vec![
        ("CONTRAIL_KAFKA__BROKERS".to_owned(), brokers.to_owned()),
        ("CONTRAIL_TOPICS__CHANGES".to_owned(), topic.to_owned()),
        ("CONTRAIL_INSTANCE".to_owned(), instance.to_owned()),
        ("CONTRAIL_LEASES__RENEW_INTERVAL_MS".to_owned(), "500".to_owned()),
        ("CONTRAIL_LEASES__EXPIRY_MS".to_owned(), "3000".to_owned()),
        ("CONTRAIL_LEASES__POLL_INTERVAL_MS".to_owned(), "200".to_owned()),
    ];
    env.extend(dev.env());
    env
}

/// A stage process (cosmos-writer or changefeed-sync) with its admin API.
pub struct CosmosStage {
    /// The process.
    pub process: StageProcess,
    /// Binary name.
    pub binary: String,
    /// `http://127.0.0.1:PORT`.
    pub http_url: String,
    /// `http://127.0.0.1:PORT` of the admin API.
    pub grpc_url: String,
    env: Vec<(String, String)>,
    log: PathBuf,
}

impl CosmosStage {
    /// Starts `binary` with `env` (plus listen addresses) and waits for readiness.
    pub fn start(binary: &str, env: Vec<(String, String)>, dir: &Path) -> Result<CosmosStage> {
        std::fs::create_dir_all(dir)?;
        let http_port = free_port();
        let grpc_port = free_port();
        let mut env = env;
        env.push((
            "CONTRAIL_LISTEN__HTTP".to_owned(),
            format!("127.0.0.1:{http_port}"),
        ));
        env.push((
            "CONTRAIL_LISTEN__GRPC".to_owned(),
            format!("127.0.0.1:{grpc_port}"),
        ));
        if !env.iter().any(|(key, _)| key == "RUST_LOG") {
            env.push(("RUST_LOG".to_owned(), "info".to_owned()));
        }
        let log = dir.join(format!("{binary}.log"));
        let process = StageProcess::spawn(&workspace_binary(binary)?, &env, &log)?;
        let mut stage = CosmosStage {
            process,
            binary: binary.to_owned(),
            http_url: format!("http://127.0.0.1:{http_port}"),
            grpc_url: format!("http://127.0.0.1:{grpc_port}"),
            env,
            log,
        };
        stage.wait_ready()?;
        Ok(stage)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let url = format!("{}/readyz", self.http_url);
        self.process
            .wait_until(&format!("GET {url} → 200"), Duration::from_secs(120), || {
                Ok(answers_200(&url))
            })
    }

    /// SIGTERM, then start again with `changes` to its settings (a redeployment).
    pub fn redeploy(&mut self, changes: &[(&str, &str)]) -> Result<()> {
        self.process.terminate(Duration::from_secs(60))?;
        for (key, value) in changes {
            self.env.retain(|(existing, _)| existing != key);
            self.env.push(((*key).to_owned(), (*value).to_owned()));
        }
        self.process = StageProcess::spawn(&workspace_binary(&self.binary)?, &self.env, &self.log)?;
        self.wait_ready()
    }

    /// Starts the stage again with the same settings after it stopped, waiting only for its admin
    /// API to answer (not for readiness: a stage holding a partition at a gap is not ready).
    pub fn start_again(&mut self) -> Result<()> {
        self.process = StageProcess::spawn(&workspace_binary(&self.binary)?, &self.env, &self.log)?;
        let grpc_url = self.grpc_url.clone();
        self.process
            .wait_until("the admin API answers Status", Duration::from_secs(120), || {
                Ok(match status_at(&grpc_url) {
                    Ok(_) => Probe::Ready(()),
                    Err(error) => Probe::NotYet(format!("{error:#}")),
                })
            })
    }

    /// `kill -9` and start again with the same settings.
    pub fn restart_after_kill9(&mut self) -> Result<()> {
        self.process.kill9();
        self.process = StageProcess::spawn(&workspace_binary(&self.binary)?, &self.env, &self.log)?;
        self.wait_ready()
    }

    /// Waits until the stage holds a partition of `topic` at a gap and checks that every channel
    /// reports it: readiness 503 naming the held partition, `contrail_consumer_gap_held` 1 for the
    /// topic, an ERROR `GAP:` log line naming the topic. Returns the gap from the admin status.
    pub fn wait_gap_reported(&mut self, topic: &str) -> Result<contrail_proto::admin::v1::GapStatus> {
        let grpc_url = self.grpc_url.clone();
        let gap = self
            .process
            .wait_gap_held(Duration::from_secs(120), || status_at(&grpc_url))?;
        let answer = http_get(&format!("{}/readyz", self.http_url))?;
        if !(answer.starts_with("HTTP/1.1 503") && answer.contains("1 partition(s) held at a gap")) {
            bail!("not ready, saying why, while a partition is held: {answer}");
        }
        let held = self.metric("contrail_consumer_gap_held", &format!("topic=\"{topic}\""));
        if held != 1.0 {
            bail!(
                "contrail_consumer_gap_held for {topic} is {held}:\n{}",
                self.metrics_text()
            );
        }
        if !self
            .log_text()
            .lines()
            .any(|line| line.contains("ERROR") && line.contains("GAP:") && line.contains(topic))
        {
            bail!("no ERROR log names the gap on {topic}");
        }
        Ok(gap)
    }

    /// Accepts the gap held on `topic`'s `partition` as an operator does: `contrail admin --addr …
    /// accept-gap --topic T --partition P` (the stage's admin API without a token). Fails unless
    /// the command succeeds and says it accepted the gap.
    pub fn accept_gap_with_cli(&self, topic: &str, partition: i32) -> Result<String> {
        let output = std::process::Command::new(workspace_binary("contrail")?)
            .args(["admin", "--addr", &self.grpc_url, "accept-gap", "--topic", topic])
            .args(["--partition", &partition.to_string()])
            .output()
            .context("running contrail admin accept-gap")?;
        let said = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() || !said.contains("accepted the gap") {
            bail!(
                "contrail admin accept-gap ({}): {said}{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(said)
    }

    /// The admin API's status.
    pub fn status(&self) -> Result<contrail_proto::admin::v1::StatusResponse> {
        status_at(&self.grpc_url)
    }

    /// Waits until a consuming stage has committed every partition of `topic` up to its end. The
    /// ends are read from the topic here (`records` = how many it holds): the local broker's
    /// high watermarks (ListOffsets) were seen below offsets already committed, so the stage's own
    /// lag cannot tell "caught up".
    pub fn wait_committed(
        &mut self,
        brokers: &str,
        topic: &str,
        records: usize,
        timeout: Duration,
    ) -> Result<()> {
        let ends = crate::harness::topic::topic_ends(brokers, topic, records)?
            .into_iter()
            .map(|(partition, end)| ((topic.to_owned(), partition), end))
            .collect();
        self.wait_positions(&ends, timeout)
    }

    /// Waits until the stage's admin `Status` reports every `(topic, partition)` of `ends`
    /// committed up to (at least) its end offset.
    pub fn wait_positions(&mut self, ends: &BTreeMap<(String, i32), i64>, timeout: Duration) -> Result<()> {
        let grpc_url = self.grpc_url.clone();
        self.process.wait_until(
            &format!("every partition committed up to {ends:?}"),
            timeout,
            || {
                let status = match status_at(&grpc_url) {
                    Ok(status) => status,
                    Err(error) => return Ok(Probe::NotYet(format!("admin Status: {error:#}"))),
                };
                let committed: BTreeMap<(String, i32), i64> = status
                    .partitions
                    .iter()
                    .map(|p| ((p.topic.clone(), p.partition), p.committed_offset))
                    .collect();
                if ends.iter().all(|(key, end)| committed.get(key) >= Some(end)) {
                    Ok(Probe::Ready(()))
                } else {
                    Ok(Probe::NotYet(format!("committed {committed:?}")))
                }
            },
        )
    }

    /// What the stage logged so far (every start of it).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The `/metrics` text.
    pub fn metrics_text(&self) -> String {
        http_get(&format!("{}/metrics", self.http_url)).unwrap_or_default()
    }

    /// A metric's value from `/metrics` (sum over label sets whose line contains `filter`).
    pub fn metric(&self, name: &str, filter: &str) -> f64 {
        metric_at(&self.http_url, name, filter)
    }
}

/// A metric's value from `{http_url}/metrics` (sum over label sets whose line contains `filter`;
/// 0 when the endpoint does not answer).
pub fn metric_at(http_url: &str, name: &str, filter: &str) -> f64 {
    http_get(&format!("{http_url}/metrics"))
        .unwrap_or_default()
        .lines()
        .filter(|line| line.starts_with(name) && line.contains(filter))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The admin `Status` of the stage whose gRPC server is at `grpc_url`.
pub fn status_at(grpc_url: &str) -> Result<contrail_proto::admin::v1::StatusResponse> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut client =
            contrail_proto::admin::v1::admin_service_client::AdminServiceClient::connect(grpc_url.to_owned())
                .await?;
        Ok(client
            .status(contrail_proto::admin::v1::StatusRequest {})
            .await?
            .into_inner())
    })
}

/// Differences between the container of `dev`, read back through the ordinary client from this
/// process, and `expected` ([`contract_documents`]). Reads from another client are
/// session-consistent, not strong: a replace acknowledged to a writer may show up a moment later
/// here, so the comparison is repeated until it holds, for up to 20 s, before the differences
/// count.
pub fn contract_problems(dev: &CosmosDev, expected: &BTreeMap<String, serde_json::Value>) -> Vec<String> {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let containers = dev.containers().await.expect("client");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let actual = read_documents(&containers, expected.keys())
                .await
                .expect("read documents");
            let problems = contract_differences(&actual, expected);
            if problems.is_empty() || Instant::now() > deadline {
                return problems;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}
