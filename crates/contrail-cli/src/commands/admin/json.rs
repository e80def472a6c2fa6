//! `--json` output of `contrail admin`: one object per stage, every field.

use anyhow::Result;
use contrail_proto::admin::v1 as admin;
use serde_json::{Value, json};

use super::fields::{format_micros, parse_state, total_lag};
use super::target::{Stage, Target};

/// One stage's line of `status --json` without a stage.
pub(super) fn summary_json(stage: Stage, url: &str, answer: &Result<admin::StatusResponse>) -> Value {
    let target = Target {
        stage: Some(stage),
        url: url.to_owned(),
    };
    match answer {
        Ok(status) => {
            let mut row = with_fields(&target, status_json(status));
            if let Value::Object(fields) = &mut row {
                fields.insert("up".to_owned(), json!(true));
            }
            row
        }
        Err(error) => {
            let mut fields = target.json_fields();
            fields.insert("up".to_owned(), json!(false));
            fields.insert("error".to_owned(), json!(format!("{error:#}")));
            Value::Object(fields)
        }
    }
}

/// `target`'s `stage` and `address`, then `answer`'s fields, which win on a clash (a stage reports
/// its own `stage`) — but for an extension's deployment, which runs a pipeline stage's binary
/// (`rotation` is dedup-state): its `stage` stays the deployment's name and the report is kept as
/// `binary`.
pub(super) fn with_fields(target: &Target, answer: Value) -> Value {
    let mut fields = target.json_fields();
    if let Value::Object(mut answer_fields) = answer {
        let binary = answer_fields
            .get("stage")
            .and_then(Value::as_str)
            .and_then(|reported| target.extension_binary(reported))
            .map(str::to_owned);
        if let Some(binary) = binary {
            answer_fields.remove("stage");
            fields.insert("binary".to_owned(), json!(binary));
        }
        fields.extend(answer_fields);
    }
    Value::Object(fields)
}

/// Every field of a `StatusResponse`, plus the partition count and total lag.
pub(super) fn status_json(status: &admin::StatusResponse) -> Value {
    let counters: serde_json::Map<String, Value> = status
        .counters
        .iter()
        .map(|(name, value)| (name.clone(), json!(value)))
        .collect();
    let partitions: Vec<Value> = status.partitions.iter().map(partition_json).collect();
    let sources: Vec<Value> = status
        .sources
        .iter()
        .map(|source| {
            json!({
                "name": source.name,
                "cursor": source.cursor,
                "events_fetched": source.events_fetched,
                "pages_fetched": source.pages_fetched,
                "errors": source.errors,
                "last_error": source.last_error,
                "caught_up": source.caught_up,
            })
        })
        .collect();
    let leases: Vec<Value> = status
        .leases
        .iter()
        .map(|lease| {
            json!({
                "feed_range": lease.feed_range,
                "owner": lease.owner,
                "last_lsn": lease.last_lsn,
                "last_ts": lease.last_ts,
                "lag_seconds": lease.lag_seconds,
                "renewed_ms_ago": lease.renewed_ms_ago,
                "changes_published": lease.changes_published,
            })
        })
        .collect();
    json!({
        "stage": status.stage,
        "version": status.version,
        "instance": status.instance,
        "ready": status.ready,
        "paused": status.paused,
        "uptime_seconds": status.uptime_seconds,
        "events_per_second": status.events_per_second,
        "in_flight": status.in_flight,
        "partitions_owned": status.partitions.len(),
        "total_lag": total_lag(status),
        "partitions": partitions,
        "counters": counters,
        "sources": sources,
        "leases": leases,
        "gaps": status.gaps.iter().map(gap_json).collect::<Vec<_>>(),
    })
}

