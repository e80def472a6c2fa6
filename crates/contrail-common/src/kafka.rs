//! Kafka client settings: a plain broker list, or the Azure Event Hubs profile.
//!
//! Event Hubs' Kafka endpoint needs SASL_SSL/PLAIN with the literal user name `$ConnectionString`
//! and the namespace connection string as password, a 60 s request timeout, metadata refreshed
//! before its 240 s idle close, TCP keepalive, requests under 1,046,528 bytes, and no compression but
//! gzip. [`KafkaConfig::client_config`] applies exactly that when a connection string is configured,
//! and refuses explicit properties that Event Hubs would reject.

use std::collections::BTreeMap;

use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize};

use crate::CommonError;
use crate::config::Secret;

/// Largest message Event Hubs accepts on its Kafka endpoint is 1,046,528 bytes; stay below.
pub const EVENT_HUBS_MAX_MESSAGE_BYTES: u32 = 1_000_000;
/// librdkafka's default `message.max.bytes`: the largest message a producer sends.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1_000_000;

/// How long a partition must stay quiet past the end the broker reported before a read "to the
/// end" takes its end as found: a reported end can trail the log (the local broker reports the
/// first offset of a partition's last batch + 1), so the records past it are read, not trusted
/// away. Shared by `contrail` (backfill, settling) and the tests.
pub const QUIET_PAST_END: std::time::Duration = std::time::Duration::from_millis(1_500);

/// How a stage reaches its Kafka-protocol broker. Its `Debug` and `Serialize` (the effective
/// configuration printed at start-up and by `--print-config`) redact every property whose name
/// says it holds a secret ([`is_secret_property`]).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap servers, `host:port[,host:port…]`. Ignored when `event_hubs_connection_string` is
    /// set (the namespace host is taken from it).
    pub brokers: String,
    /// Azure Event Hubs namespace connection string
    /// (`Endpoint=sb://NAMESPACE.servicebus.windows.net/;SharedAccessKeyName=…;SharedAccessKey=…`).
    /// Setting it selects the Event Hubs profile.
    pub event_hubs_connection_string: Secret,
    /// `client.id`; defaults to the stage name.
    pub client_id: String,
    /// Extra librdkafka properties, applied last (e.g. `"linger.ms" = "10"`).
    #[serde(serialize_with = "serialize_redacted")]
    pub properties: BTreeMap<String, String>,
}

/// Whether librdkafka property `name` holds a secret (`sasl.password`, `ssl.key.password`,
/// `ssl.key.pem`, `sasl.oauthbearer.client.secret`, `sasl.oauthbearer.config`, …): any dotted
/// segment naming a password, secret, token, credential or key, and the free-form SASL configs.
pub fn is_secret_property(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name == "sasl.oauthbearer.config"
        || name == "sasl.jaas.config"
        || name.split(['.', '_']).any(|segment| {
            segment == "key"
                || ["password", "secret", "token", "credential", "pem"]
                    .iter()
                    .any(|word| segment.contains(word))
        })
}

/// The properties as they may be shown: secret values replaced by `<redacted>`.
fn redacted(properties: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    properties
        .iter()
        .map(|(name, value)| {
            let shown = if is_secret_property(name) && !value.is_empty() {
                "<redacted>"
            } else {
                value.as_str()
            };
            (name.as_str(), shown)
        })
        .collect()
}

fn serialize_redacted<S: serde::Serializer>(
    properties: &BTreeMap<String, String>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(redacted(properties))
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("event_hubs_connection_string", &self.event_hubs_connection_string)
            .field("client_id", &self.client_id)
            .field("properties", &redacted(&self.properties))
            .finish()
    }
}

impl KafkaConfig {
    /// The largest message this stage's producers send (`message.max.bytes`: the property when
    /// set, else 1,000,000 — librdkafka's default and the Event Hubs profile's value). Every
    /// record a stage writes, dead letters included, must fit in it.
    pub fn max_message_bytes(&self) -> usize {
        self.properties
            .get("message.max.bytes")
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(DEFAULT_MAX_MESSAGE_BYTES)
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: "127.0.0.1:9092".to_owned(),
            event_hubs_connection_string: Secret::default(),
            client_id: String::new(),
            properties: BTreeMap::new(),
        }
    }
}

