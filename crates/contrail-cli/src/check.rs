//! The exactly-once checks of `contrail up`: what the stores hold, compared with what was sent
//! and with each other. Pure: the caller reads the stores ([`crate::stores`]).
//!
//! From the replay we know every distinct event sent, `(flight key, event id)`. The contract
//! (docs/CONTRACT.md, "Processing in dedup-state" and "Guarantees across restarts") then
//! requires, whatever was killed: every sent event is accepted (`events`) or late (`late_events`);
//! `events` holds one row per event; `flight_states` holds versions 1..n of each flight, once
//! each, where n is the number of its accepted events; the Cosmos document of each flight has
//! version n; `serving_changes` holds each change `(id, _lsn)` once and has reached version n;
//! `alerts` holds each alert raised once and its resolution at most once.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

/// What the stores hold (identities only).
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Cosmos `flights`: (id, version).
    pub documents: Vec<(String, i64)>,
    /// Delta `events`: (flight key, event id).
    pub events: Vec<(String, String)>,
    /// Delta `late_events`: (flight key, event id, input partition, input offset).
    pub late: Vec<(String, String, i32, i64)>,
    /// Delta `flight_states`: (flight key, version).
    pub states: Vec<(String, i64)>,
    /// Delta `serving_changes`: (id, lsn, version).
    pub changes: Vec<(String, i64, Option<i64>)>,
    /// Delta `alerts`: (alert id, state `FIRING` | `RESOLVED`).
    pub alerts: Vec<(String, String)>,
}

/// One check's outcome.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Check {
    /// What is checked.
    pub name: &'static str,
    /// Whether it held.
    pub passed: bool,
    /// Numbers, and examples of violations.
    pub detail: String,
}

/// Counts and checks.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Report {
    /// Distinct events sent.
    pub events_sent: usize,
    /// Rows of `events` (accepted events).
    pub events_rows: usize,
    /// Rows of `late_events`.
    pub late_rows: usize,
    /// Rows of `flight_states`.
    pub state_rows: usize,
    /// Rows of `serving_changes`.
    pub change_rows: usize,
    /// Cosmos documents.
    pub documents: usize,
    /// Alerts raised (rows of `alerts` in state `FIRING`).
    pub alerts_raised: usize,
    /// Alerts resolved (rows of `alerts` in state `RESOLVED`).
    pub alerts_resolved: usize,
    /// The checks.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether every check held.
    pub fn passed(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|check| check.passed)
    }
}

fn sample<T: std::fmt::Debug>(items: impl IntoIterator<Item = T>) -> String {
    let items: Vec<String> = items
        .into_iter()
        .take(3)
        .map(|item| format!("{item:?}"))
        .collect();
    items.join(", ")
}

fn check(name: &'static str, violations: Vec<String>, ok_detail: String) -> Check {
    if violations.is_empty() {
        Check {
            name,
            passed: true,
            detail: ok_detail,
        }
    } else {
        Check {
            name,
            passed: false,
            detail: format!("{} violations, e.g. {}", violations.len(), sample(&violations)),
        }
    }
}

