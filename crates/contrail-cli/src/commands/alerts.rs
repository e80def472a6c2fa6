//! `contrail alerts tail`: follow the alerts topic — each alert as it is raised and as it is
//! resolved — as text lines or JSON lines.
//!
//! The topic may hold byte-identical copies of an alert (dedup-state re-sends its outbox after a
//! restart; the topic is at-least-once, the Delta `alerts` table exactly-once): each
//! `(alert id, state)` is printed once per run.

use std::collections::{BTreeMap, HashSet};
use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chrono::DateTime;
use clap::{Args, Subcommand};
use contrail_common::kafka::KafkaConfig;
use contrail_proto::v1::{Alert, AlertState};
use prost::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde_json::{Value, json};

/// Options of `contrail alerts`.
#[derive(Args, Debug)]
pub struct AlertsArgs {
    #[command(flatten)]
    kafka: crate::args::KafkaArgs,
    /// Port offset of a `contrail up --port-offset N` platform.
    #[arg(long, default_value_t = 0, env = "CONTRAIL_PORT_OFFSET")]
    port_offset: u16,
    /// The alerts topic.
    #[arg(long, default_value = contrail_common::topology::topics::ALERTS, env = "CONTRAIL_TOPICS__ALERTS")]
    topic: String,
    #[command(subcommand)]
    command: AlertsCommand,
}

#[derive(Subcommand, Debug)]
enum AlertsCommand {
    /// Print alerts as they are raised and resolved, until Ctrl-C.
    Tail {
        /// One JSON object per line (alert_id, kind, state, flight_key, fired_at, resolved_at,
        /// resolution, message; times in RFC 3339, UTC).
        #[arg(long)]
        json: bool,
        /// Start at the first alert the topic holds instead of new alerts only.
        #[arg(long)]
        from_beginning: bool,
        /// Stop at the end of the topic instead of waiting for more (with `--from-beginning`:
        /// every alert so far, then exit): once every partition's end is read and nothing more
        /// arrived for 2 s.
        #[arg(long)]
        no_follow: bool,
        /// Only alerts of flights whose key contains this text (e.g. `UA1545`, or `--flight=-EWR`).
        #[arg(long)]
        flight: Option<String>,
    },
}

/// Runs `contrail alerts`.
pub async fn run(args: AlertsArgs) -> Result<()> {
    let AlertsCommand::Tail {
        json,
        from_beginning,
        no_follow,
        flight,
    } = args.command;
    let kafka = args.kafka.config(args.port_offset);
    let topic = args.topic.clone();
    tokio::task::spawn_blocking(move || {
        tail(
            &kafka,
            &topic,
            &Tail {
                json,
                from_beginning,
                follow: !no_follow,
                flight,
            },
        )
    })
    .await
    .context("the alerts reader stopped")?
}

/// With `--no-follow`: how long nothing must arrive after the reported ends are read.
const NO_FOLLOW_IDLE: Duration = Duration::from_secs(2);

struct Tail {
    json: bool,
    from_beginning: bool,
    follow: bool,
    flight: Option<String>,
}