/// Consumer group membership of a consuming stage (`[group]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupConfig {
    /// `group.id`.
    pub id: String,
    /// Static membership: `group.instance.id` = the stage's `instance`, so a restarting pod gets its
    /// partitions back without a rebalance (Event Hubs and Kubernetes StatefulSets: on).
    pub static_membership: bool,
    /// `session.timeout.ms`: how long a silent member keeps its partitions.
    pub session_timeout_ms: u64,
    /// `partition.assignment.strategy`: `cooperative-sticky` (incremental) or `range`/`roundrobin`.
    pub assignment_strategy: String,
}

impl GroupConfig {
    /// The defaults with group id `id`.
    pub fn with_id(id: &str) -> GroupConfig {
        GroupConfig {
            id: id.to_owned(),
            static_membership: false,
            session_timeout_ms: 10_000,
            assignment_strategy: "cooperative-sticky".to_owned(),
        }
    }
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig::with_id("contrail")
    }
}

/// A partition's lag for admin status: high watermark − next offset to process (`next` < 0: nothing
/// processed yet, i.e. 0). -1 when unknown: no high watermark, or one *below* the next offset — a
/// broker answering wrongly (seen with the local broker), which must not read as "caught up".
pub fn partition_lag(high_watermark: i64, next: i64) -> i64 {
    let next = next.max(0);
    if high_watermark < next {
        -1
    } else {
        high_watermark - next
    }
}

/// The namespace host of an Event Hubs connection string: `Endpoint=sb://HOST/;…` → `HOST`.
pub fn event_hubs_host(connection_string: &str) -> Result<String, CommonError> {
    let endpoint = connection_string
        .split(';')
        .filter_map(|part| part.split_once('='))
        .find(|(key, _)| key.trim().eq_ignore_ascii_case("Endpoint"))
        .map(|(_, value)| value.trim())
        .ok_or_else(|| {
            CommonError::Kafka(
                "event_hubs_connection_string has no `Endpoint=sb://NAMESPACE.servicebus.windows.net/` part"
                    .to_owned(),
            )
        })?;
    let host = endpoint
        .strip_prefix("sb://")
        .ok_or_else(|| {
            CommonError::Kafka(format!(
                "event_hubs_connection_string Endpoint {endpoint:?} must start with sb://"
            ))
        })?
        .trim_end_matches('/');
    if host.is_empty() || host.contains('/') {
        return Err(CommonError::Kafka(format!(
            "event_hubs_connection_string Endpoint {endpoint:?} has no host name"
        )));
    }
    Ok(host.to_owned())
}

impl KafkaConfig {
    /// Whether the Event Hubs profile is selected.
    pub fn is_event_hubs(&self) -> bool {
        !self.event_hubs_connection_string.is_empty()
    }

    /// librdkafka settings for a client of `stage`. Producer/consumer specifics are added by the
    /// caller; `properties` are applied last and may override anything but the Event Hubs limits.
    pub fn client_config(&self, stage: &str) -> Result<ClientConfig, CommonError> {
        let mut config = ClientConfig::new();
        let client_id = if self.client_id.is_empty() {
            stage
        } else {
            &self.client_id
        };
        config.set("client.id", client_id);
        if self.is_event_hubs() {
            let connection_string = self.event_hubs_connection_string.expose();
            let host = event_hubs_host(connection_string)?;
            config
                .set("bootstrap.servers", format!("{host}:9093"))
                .set("security.protocol", "SASL_SSL")
                .set("sasl.mechanism", "PLAIN")
                .set("sasl.username", "$ConnectionString")
                .set("sasl.password", connection_string)
                .set("request.timeout.ms", "60000")
                .set("metadata.max.age.ms", "180000")
                .set("socket.keepalive.enable", "true")
                .set("message.max.bytes", EVENT_HUBS_MAX_MESSAGE_BYTES.to_string())
                .set("compression.codec", "none");
        } else {
            if self.brokers.trim().is_empty() {
                return Err(CommonError::Kafka("kafka.brokers is empty".to_owned()));
            }
            config.set("bootstrap.servers", &self.brokers);
        }
        for (key, value) in &self.properties {
            if self.is_event_hubs() {
                check_event_hubs_property(key, value)?;
            }
            config.set(key, value);
        }
        Ok(config)
    }

