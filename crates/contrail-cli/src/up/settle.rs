//! Settling: after the replay, the stores are read until they satisfy every exactly-once check
//! (and chaos is over), or time runs out.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

use super::context::{Milestones, Up};
use crate::check::{Report, evaluate};
use crate::store::Stores;

/// Reads the stores every 3 s until the checks pass and chaos is over, or `deadline`; the last
/// report.
pub(super) async fn settle(
    up: &Up,
    stores: &Stores,
    events: &HashSet<(String, String)>,
    deadline: Instant,
    status: &ProgressBar,
    bar: &ProgressBar,
) -> Report {
    loop {
        // Delta first; Cosmos (a query over every document) only once the history is complete —
        // serving_changes holding every flight's last version implies Cosmos has it too.
        let report = match stores.observe_history().await {
            Ok(mut observed) => {
                let history = evaluate(events, &observed);
                let complete = history
                    .checks
                    .iter()
                    .all(|check| check.passed || check.name.starts_with("cosmos"));
                if !complete {
                    history
                } else {
                    match stores.versions().await {
                        Ok(documents) => {
                            observed.documents = documents;
                            evaluate(events, &observed)
                        }
                        Err(_) => history,
                    }
                }
            }
            Err(error) => {
                status.set_message(format!("reading the stores: {error:#}"));
                Report::default()
            }
        };
        let chaos_over = Milestones::is_set(&up.milestones.chaos_done);
        if (chaos_over && report.passed()) || Instant::now() > deadline {
            return report;
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