/// A partition held at a gap.
pub(super) fn gap_json(gap: &admin::GapStatus) -> Value {
    json!({
        "topic": gap.topic,
        "partition": gap.partition,
        "cause": gap.cause,
        "stored_next": gap.stored_next,
        "log_start": gap.log_start,
        "log_end": gap.log_end,
        "records_lost": gap.records_lost,
        "found_at_us": gap.found_at_us,
    })
}

pub(super) fn partition_json(partition: &admin::PartitionStatus) -> Value {
    json!({
        "topic": partition.topic,
        "partition": partition.partition,
        "committed_offset": partition.committed_offset,
        "high_watermark": partition.high_watermark,
        "lag": partition.lag,
        "state_bytes": partition.state_bytes,
    })
}

pub(super) fn checkpoint_json(checkpoint: &admin::CheckpointInfo) -> Value {
    json!({
        "epoch": checkpoint.epoch,
        "complete": checkpoint.complete,
        "created_at_us": checkpoint.created_at_us,
        "created_at": format_micros(checkpoint.created_at_us),
        "partitions": checkpoint.partitions.iter().map(partition_json).collect::<Vec<_>>(),
    })
}

/// A key's state; `state` is the stage's JSON document itself (a string only if it is not JSON).
pub(super) fn key_state_json(key: &str, response: &admin::ReadKeyStateResponse) -> Value {
    let timers: Vec<Value> = response
        .timers
        .iter()
        .map(|timer| {
            json!({
                "kind": timer.kind,
                "fire_at_us": timer.fire_at_us,
                "fire_at": format_micros(timer.fire_at_us),
                "time_domain": timer.time_domain,
            })
        })
        .collect();
    json!({
        "key": key,
        "found": response.found,
        "expired": response.expired,
        "state": parse_state(&response.state_json),
        "dedup_event_ids": response.dedup_event_ids,
        "timers": timers,
    })
}

#[cfg(test)]
mod tests {
    use super::super::render::render_key_state;
    use super::super::tests::sample_status;
    use super::*;
    use anyhow::anyhow;

    #[test]
    fn an_extension_deployment_keeps_its_name_and_reports_its_binary() {
        let status = admin::StatusResponse {
            stage: "dedup-state".to_owned(),
            ..sample_status()
        };
        let asked = |stage: Option<Stage>| Target {
            stage,
            url: "http://127.0.0.1:9195".to_owned(),
        };
        let rotation = with_fields(&asked(Some(Stage::Rotation)), status_json(&status));
        assert_eq!(rotation["stage"], "rotation");
        assert_eq!(rotation["binary"], "dedup-state");
        let same = with_fields(&asked(Some(Stage::DedupState)), status_json(&status));
        assert_eq!(same["stage"], "dedup-state");
        assert!(same.get("binary").is_none(), "{same}");
        let unnamed = with_fields(&asked(None), status_json(&status));
        assert_eq!(unnamed["stage"], "dedup-state");
        assert!(unnamed.get("binary").is_none(), "{unnamed}");
        // A deployment of another binary than the one asked for: what answered is the stage.
        let mistaken = with_fields(&asked(Some(Stage::CosmosPredictions)), status_json(&status));
        assert_eq!(mistaken["stage"], "dedup-state");
        assert!(mistaken.get("binary").is_none(), "{mistaken}");
    }