    /// A group-less client of `stage` for partition high watermarks (lag in admin status).
    pub fn watermark_client(&self, stage: &str) -> Result<rdkafka::consumer::BaseConsumer, CommonError> {
        self.client_config(&format!("{stage}-metadata"))?
            .create()
            .map_err(|error| CommonError::Kafka(format!("metadata client: {error}")))
    }

    /// librdkafka settings of an idempotent producer of `stage` (`acks=all`, 5 ms linger,
    /// 5-minute delivery timeout), then `properties`.
    pub fn producer_config(&self, stage: &str) -> Result<ClientConfig, CommonError> {
        let mut client = self.client_config(stage)?;
        client
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "300000");
        for (key, value) in &self.properties {
            client.set(key, value);
        }
        Ok(client)
    }

    /// librdkafka settings of a group consumer of `stage` whose offsets the stage manages itself
    /// (no auto-commit, no auto offset store; new groups start at the earliest offset). A fetch
    /// waits at most 100 ms for data (librdkafka's default is 500 ms): a broker that holds a fetch
    /// to its limit even when records are there (the local tansu does) then delays records by
    /// ≤ 100 ms, not ≤ 500 ms — measured: dedup-state's p50 from raw append to `FlightState` went
    /// from 157 ms to 16 ms at 10 ms (docs/BENCHMARKS.md). Brokers that answer as soon as data
    /// arrives (Kafka, Event Hubs) only poll an idle partition more often.
    pub fn consumer_config(
        &self,
        stage: &str,
        group: &GroupConfig,
        instance: &str,
    ) -> Result<ClientConfig, CommonError> {
        let mut client = self.client_config(stage)?;
        client
            .set("group.id", &group.id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", group.session_timeout_ms.to_string())
            .set("partition.assignment.strategy", &group.assignment_strategy)
            .set("enable.partition.eof", "false")
            .set("fetch.wait.max.ms", "100");
        if group.static_membership {
            client.set("group.instance.id", instance);
        }
        for (key, value) in &self.properties {
            client.set(key, value);
        }
        Ok(client)
    }
}

