//! Human output of `contrail admin`: aligned tables and key/value lines.

use chrono::{DateTime, SecondsFormat};
use contrail_proto::admin::v1 as admin;
use serde_json::Value;

use super::fields::{format_micros, parse_state, total_lag};
use super::table::{Align, Table};
use super::target::Target;

/// The full status of one stage: header fields, then partitions, counters, sources and leases.
pub(super) fn render_status(target: &Target, status: &admin::StatusResponse) -> String {
    // An extension's deployment runs a pipeline stage's binary: name both (as `--json` does).
    let stage = match target.extension_binary(&status.stage) {
        Some(binary) => format!("{} ({binary})", target.name()),
        None => status.stage.clone(),
    };
    let mut sections = vec![key_value_lines(&[
        ("stage", stage),
        ("version", status.version.clone()),
        ("instance", status.instance.clone()),
        ("address", target.url.clone()),
        ("ready", yes_no(status.ready)),
        ("paused", yes_no(status.paused)),
        (
            "uptime",
            format!(
                "{} ({} s)",
                format_uptime(status.uptime_seconds),
                status.uptime_seconds
            ),
        ),
        ("events/s", format!("{:.1}", status.events_per_second)),
        ("in flight", status.in_flight.to_string()),
    ])];

    let mut partitions = Table::new(&[
        ("TOPIC", Align::Left),
        ("PARTITION", Align::Right),
        ("COMMITTED", Align::Right),
        ("HIGH WATERMARK", Align::Right),
        ("LAG", Align::Right),
        ("STATE", Align::Right),
    ]);
    let mut sorted_partitions: Vec<&admin::PartitionStatus> = status.partitions.iter().collect();
    sorted_partitions
        .sort_by(|left, right| (&left.topic, left.partition).cmp(&(&right.topic, right.partition)));
    for partition in sorted_partitions {
        partitions.push(vec![
            partition.topic.clone(),
            partition.partition.to_string(),
            partition.committed_offset.to_string(),
            partition.high_watermark.to_string(),
            partition.lag.to_string(),
            format_bytes(partition.state_bytes),
        ]);
    }
    sections.push(format!(
        "partitions: {} owned, total lag {}\n{}",
        status.partitions.len(),
        total_lag(status),
        partitions.render()
    ));

    if !status.counters.is_empty() {
        let mut counters = Table::new(&[("COUNTER", Align::Left), ("VALUE", Align::Right)]);
        let mut sorted_counters: Vec<(&String, &f64)> = status.counters.iter().collect();
        sorted_counters.sort_by(|left, right| left.0.cmp(right.0));
        for (name, value) in sorted_counters {
            counters.push(vec![name.clone(), format_number(*value)]);
        }
        sections.push(counters.render());
    }

    if !status.sources.is_empty() {
        let mut sources = Table::new(&[
            ("SOURCE", Align::Left),
            ("CURSOR", Align::Left),
            ("EVENTS", Align::Right),
            ("PAGES", Align::Right),
            ("ERRORS", Align::Right),
            ("CAUGHT UP", Align::Left),
            ("LAST ERROR", Align::Left),
        ]);
        for source in &status.sources {
            sources.push(vec![
                source.name.clone(),
                source.cursor.clone(),
                source.events_fetched.to_string(),
                source.pages_fetched.to_string(),
                source.errors.to_string(),
                yes_no(source.caught_up),
                source.last_error.clone(),
            ]);
        }
        sections.push(sources.render());
    }

    if !status.leases.is_empty() {
        let mut leases = Table::new(&[
            ("FEED RANGE", Align::Left),
            ("OWNER", Align::Left),
            ("LAST LSN", Align::Right),
            ("LAST CHANGE", Align::Left),
            ("LAG S", Align::Right),
            ("RENEWED MS AGO", Align::Right),
            ("PUBLISHED", Align::Right),
        ]);
        for lease in &status.leases {
            leases.push(vec![
                lease.feed_range.clone(),
                lease.owner.clone(),
                lease.last_lsn.to_string(),
                format_epoch_seconds(lease.last_ts),
                format!("{:.1}", lease.lag_seconds),
                lease.renewed_ms_ago.to_string(),
                lease.changes_published.to_string(),
            ]);
        }
        sections.push(leases.render());
    }

    if !status.gaps.is_empty() {
        let mut gaps = Table::new(&[
            ("HELD AT A GAP: TOPIC", Align::Left),
            ("PARTITION", Align::Right),
            ("CAUSE", Align::Left),
            ("STORED NEXT", Align::Right),
            ("LOG START", Align::Right),
            ("LOG END", Align::Right),
            ("LOST", Align::Right),
            ("FOUND", Align::Left),
        ]);
        for gap in &status.gaps {
            gaps.push(vec![
                gap.topic.clone(),
                gap.partition.to_string(),
                gap.cause.clone(),
                gap.stored_next.to_string(),
                gap.log_start.to_string(),
                gap.log_end.to_string(),
                if gap.records_lost < 0 {
                    "unknown".to_owned()
                } else {
                    gap.records_lost.to_string()
                },
                format_micros(gap.found_at_us),
            ]);
        }
        sections.push(format!(
            "{}\nNothing of these partitions is consumed until the gap is accepted: \
             contrail admin accept-gap --topic TOPIC --partition N (or --all)",
            gaps.render()
        ));
    }
    sections.join("\n\n")
}