    #[test]
    fn status_renders_as_json_with_every_field() {
        let status = sample_status();
        let target = Target {
            stage: Some(Stage::DedupState),
            url: "http://127.0.0.1:9091".to_owned(),
        };
        let rendered = with_fields(&target, status_json(&status));
        // One line, parseable: what `--json` prints.
        let line = rendered.to_string();
        assert!(!line.contains('\n'));
        let parsed: Value = serde_json::from_str(&line).expect("valid JSON");

        assert_eq!(parsed["stage"], "dedup-state");
        assert_eq!(parsed["address"], "http://127.0.0.1:9091");
        assert_eq!(parsed["version"], "0.1.0");
        assert_eq!(parsed["instance"], "dedup-state-0");
        assert_eq!(parsed["ready"], true);
        assert_eq!(parsed["paused"], false);
        assert_eq!(parsed["uptime_seconds"], 3_725);
        assert_eq!(parsed["events_per_second"], 88.25);
        assert_eq!(parsed["in_flight"], 3);
        assert_eq!(parsed["partitions_owned"], 2);
        assert_eq!(parsed["total_lag"], 42);
        assert_eq!(parsed["partitions"][1]["partition"], 1);
        assert_eq!(parsed["partitions"][1]["committed_offset"], 900);
        assert_eq!(parsed["partitions"][1]["high_watermark"], 930);
        assert_eq!(parsed["partitions"][1]["lag"], 30);
        assert_eq!(parsed["partitions"][0]["state_bytes"], 4_096);
        assert_eq!(parsed["counters"]["events_accepted_total"], 1_234.5);
        assert_eq!(parsed["counters"]["events_deduplicated_total"], 17.0);
        assert_eq!(parsed["sources"][0]["name"], "flightaware");
        assert_eq!(parsed["sources"][0]["last_error"], "HTTP 503");
        assert_eq!(parsed["sources"][0]["caught_up"], true);
        assert_eq!(parsed["leases"][0]["owner"], "changefeed-sync-1");
        assert_eq!(parsed["leases"][0]["last_lsn"], 42);
        assert_eq!(parsed["leases"][0]["changes_published"], 77);
        assert_eq!(parsed["gaps"][0]["partition"], 7);
        assert_eq!(parsed["gaps"][0]["cause"], "retention");
        assert_eq!(parsed["gaps"][0]["records_lost"], 60);
    }

    #[test]
    fn summary_json_marks_down_stages() {
        let down: Result<admin::StatusResponse> = Err(anyhow!("cannot reach cosmos-writer admin API"));
        let url = Stage::CosmosWriter.local_url(10).expect("in range");
        let parsed = summary_json(Stage::CosmosWriter, &url, &down);
        assert_eq!(parsed["stage"], "cosmos-writer");
        assert_eq!(parsed["address"], "http://127.0.0.1:9202");
        assert_eq!(parsed["up"], false);
        assert_eq!(parsed["error"], "cannot reach cosmos-writer admin API");

        let up = Ok(sample_status());
        let parsed = summary_json(
            Stage::DedupState,
            &Stage::DedupState.local_url(0).expect("in range"),
            &up,
        );
        assert_eq!(parsed["up"], true);
        assert_eq!(parsed["total_lag"], 42);
    }

    #[test]
    fn key_state_keeps_the_document_as_json() {
        let response = admin::ReadKeyStateResponse {
            found: true,
            state_json: r#"{"status":"DEPARTED","gate":"B12"}"#.to_owned(),
            dedup_event_ids: vec!["evt-1".to_owned(), "evt-2".to_owned()],
            timers: vec![admin::TimerInfo {
                kind: "lateness".to_owned(),
                fire_at_us: 1_357_016_400_000_000,
                time_domain: "event".to_owned(),
            }],
            expired: true,
        };
        let parsed = key_state_json("UA1545-2013-01-01-EWR", &response);
        assert_eq!(parsed["found"], true);
        assert_eq!(parsed["expired"], true);
        assert_eq!(parsed["state"]["gate"], "B12");
        assert_eq!(parsed["dedup_event_ids"][1], "evt-2");
        assert_eq!(parsed["timers"][0]["fire_at"], "2013-01-01T05:00:00Z");
        let text = render_key_state("UA1545-2013-01-01-EWR", &response);
        assert!(text.contains("\"gate\": \"B12\""), "pretty-printed:\n{text}");
        assert!(text.contains("lateness  2013-01-01T05:00:00Z  event"), "{text}");
        assert_eq!(parse_state(""), Value::Null);
        assert_eq!(parse_state("not json"), Value::String("not json".to_owned()));
    }
}