/// Creates the topics that do not exist yet (local development; against Event Hubs topics are
/// created through Azure, so stages call this only when told to).
pub async fn create_topics(
    kafka: &KafkaConfig,
    stage: &str,
    names: &[&str],
    partitions: i32,
) -> Result<(), CommonError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> =
        kafka
            .client_config(&format!("{stage}-admin"))?
            .create()
            .map_err(|error| CommonError::Kafka(format!("admin client: {error}")))?;
    let new_topics: Vec<NewTopic> = names
        .iter()
        .map(|name| NewTopic::new(name, partitions, TopicReplication::Fixed(1)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(std::time::Duration::from_secs(10)));
    let results = admin
        .create_topics(&new_topics, &options)
        .await
        .map_err(|error| CommonError::Kafka(format!("create topics: {error}")))?;
    for result in results {
        match result {
            Ok(topic) => tracing::info!(%topic, partitions, "topic created"),
            Err((topic, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {
                tracing::debug!(%topic, "topic exists");
            }
            Err((topic, code)) => return Err(CommonError::Kafka(format!("create topic {topic}: {code}"))),
        }
    }
    Ok(())
}

fn check_event_hubs_property(key: &str, value: &str) -> Result<(), CommonError> {
    let compression_keys = ["compression.codec", "compression.type"];
    if compression_keys.contains(&key) && !matches!(value, "none" | "gzip") {
        return Err(CommonError::Kafka(format!(
            "kafka.properties.{key} = {value:?}: Event Hubs accepts only none or gzip"
        )));
    }
    if key == "message.max.bytes" {
        let too_large = value.parse::<u64>().map_or(true, |bytes| bytes >= 1_046_528);
        if too_large {
            return Err(CommonError::Kafka(format!(
                "kafka.properties.message.max.bytes = {value:?}: Event Hubs needs less than 1046528"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_properties_are_redacted_when_printed_or_logged() {
        let mut config = KafkaConfig::default();
        for (name, value) in [
            ("sasl.password", "hunter2-sasl"),
            ("ssl.key.password", "hunter2-ssl"),
            ("ssl.key.pem", "-----BEGIN PRIVATE KEY-----hunter2"),
            ("sasl.oauthbearer.client.secret", "hunter2-oauth"),
            ("sasl.oauthbearer.config", "principal=x secret=hunter2"),
            ("SASL.PASSWORD", "hunter2-upper"),
            ("linger.ms", "10"),
            ("sasl.username", "$ConnectionString"),
        ] {
            config.properties.insert(name.to_owned(), value.to_owned());
        }
        let printed = crate::config::render_effective(&config);
        let debugged = format!("{config:?}");
        for shown in [&printed, &debugged] {
            assert!(!shown.contains("hunter2"), "a secret is shown:\n{shown}");
            assert!(shown.contains("<redacted>"), "{shown}");
            assert!(shown.contains("linger.ms") && shown.contains("10"), "{shown}");
            assert!(shown.contains("$ConnectionString"), "non-secrets stay: {shown}");
        }
        // The values themselves are untouched: librdkafka gets them.
        assert_eq!(config.properties["sasl.password"], "hunter2-sasl");
        for name in [
            "bootstrap.servers",
            "linger.ms",
            "compression.codec",
            "sasl.mechanism",
            "enable.idempotence",
        ] {
            assert!(!is_secret_property(name), "{name}");
        }
    }

    const CONNECTION: &str = "Endpoint=sb://contrail-prod.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=c2VjcmV0";

    #[test]
    fn lag_is_unknown_when_the_broker_answers_below_the_position() {
        assert_eq!(partition_lag(100, 40), 60);
        assert_eq!(partition_lag(100, -1), 100);
        assert_eq!(partition_lag(100, 100), 0);
        assert_eq!(partition_lag(1, 4_623), -1);
        assert_eq!(partition_lag(-1, 5), -1);
    }

    #[test]
    fn plain_brokers() {
        let config = KafkaConfig::default().client_config("ingest").expect("valid");
        assert_eq!(config.get("bootstrap.servers"), Some("127.0.0.1:9092"));
        assert_eq!(config.get("client.id"), Some("ingest"));
        assert_eq!(config.get("security.protocol"), None);
    }

    #[test]
    fn event_hubs_profile_from_connection_string() {
        let kafka = KafkaConfig {
            event_hubs_connection_string: Secret::new(CONNECTION),
            ..KafkaConfig::default()
        };
        let config = kafka.client_config("dedup-state").expect("valid");
        assert_eq!(
            config.get("bootstrap.servers"),
            Some("contrail-prod.servicebus.windows.net:9093")
        );
        assert_eq!(config.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(config.get("sasl.mechanism"), Some("PLAIN"));
        assert_eq!(config.get("sasl.username"), Some("$ConnectionString"));
        assert_eq!(config.get("sasl.password"), Some(CONNECTION));
        assert_eq!(config.get("request.timeout.ms"), Some("60000"));
        assert_eq!(config.get("metadata.max.age.ms"), Some("180000"));
        assert_eq!(config.get("socket.keepalive.enable"), Some("true"));
        assert_eq!(config.get("message.max.bytes"), Some("1000000"));
        assert!(
            !format!("{kafka:?}").contains("c2VjcmV0"),
            "secret leaked into Debug"
        );
    }

    #[test]
    fn event_hubs_rejects_unsupported_properties() {
        let mut kafka = KafkaConfig {
            event_hubs_connection_string: Secret::new(CONNECTION),
            ..KafkaConfig::default()
        };
        kafka.properties.insert("compression.codec".into(), "lz4".into());
        let error = kafka.client_config("ingest").expect_err("lz4");
        assert!(error.to_string().contains("lz4"));
        kafka.properties.clear();
        kafka
            .properties
            .insert("message.max.bytes".into(), "2000000".into());
        assert!(kafka.client_config("ingest").is_err());
    }

    #[test]
    fn bad_connection_strings_are_named() {
        assert!(event_hubs_host("SharedAccessKey=x").is_err());
        let error = event_hubs_host("Endpoint=https://x.servicebus.windows.net/").expect_err("scheme");
        assert!(error.to_string().contains("sb://"));
        assert_eq!(
            event_hubs_host(CONNECTION).expect("ok"),
            "contrail-prod.servicebus.windows.net"
        );
    }
}