pub(super) fn render_checkpoints(target: &Target, checkpoints: &[admin::CheckpointInfo]) -> String {
    if checkpoints.is_empty() {
        return format!("{} keeps no checkpoints yet", target.name());
    }
    let mut table = Table::new(&[
        ("EPOCH", Align::Right),
        ("COMPLETE", Align::Left),
        ("CREATED AT", Align::Left),
        ("PARTITIONS", Align::Right),
    ]);
    for checkpoint in checkpoints {
        table.push(vec![
            checkpoint.epoch.to_string(),
            yes_no(checkpoint.complete),
            format_micros(checkpoint.created_at_us),
            checkpoint.partitions.len().to_string(),
        ]);
    }
    table.render()
}

pub(super) fn render_key_state(key: &str, response: &admin::ReadKeyStateResponse) -> String {
    let mut sections = vec![format!(
        "key:   {key}\nfound: {}{}",
        yes_no(response.found),
        if response.expired {
            " (expired: past its horizon; every event of it is late, reason `expired`)"
        } else {
            ""
        }
    )];
    match parse_state(&response.state_json) {
        Value::Null => {}
        Value::String(raw) => sections.push(format!("state (not JSON):\n{raw}")),
        document => {
            let pretty = serde_json::to_string_pretty(&document).unwrap_or_else(|_| document.to_string());
            sections.push(format!("state:\n{pretty}"));
        }
    }
    if response.dedup_event_ids.is_empty() {
        sections.push("dedup event ids: none".to_owned());
    } else {
        sections.push(format!(
            "dedup event ids ({}):\n{}",
            response.dedup_event_ids.len(),
            response.dedup_event_ids.join("\n")
        ));
    }
    if response.timers.is_empty() {
        sections.push("timers: none".to_owned());
    } else {
        let mut timers = Table::new(&[
            ("KIND", Align::Left),
            ("FIRE AT", Align::Left),
            ("TIME DOMAIN", Align::Left),
        ]);
        for timer in &response.timers {
            timers.push(vec![
                timer.kind.clone(),
                format_micros(timer.fire_at_us),
                timer.time_domain.clone(),
            ]);
        }
        sections.push(format!("timers:\n{}", timers.render()));
    }
    sections.join("\n\n")
}