/// Runs every check.
pub fn evaluate(sent: &HashSet<(String, String)>, observed: &Observed) -> Report {
    let mut checks = Vec::new();

    // events: one row per event.
    let mut events: HashSet<(&str, &str)> = HashSet::with_capacity(observed.events.len());
    let mut repeated_events = Vec::new();
    let mut accepted_per_key: HashMap<&str, i64> = HashMap::new();
    for (key, id) in &observed.events {
        if events.insert((key, id)) {
            *accepted_per_key.entry(key).or_default() += 1;
        } else {
            repeated_events.push(format!("{key}/{id}"));
        }
    }
    checks.push(check(
        "events: one row per accepted event",
        repeated_events,
        format!("{} rows, all distinct", observed.events.len()),
    ));

    // late_events: one row per input position.
    let mut positions = HashSet::new();
    let mut late_ids: HashSet<(&str, &str)> = HashSet::new();
    let mut repeated_late = Vec::new();
    for (key, id, partition, offset) in &observed.late {
        late_ids.insert((key, id));
        if !positions.insert((partition, offset)) {
            repeated_late.push(format!("{partition}@{offset}"));
        }
    }
    checks.push(check(
        "late_events: one row per late delivery",
        repeated_late,
        format!("{} rows, all distinct", observed.late.len()),
    ));

    // Nothing lost: every sent event was accepted or is late.
    let lost: Vec<String> = sent
        .iter()
        .filter(|(key, id)| {
            !events.contains(&(key.as_str(), id.as_str())) && !late_ids.contains(&(key.as_str(), id.as_str()))
        })
        .map(|(key, id)| format!("{key}/{id}"))
        .collect();
    checks.push(check(
        "every event sent is accepted or late",
        lost,
        format!("{} distinct events sent", sent.len()),
    ));

    // flight_states: versions 1..n once each.
    let mut versions: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for (key, version) in &observed.states {
        versions.entry(key).or_default().push(*version);
    }
    let mut state_problems = Vec::new();
    for (key, list) in &mut versions {
        list.sort_unstable();
        let n = accepted_per_key.get(key).copied().unwrap_or(0);
        let expected: Vec<i64> = (1..=n).collect();
        if *list != expected {
            state_problems.push(format!(
                "{key}: versions {} for {n} accepted events",
                compact(list)
            ));
        }
    }
    for (key, n) in &accepted_per_key {
        if !versions.contains_key(key) {
            state_problems.push(format!("{key}: no state for {n} accepted events"));
        }
    }
    checks.push(check(
        "flight_states: versions 1..n once each (n = accepted events)",
        state_problems,
        format!("{} rows for {} flights", observed.states.len(), versions.len()),
    ));

    // Cosmos: one document per flight, at version n.
    let mut documents: HashMap<&str, i64> = HashMap::new();
    let mut document_problems = Vec::new();
    for (id, version) in &observed.documents {
        if documents.insert(id, *version).is_some() {
            document_problems.push(format!("{id}: listed twice"));
        }
    }
    for (key, n) in &accepted_per_key {
        match documents.get(key) {
            Some(version) if version == n => {}
            Some(version) => document_problems.push(format!("{key}: version {version}, expected {n}")),
            None => document_problems.push(format!("{key}: missing (expected version {n})")),
        }
    }
    for id in documents.keys() {
        if !accepted_per_key.contains_key(id) {
            document_problems.push(format!("{id}: a document without accepted events"));
        }
    }
    checks.push(check(
        "cosmos: one document per flight at its last version",
        document_problems,
        format!("{} documents", documents.len()),
    ));

    // serving_changes: each change once; the last version of every flight arrived.
    let mut changes = HashSet::new();
    let mut newest: HashMap<&str, i64> = HashMap::new();
    let mut change_problems = Vec::new();
    for (id, lsn, version) in &observed.changes {
        if !changes.insert((id, lsn)) {
            change_problems.push(format!("{id}@{lsn}: twice"));
        }
        let entry = newest.entry(id).or_default();
        *entry = (*entry).max(version.unwrap_or(0));
    }
    for (key, n) in &accepted_per_key {
        match newest.get(key) {
            Some(version) if version == n => {}
            Some(version) => {
                change_problems.push(format!("{key}: newest change version {version}, expected {n}"))
            }
            None => change_problems.push(format!("{key}: no change")),
        }
    }
    checks.push(check(
        "serving_changes: each change once, every flight's last version reached",
        change_problems,
        format!("{} rows", observed.changes.len()),
    ));

    // alerts: each alert raised once and resolved at most once, never resolved before raised.
    let mut alert_rows: HashSet<(&str, &str)> = HashSet::new();
    let mut alert_problems = Vec::new();
    for (id, state) in &observed.alerts {
        if !alert_rows.insert((id, state)) {
            alert_problems.push(format!("{id} {state}: twice"));
        }
        if !matches!(state.as_str(), "FIRING" | "RESOLVED") {
            alert_problems.push(format!("{id}: unknown state {state:?}"));
        }
    }
    for (id, state) in &alert_rows {
        if *state == "RESOLVED" && !alert_rows.contains(&(*id, "FIRING")) {
            alert_problems.push(format!("{id}: resolved but never raised"));
        }
    }
    let raised = alert_rows.iter().filter(|(_, state)| *state == "FIRING").count();
    let resolved = alert_rows
        .iter()
        .filter(|(_, state)| *state == "RESOLVED")
        .count();
    checks.push(check(
        "alerts: each raised once, resolved at most once, after it was raised",
        alert_problems,
        format!(
            "{raised} raised, {resolved} resolved, {} open",
            raised - resolved.min(raised)
        ),
    ));

    Report {
        events_sent: sent.len(),
        events_rows: observed.events.len(),
        late_rows: observed.late.len(),
        state_rows: observed.states.len(),
        change_rows: observed.changes.len(),
        documents: documents.len(),
        alerts_raised: raised,
        alerts_resolved: resolved,
        checks,
    }
}