fn tail(kafka: &KafkaConfig, topic: &str, options: &Tail) -> Result<()> {
    let where_ = crate::args::describe(kafka);
    let consumer: BaseConsumer = kafka
        .client_config("contrail-alerts")?
        .set("group.id", "contrail-alerts-tail")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .with_context(|| format!("a Kafka client for {where_}"))?;
    let partitions = crate::args::partition_ends(&consumer, kafka, topic)?;
    // Where each partition ends now: the end of `--no-follow`.
    let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
    let mut assignment = TopicPartitionList::new();
    for (partition, low, high) in partitions {
        let start = if options.from_beginning { low } else { high };
        if start < high {
            ends.insert(partition, high);
        }
        assignment.add_partition_offset(topic, partition, Offset::Offset(start))?;
    }
    consumer.assign(&assignment)?;
    let mut printed: HashSet<(String, i32)> = HashSet::new();
    let mut stdout = std::io::stdout().lock();
    let mut last_record = Instant::now();
    loop {
        // The end offsets a broker reports can trail what it already served (the local broker's
        // were seen to), so the end is also "nothing more for a while".
        if !options.follow && ends.is_empty() && last_record.elapsed() >= NO_FOLLOW_IDLE {
            return Ok(());
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => {
                last_record = Instant::now();
                if ends
                    .get(&message.partition())
                    .is_some_and(|end| message.offset() + 1 >= *end)
                {
                    ends.remove(&message.partition());
                }
                let alert = match Alert::decode(message.payload().unwrap_or_default()) {
                    Ok(alert) => alert,
                    Err(error) => {
                        eprintln!(
                            "contrail: {topic} partition {} offset {}: not an Alert ({error}); skipped",
                            message.partition(),
                            message.offset()
                        );
                        continue;
                    }
                };
                if options
                    .flight
                    .as_deref()
                    .is_some_and(|text| !alert.flight_key.contains(text))
                {
                    continue;
                }
                if !printed.insert((alert.alert_id.clone(), alert.state)) {
                    continue;
                }
                let line = if options.json {
                    to_json(&alert).to_string()
                } else {
                    to_text(&alert)
                };
                if writeln!(stdout, "{line}").and_then(|()| stdout.flush()).is_err() {
                    // The reader went away (`| head`): done.
                    return Ok(());
                }
            }
            Some(Err(error)) => bail!("reading {topic} from {where_}: {error}"),
            None => {
                if !options.follow && last_record.elapsed() > Duration::from_secs(60) {
                    bail!(
                        "{topic}: nothing arrived for 60 s with partitions {:?} short of their end",
                        ends.keys().collect::<Vec<_>>()
                    );
                }
            }
        }
    }
}

fn utc(micros: i64) -> Option<String> {
    DateTime::from_timestamp_micros(micros).map(|time| time.format("%Y-%m-%dT%H:%M:%SZ").to_string())
}

fn state_name(alert: &Alert) -> &'static str {
    match alert.state() {
        AlertState::Firing => "FIRING",
        AlertState::Resolved => "RESOLVED",
    }
}

/// One JSON line.
pub fn to_json(alert: &Alert) -> Value {
    let resolved = alert.state() == AlertState::Resolved;
    json!({
        "alert_id": alert.alert_id,
        "kind": alert.kind,
        "state": state_name(alert),
        "flight_key": alert.flight_key,
        "fired_at": utc(alert.fired_at_us),
        "resolved_at": if resolved { utc(alert.resolved_at_us) } else { None },
        "resolution": if resolved { Some(alert.resolution.as_str()) } else { None },
        "message": alert.message,
    })
}

/// One text line: `fired_at  STATE  kind  flight  message`.
pub fn to_text(alert: &Alert) -> String {
    let when = match alert.state() {
        AlertState::Firing => utc(alert.fired_at_us),
        AlertState::Resolved => utc(alert.resolved_at_us),
    }
    .unwrap_or_else(|| "?".to_owned());
    format!(
        "{when}  {:<8}  {:<17}  {:<24}  {}",
        state_name(alert),
        alert.kind,
        alert.flight_key,
        alert.message
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raised_and_a_resolved_alert_print_their_times_in_utc() {
        let raised = Alert {
            alert_id: "UA1545-2013-01-01-EWR/DEPARTURE_OVERDUE".to_owned(),
            kind: "DEPARTURE_OVERDUE".to_owned(),
            flight_key: "UA1545-2013-01-01-EWR".to_owned(),
            fired_at_us: 1_357_050_600_000_000,
            message: "UA1545-2013-01-01-EWR has not left the gate 15 minutes after its scheduled departure"
                .to_owned(),
            ..Alert::default()
        };
        let text = to_text(&raised);
        assert!(text.starts_with("2013-01-01T14:30:00Z  FIRING "), "{text}");
        assert_eq!(to_json(&raised)["resolved_at"], Value::Null);
        let resolved = Alert {
            state: AlertState::Resolved as i32,
            resolved_at_us: 1_357_051_500_000_000,
            resolution: "DEPARTED".to_owned(),
            ..raised
        };
        let json = to_json(&resolved);
        assert_eq!(json["state"], "RESOLVED");
        assert_eq!(json["fired_at"], "2013-01-01T14:30:00Z");
        assert_eq!(json["resolved_at"], "2013-01-01T14:45:00Z");
        assert_eq!(json["resolution"], "DEPARTED");
        assert!(to_text(&resolved).starts_with("2013-01-01T14:45:00Z  RESOLVED"));
    }
}