/// `name  value` lines with the values aligned.
pub(super) fn key_value_lines(pairs: &[(&str, String)]) -> String {
    let width = pairs
        .iter()
        .map(|(name, _)| name.chars().count())
        .max()
        .unwrap_or(0);
    pairs
        .iter()
        .map(|(name, value)| format!("{name:<width$}  {value}").trim_end().to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

pub(super) fn yes_no(value: bool) -> String {
    if value { "yes" } else { "no" }.to_owned()
}

/// `42s`, `5m07s`, `3h05m`, `2d04h`.
pub(super) fn format_uptime(seconds: i64) -> String {
    if seconds < 0 {
        return "-".to_owned();
    }
    let (days, hours, minutes, secs) = (
        seconds / 86_400,
        seconds % 86_400 / 3_600,
        seconds % 3_600 / 60,
        seconds % 60,
    );
    if days > 0 {
        format!("{days}d{hours:02}h")
    } else if hours > 0 {
        format!("{hours}h{minutes:02}m")
    } else if minutes > 0 {
        format!("{minutes}m{secs:02}s")
    } else {
        format!("{secs}s")
    }
}

/// `512 B`, `1.5 KiB`, `12.3 MiB`, …
pub(super) fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    // Precision lost above 2^53 bytes does not show at one decimal.
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A counter: whole numbers without a fraction, others as Rust's shortest exact form.
pub(super) fn format_number(value: f64) -> String {
    const EXACT_INTEGER_LIMIT: f64 = 9_007_199_254_740_992.0; // 2^53
    if value.fract() == 0.0 && value.abs() < EXACT_INTEGER_LIMIT {
        // Exact: a whole number below 2^53 converts to i64 without loss.
        let whole = value as i64;
        whole.to_string()
    } else {
        value.to_string()
    }
}

/// RFC 3339 (UTC) of seconds since the Unix epoch; `-` for 0 ("none yet").
pub(super) fn format_epoch_seconds(seconds: i64) -> String {
    if seconds == 0 {
        return "-".to_owned();
    }
    DateTime::from_timestamp(seconds, 0).map_or_else(
        || format!("{seconds} s (out of range)"),
        |time| time.to_rfc3339_opts(SecondsFormat::Secs, true),
    )
}

#[cfg(test)]
mod tests {
    use super::super::target::Stage;
    use super::super::tests::sample_status;
    use super::*;

    #[test]
    fn an_extension_deployment_is_named_with_its_binary() {
        let status = admin::StatusResponse {
            stage: "dedup-state".to_owned(),
            ..sample_status()
        };
        let target = |stage| Target {
            stage: Some(stage),
            url: "http://127.0.0.1:9195".to_owned(),
        };
        let rotation = render_status(&target(Stage::Rotation), &status);
        assert!(
            rotation.contains("stage      rotation (dedup-state)\n"),
            "{rotation}"
        );
        let pipeline = render_status(&target(Stage::DedupState), &status);
        assert!(pipeline.contains("stage      dedup-state\n"), "{pipeline}");
    }

    #[test]
    fn full_status_lists_partitions_and_sorted_counters() {
        let target = Target {
            stage: Some(Stage::DedupState),
            url: "http://127.0.0.1:9091".to_owned(),
        };
        let rendered = render_status(&target, &sample_status());
        assert!(rendered.contains("uptime     1h02m (3725 s)"), "{rendered}");
        assert!(
            rendered.contains("partitions: 2 owned, total lag 42"),
            "{rendered}"
        );
        let accepted = rendered.find("events_accepted_total").expect("counter shown");
        let deduplicated = rendered.find("events_deduplicated_total").expect("counter shown");
        assert!(accepted < deduplicated, "counters sorted by name:\n{rendered}");
        assert!(rendered.contains("1234.5"), "{rendered}");
        assert!(rendered.contains("flightaware"), "{rendered}");
        assert!(
            rendered.contains("2013-01-01T05:00:00Z"),
            "lease time as RFC 3339:\n{rendered}"
        );
        let gaps = rendered
            .lines()
            .skip_while(|line| !line.starts_with("HELD AT A GAP"))
            .collect::<Vec<_>>();
        assert!(
            gaps.get(1).is_some_and(|row| row.contains("ops.events.accepted")
                && row.contains("retention")
                && row.contains("160")
                && row.contains("60")),
            "the gap held, with its offsets:\n{rendered}"
        );
        assert!(rendered.contains("contrail admin accept-gap"), "{rendered}");
    }

    #[test]
    fn times_and_sizes_read_well() {
        assert_eq!(format_micros(1_357_016_400_000_000), "2013-01-01T05:00:00Z");
        assert_eq!(format_micros(1_357_016_400_250_000), "2013-01-01T05:00:00.250Z");
        assert_eq!(format_uptime(42), "42s");
        assert_eq!(format_uptime(307), "5m07s");
        assert_eq!(format_uptime(3_725), "1h02m");
        assert_eq!(format_uptime(187_200), "2d04h");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1_536), "1.5 KiB");
        assert_eq!(format_bytes(5 * 1024 * 1024), "5.0 MiB");
        assert_eq!(format_number(17.0), "17");
        assert_eq!(format_number(0.25), "0.25");
    }
}
