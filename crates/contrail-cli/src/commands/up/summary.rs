//! The summary at the end of a run: what went through, what the stores hold, what chaos did,
//! how fast, how much memory, and the exactly-once checks — printed, and as JSON.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::check::Report;
use crate::commands::replay::Totals;

/// Peak resident memory of a process (`VmHWM`), MiB.
pub(super) fn peak_rss_mib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

pub(super) fn summary_json(
    flights: usize,
    totals: &Totals,
    report: &Report,
    kills: &BTreeMap<String, u32>,
    crashes: u32,
    settled: Duration,
    total: Duration,
) -> Value {
    let distinct = totals.events.len();
    json!({
        "flights": flights,
        "deliveries": totals.sent,
        "acknowledged": totals.accepted,
        "rejected": totals.rejected,
        "distinct_events": distinct,
        "duplicates_in_feed": totals.sent.saturating_sub(distinct as u64),
        "accepted_events": report.events_rows,
        "late_events": report.late_rows,
        "cosmos_documents": report.documents,
        "delta_rows": {
            "events": report.events_rows,
            "flight_states": report.state_rows,
            "late_events": report.late_rows,
            "serving_changes": report.change_rows,
            "alerts": report.alerts_raised + report.alerts_resolved,
        },
        "alerts": {
            "raised": report.alerts_raised,
            "resolved": report.alerts_resolved,
            "open": report.alerts_raised.saturating_sub(report.alerts_resolved),
        },
        "change_feed_records": report.change_rows,
        "kills": kills,
        "restarts_survived": kills.values().sum::<u32>() + crashes,
        "crashes": crashes,
        "replay_seconds": totals.elapsed.as_secs_f64(),
        "settled_seconds": settled.as_secs_f64(),
        "total_seconds": total.as_secs_f64(),
        "events_per_second_end_to_end": distinct as f64 / settled.as_secs_f64().max(0.001),
        "checks": report.checks,
        "passed": report.passed(),
    })
}

pub(super) fn print_summary(summary: &Value, report: &Report) {
    let n = |key: &str| summary[key].as_u64().unwrap_or_default();
    let kills = summary["kills"]
        .as_object()
        .map(|kills| {
            kills
                .iter()
                .map(|(stage, count)| format!("{stage} {count}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    println!("\n── contrail up: summary ──────────────────────────────────────────");
    let rows = [
        ("flights replayed", n("flights").to_string()),
        (
            "events in",
            format!(
                "{} deliveries acknowledged by ingest ({} distinct events)",
                n("acknowledged"),
                n("distinct_events")
            ),
        ),
        (
            "duplicates dropped",
            format!("{} (feed duplicates)", n("duplicates_in_feed")),
        ),
        (
            "accepted events",
            format!("{} (Delta events)", n("accepted_events")),
        ),
        ("late events", format!("{} (Delta late_events)", n("late_events"))),
        (
            "overdue alerts",
            format!(
                "{} raised, {} resolved, {} open (Delta alerts)",
                report.alerts_raised,
                report.alerts_resolved,
                report.alerts_raised.saturating_sub(report.alerts_resolved)
            ),
        ),
        ("flights in Cosmos", n("cosmos_documents").to_string()),
        ("flight_states rows", report.state_rows.to_string()),
        (
            "change-feed records",
            format!("{} (Delta serving_changes)", n("change_feed_records")),
        ),
        (
            "restarts survived",
            format!(
                "{} (kill -9: {kills}; crashes {})",
                n("restarts_survived"),
                n("crashes")
            ),
        ),
        (
            "throughput",
            format!(
                "{:.0} events/s end to end ({:.1} s from the first event to settled stores)",
                summary["events_per_second_end_to_end"]
                    .as_f64()
                    .unwrap_or_default(),
                summary["settled_seconds"].as_f64().unwrap_or_default()
            ),
        ),
    ];
    for (name, value) in rows {
        println!("  {name:<22} {value}");
    }
    let (broker, volumes, freezes) = (n("broker_restarts"), n("volume_losses"), n("cosmos_freezes"));
    if broker + volumes + freezes > 0 {
        println!(
            "  {:<22} broker kill -9 and restarted {broker}, dedup-state volume lost {volumes}, Cosmos endpoint frozen {freezes}",
            "chaos, besides"
        );
    }
    if let Some(seconds) = summary["stores_complete_seconds"].as_f64() {
        println!(
            "  {:<22} {:.0} events/s ({seconds:.1} s from the first event to the stores' last commit)",
            "stores complete",
            summary["events_per_second_to_complete_stores"]
                .as_f64()
                .unwrap_or_default(),
        );
    }
    for (name, key) in [
        ("latency → Cosmos", "ingest_to_cosmos"),
        ("latency → Delta", "ingest_to_delta"),
    ] {
        let latency = &summary["latency_ms"][key];
        if latency["samples"].as_u64().unwrap_or(0) > 0 {
            println!(
                "  {name:<22} p50 {} ms, p99 {} ms, max {} ms ({} samples)",
                latency["p50"], latency["p99"], latency["max"], latency["samples"]
            );
        }
    }
    if let Some(peaks) = summary["peak_rss_mib"].as_object() {
        let text: Vec<String> = peaks.iter().map(|(name, mib)| format!("{name} {mib}")).collect();
        println!(
            "  {:<22} {} (MiB, current processes)",
            "peak memory",
            text.join(", ")
        );
    }
    let passed = report.checks.iter().filter(|check| check.passed).count();
    println!(
        "  {:<22} {} ({passed}/{})",
        "exactly-once checks",
        if report.passed() { "PASSED" } else { "FAILED" },
        report.checks.len()
    );
    for check in &report.checks {
        println!(
            "    {} {} — {}",
            if check.passed { "✓" } else { "✗" },
            check.name,
            check.detail
        );
    }
}