fn compact(list: &[i64]) -> String {
    if list.len() <= 6 {
        return format!("{list:?}");
    }
    format!(
        "[{}, {}, …, {}] ({} values)",
        list[0],
        list[1],
        list[list.len() - 1],
        list.len()
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A consistent world: `flights` flights with `per_flight` events, `late` of them late.
    fn world(flights: usize, per_flight: usize, late_every: usize) -> (HashSet<(String, String)>, Observed) {
        let mut sent = HashSet::new();
        let mut observed = Observed::default();
        let mut lsn = 0;
        let mut offset = 0;
        for flight in 0..flights {
            let key = format!("UA{flight}-2013-01-01-EWR");
            let mut accepted = 0;
            for event in 0..per_flight {
                let id = format!("e{event}");
                sent.insert((key.clone(), id.clone()));
                offset += 1;
                if late_every > 0 && event > 0 && event % late_every == 0 {
                    observed.late.push((key.clone(), id, 0, offset));
                } else {
                    observed.events.push((key.clone(), id));
                    accepted += 1;
                    observed.states.push((key.clone(), accepted));
                }
            }
            if accepted > 0 {
                observed.documents.push((key.clone(), accepted));
                // The change feed shows the newest version (it may skip versions in between).
                lsn += 1;
                observed.changes.push((key.clone(), lsn, Some(accepted)));
            }
        }
        (sent, observed)
    }

    #[test]
    fn a_consistent_world_passes_every_check() {
        let (sent, observed) = world(20, 7, 3);
        let report = evaluate(&sent, &observed);
        assert!(report.passed(), "{:#?}", report.checks);
        assert_eq!(report.events_sent, 140);
        assert_eq!(report.late_rows, 20 * 2);
        assert_eq!(report.documents, 20);
    }

    fn failed(report: &Report) -> Vec<&'static str> {
        report
            .checks
            .iter()
            .filter(|check| !check.passed)
            .map(|check| check.name)
            .collect()
    }

    #[test]
    fn each_kind_of_double_or_missing_effect_fails_its_check() {
        let (sent, base) = world(5, 6, 0);

        let mut twice = base.clone();
        twice.events.push(base.events[3].clone());
        let report = evaluate(&sent, &twice);
        assert!(failed(&report).contains(&"events: one row per accepted event"));

        let mut lost = base.clone();
        lost.events.remove(0);
        let report = evaluate(&sent, &lost);
        assert!(failed(&report).contains(&"every event sent is accepted or late"));

        let mut gap = base.clone();
        gap.states
            .retain(|(key, version)| !(key == "UA1-2013-01-01-EWR" && *version == 2));
        let report = evaluate(&sent, &gap);
        assert_eq!(
            failed(&report),
            vec!["flight_states: versions 1..n once each (n = accepted events)"]
        );

        let mut stale = base.clone();
        stale.documents[2].1 -= 1;
        let report = evaluate(&sent, &stale);
        assert_eq!(
            failed(&report),
            vec!["cosmos: one document per flight at its last version"]
        );

        let mut repeated_change = base.clone();
        repeated_change.changes.push(base.changes[0].clone());
        let report = evaluate(&sent, &repeated_change);
        assert_eq!(
            failed(&report),
            vec!["serving_changes: each change once, every flight's last version reached"]
        );

        let mut late_twice = base.clone();
        late_twice
            .late
            .push(("UA0-2013-01-01-EWR".to_owned(), "e0".to_owned(), 1, 5));
        late_twice
            .late
            .push(("UA0-2013-01-01-EWR".to_owned(), "e0".to_owned(), 1, 5));
        let report = evaluate(&sent, &late_twice);
        assert_eq!(failed(&report), vec!["late_events: one row per late delivery"]);

        const ALERTS: &str = "alerts: each raised once, resolved at most once, after it was raised";
        let row = |id: &str, state: &str| (id.to_owned(), state.to_owned());
        let mut alerts = base.clone();
        alerts.alerts = vec![
            row("UA1-2013-01-01-EWR/DEPARTURE_OVERDUE", "FIRING"),
            row("UA1-2013-01-01-EWR/DEPARTURE_OVERDUE", "RESOLVED"),
            row("UA2-2013-01-01-EWR/DEPARTURE_OVERDUE", "FIRING"),
        ];
        let report = evaluate(&sent, &alerts);
        assert!(report.passed(), "{:#?}", report.checks);
        assert_eq!((report.alerts_raised, report.alerts_resolved), (2, 1));
        let mut resolved_twice = alerts.clone();
        resolved_twice.alerts.push(alerts.alerts[1].clone());
        assert_eq!(failed(&evaluate(&sent, &resolved_twice)), vec![ALERTS]);
        let mut never_raised = alerts.clone();
        never_raised.alerts.remove(0);
        assert_eq!(failed(&evaluate(&sent, &never_raised)), vec![ALERTS]);
    }

    #[test]
    fn nothing_observed_fails() {
        let (sent, _) = world(3, 3, 0);
        let report = evaluate(&sent, &Observed::default());
        assert!(!report.passed());
        assert!(!evaluate(&HashSet::new(), &Observed::default()).checks.is_empty());
    }

    proptest! {
        /// Removing any one row of any store, or repeating it, is always caught.
        #[test]
        fn any_single_lost_or_repeated_row_is_caught(
            flights in 1usize..8, per_flight in 1usize..6, late_every in 0usize..4,
            store in 0usize..5, pick in any::<prop::sample::Index>(), repeat in any::<bool>(),
        ) {
            let (sent, mut observed) = world(flights, per_flight, late_every);
            let touched = match store {
                0 => mutate(&mut observed.events, &pick, repeat),
                1 => mutate(&mut observed.late, &pick, repeat),
                2 => mutate(&mut observed.states, &pick, repeat),
                3 => mutate(&mut observed.documents, &pick, repeat),
                _ => mutate(&mut observed.changes, &pick, repeat),
            };
            let report = evaluate(&sent, &observed);
            prop_assert_eq!(report.passed(), !touched, "{:#?}", report.checks);
        }
    }

    fn mutate<T: Clone>(rows: &mut Vec<T>, pick: &prop::sample::Index, repeat: bool) -> bool {
        if rows.is_empty() {
            return false;
        }
        let index = pick.index(rows.len());
        if repeat {
            let row = rows[index].clone();
            rows.push(row);
        } else {
            rows.remove(index);
        }
        true
    }
}
