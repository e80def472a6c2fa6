//! Settling: after the replay, the stores are read until they satisfy every exactly-once check
//! (and chaos is over) and delta-archiver has archived every topic up to its end, or time runs
//! out.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use contrail_common::kafka::KafkaConfig;
use contrail_common::topology::topics;
use contrail_history::Table;
use indicatif::ProgressBar;

use super::context::{Milestones, Up};
use crate::check::{Report, evaluate};
use crate::stores::Stores;

/// What delta-archiver archives in a run: each table and the topic it comes from.
pub(super) fn archived_topics(rotation: bool) -> Vec<(Table, &'static str)> {
    let mut archived = vec![
        (Table::Events, topics::ACCEPTED),
        (Table::FlightStates, topics::CURATED),
        (Table::LateEvents, topics::LATE),
        (Table::ServingChanges, topics::CHANGES),
        (Table::Alerts, topics::ALERTS),
    ];
    if rotation {
        archived.push((Table::Predictions, topics::PREDICTIONS));
    }
    archived
}

/// Where the history is and what it is archived from.
pub(super) struct History<'a> {
    pub(super) kafka: KafkaConfig,
    pub(super) delta_root: &'a str,
    pub(super) archived: Vec<(Table, &'static str)>,
}

/// Reads the stores every 3 s until the checks pass, chaos is over and the history holds every
/// topic up to its end, or `deadline`; the last report.
///
/// The checks pass once every flight's last version is everywhere; a record after it on a topic
/// (an alert, a second late delivery, a change a restarted writer produced) may still be on its
/// way to Delta then. So once they pass, each topic's end is read (past the end the broker
/// reports) and the stores are read again once delta-archiver has archived up to it: the
/// summary counts what the history holds.
pub(super) async fn settle(
    up: &Up,
    stores: &Stores,
    history: &History<'_>,
    events: &HashSet<(String, String)>,
    deadline: Instant,
    status: &ProgressBar,
    bar: &ProgressBar,
) -> Report {
    // Set once delta-archiver has archived up to the ends read after the checks first passed.
    let mut archived_to_ends = false;
    loop {
        let report = observe(stores, events, status).await;
        let chaos_over = Milestones::is_set(&up.milestones.chaos_done);
        if Instant::now() > deadline {
            return report;
        }
        if chaos_over && report.passed() {
            // Read after archiving up to the ends: this report counts it.
            if archived_to_ends {
                return report;
            }
            match caught_up(history, deadline, status).await {
                Ok(()) => {
                    archived_to_ends = true;
                    continue;
                }
                Err(error) => status.set_message(format!("settling: {error:#}")),
            }
        }
        bar.set_message(format!(
            "settling: {}/{} events archived, {} documents",
            report.events_rows + report.late_rows,
            events.len(),
            report.documents
        ));
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// Delta first; Cosmos (a query over every document) only once the history is complete —
/// serving_changes holding every flight's last version implies Cosmos has it too.
async fn observe(stores: &Stores, events: &HashSet<(String, String)>, status: &ProgressBar) -> Report {
    match stores.observe_history().await {
        Ok(mut observed) => {
            let history = evaluate(events, &observed);
            let complete = history
                .checks
                .iter()
                .all(|check| check.passed || check.name.starts_with("cosmos"));
            if !complete {
                return history;
            }
            match stores.versions().await {
                Ok(documents) => {
                    observed.documents = documents;
                    evaluate(events, &observed)
                }
                Err(_) => history,
            }
        }
        Err(error) => {
            status.set_message(format!("reading the stores: {error:#}"));
            Report::default()
        }
    }
}

/// Reads where each archived topic ends and waits until delta-archiver has archived it up to
/// there (or `deadline`: then an error naming what is behind).
async fn caught_up(history: &History<'_>, deadline: Instant, status: &ProgressBar) -> anyhow::Result<()> {
    // Each read waits for its topic to stay quiet past its end: read them all at once.
    status.set_message("settling: reading where each archived topic ends");
    let ends = futures::future::try_join_all(history.archived.iter().map(|(table, topic)| async move {
        anyhow::Ok((
            *table,
            *topic,
            crate::stores::archived::last_offsets(&history.kafka, topic).await?,
        ))
    }))
    .await?;
    loop {
        let mut behind = Vec::new();
        for (table, topic, targets) in &ends {
            for partition in
                crate::stores::archived::behind(history.delta_root, *table, topic, targets).await?
            {
                behind.push(format!("{} ← {topic} {partition}", table.name()));
            }
        }
        if behind.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "delta-archiver has not archived up to the topics' ends: {}",
                behind.join(", ")
            );
        }
        status.set_message(format!(
            "settling: delta-archiver is archiving up to the topics' ends: {}",
            behind.join(", ")
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
