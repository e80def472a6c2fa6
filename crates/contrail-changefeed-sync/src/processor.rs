//! The change feed processor: lease maintenance (renew, reap, balance, take) and one task per
//! owned lease reading its feed range ([`crate::feed`]).

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use contrail_cosmos::backoff;

use crate::balance::{self, LeaseView};
use crate::error::ChangefeedError;
use crate::feed::poll_once;
use crate::lease::{Lease, LeaseStore, OwnedLease, now_ms};
use crate::shared::{Shared, show};

/// A lease this instance owns and the task reading it.
pub(crate) struct Running {
    lease: OwnedLease,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<(), ChangefeedError>>,
}

/// One round: renew owned leases, reap finished tasks, list, balance, take.
pub(crate) async fn maintain(
    shared: &Arc<Shared>,
    running: &mut BTreeMap<String, Running>,
) -> Result<(), ChangefeedError> {
    let me = shared.config.instance.clone();
    let mut lost = Vec::new();
    for (id, entry) in running.iter() {
        if entry.task.is_finished() {
            lost.push(id.clone());
            continue;
        }
        let mut document = entry.lease.lock().await;
        let mut renewed = document.clone();
        renewed.renewed_at_ms = now_ms();
        renewed.owner = me.clone();
        match shared.store.replace(&renewed).await {
            Ok(updated) => *document = updated,
            Err(ChangefeedError::LeaseLost(_)) => lost.push(id.clone()),
            Err(error) => tracing::warn!(lease = %id, %error, "lease renewal failed"),
        }
    }
    for id in lost {
        if let Some(entry) = running.remove(&id) {
            entry.stop.store(true, Ordering::Relaxed);
            match entry.task.await {
                Ok(Err(ChangefeedError::Superseded(_))) => {
                    // Handed over to the new container's leases: not lost, and gone for good.
                    let _ = shared.metrics.lag_seconds.remove_label_values(&[&id]);
                    let _ = shared.metrics.last_lsn.remove_label_values(&[&id]);
                    continue;
                }
                Ok(Err(ChangefeedError::LeaseLost(_))) | Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::warn!(lease = %id, %error, "lease task failed"),
                Err(error) => tracing::error!(lease = %id, %error, "lease task panicked"),
            }
            shared.metrics.lost.inc();
            tracing::info!(lease = %id, "lease no longer owned");
        }
    }

    let leases = shared.store.list().await?;
    if let Ok(mut board) = shared.board.lock() {
        // Leases deleted since (superseded after a container replacement) leave the board.
        board.retain(|id, _| leases.iter().any(|lease| &lease.id == id));
    }
    let now = now_ms();
    let expiry = shared.config.leases.expiry_ms as i64;
    if let Ok(mut board) = shared.board.lock() {
        // Leases this instance runs are shown by their tasks, which are ahead of the listing.
        for lease in leases.iter().filter(|lease| !running.contains_key(&lease.id)) {
            let owner = if balance::is_free(&view(lease), now, expiry) {
                String::new()
            } else {
                lease.owner.clone()
            };
            show(&mut board, lease, owner, None);
        }
    }
    let views: Vec<LeaseView> = leases.iter().map(view).collect();
    for id in balance::leases_to_take(&views, &me, now, expiry) {
        if running.contains_key(&id) {
            continue;
        }
        let Some(lease) = leases.iter().find(|lease| lease.id == id) else {
            continue;
        };
        let previous = lease.owner.clone();
        let mut taken = lease.clone();
        taken.owner = me.clone();
        taken.renewed_at_ms = now_ms();
        match shared.store.replace(&taken).await {
            Ok(updated) => {
                shared.metrics.acquired.inc();
                tracing::info!(lease = %id, previous_owner = %previous, range = %updated.feed_range, "lease acquired");
                let owned: OwnedLease = Arc::new(tokio::sync::Mutex::new(updated));
                let stop = Arc::new(AtomicBool::new(false));
                let task = shared
                    .tasks
                    .spawn(process_lease(shared.clone(), owned.clone(), stop.clone()));
                running.insert(
                    id,
                    Running {
                        lease: owned,
                        stop,
                        task,
                    },
                );
            }
            Err(ChangefeedError::LeaseLost(_)) => {
                tracing::debug!(lease = %id, "another instance took the lease first");
            }
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// At shutdown: stops every lease task after its page in flight and frees its lease (a lease
/// that cannot be freed expires instead).
pub(crate) async fn release_all(shared: &Shared, running: BTreeMap<String, Running>) {
    for (id, lease) in running {
        lease.stop.store(true, Ordering::Relaxed);
        let _ = lease.task.await;
        let mut document = lease.lease.lock().await;
        document.owner = String::new();
        match shared.store.replace(&document).await {
            Ok(updated) => *document = updated,
            Err(error) => tracing::warn!(lease = %id, %error, "could not release lease; it expires instead"),
        }
    }
}

fn view(lease: &Lease) -> LeaseView {
    LeaseView {
        id: lease.id.clone(),
        owner: lease.owner.clone(),
        renewed_at_ms: lease.renewed_at_ms,
    }
}

/// Reads one lease's feed range until stopped or the lease is lost.
async fn process_lease(
    shared: Arc<Shared>,
    lease: OwnedLease,
    stop: Arc<AtomicBool>,
) -> Result<(), ChangefeedError> {
    let (id, range_text, range) = {
        let document = lease.lock().await;
        let range = LeaseStore::feed_range(&document)?;
        (document.id.clone(), document.feed_range.clone(), range)
    };
    let poll = Duration::from_millis(shared.config.leases.poll_interval_ms);
    let page_size = NonZeroU32::new(shared.config.leases.max_items_per_page).unwrap_or(NonZeroU32::MIN);
    let mut failures: u32 = 0;
    while !stop.load(Ordering::Relaxed) {
        if shared.paused.load(Ordering::Relaxed) {
            tokio::time::sleep(poll).await;
            continue;
        }
        match poll_once(&shared, &lease, &stop, &range, &range_text, page_size, poll).await {
            Ok(()) => {
                failures = 0;
                shared.outage.succeeded();
            }
            Err(ChangefeedError::Cosmos(error)) if error.is_unauthorized() => {
                // Refused credentials: an outage (not ready, said once per 30 s), retried from the
                // stored continuation; nothing is published or stored meanwhile.
                shared.outage.refused(&error);
                let delay = backoff(failures).max(Duration::from_secs(1));
                failures = failures.saturating_add(1);
                tokio::time::sleep(delay).await;
                continue;
            }
            Err(ChangefeedError::LeaseLost(lost)) => return Err(ChangefeedError::LeaseLost(lost)),
            Err(ChangefeedError::Cosmos(error)) if supersede_if_replaced(&shared, &lease, &error).await => {
                return Err(ChangefeedError::Superseded(id));
            }
            Err(error) => {
                let delay = backoff(failures);
                failures = failures.saturating_add(1);
                tracing::warn!(lease = %id, %error, delay_ms = delay.as_millis() as u64, "change feed poll failed; retrying from the stored continuation");
                tokio::time::sleep(delay).await;
                continue;
            }
        }
        tokio::time::sleep(poll).await;
    }
    Ok(())
}

/// After a failed poll: when the monitored container was replaced since `lease` was created (its
/// `_rid` differs, or — for a lease that recorded none — the service refuses the lease's range as
/// a replaced container's), hands the feed over to leases of the new container
/// ([`LeaseStore::supersede`]) and says so: the lease task then ends. `false`: not replaced, or
/// the hand-over failed (retried after the next failed poll).
async fn supersede_if_replaced(
    shared: &Shared,
    lease: &OwnedLease,
    error: &contrail_cosmos::CosmosStoreError,
) -> bool {
    // A container being deleted answers 404 until it exists again: nothing to decide yet.
    let Ok(rid) = shared.store.current_rid().await else {
        return false;
    };
    let refused = crate::lease::refers_to_replaced_container(error);
    let document = lease.lock().await;
    let replaced = match document.container_rid.as_deref() {
        Some(recorded) => recorded != rid,
        None => refused,
    };
    if !replaced && !refused {
        return false;
    }
    // Requests of this instance still carry the old container's identity (its client was
    // resolved before the replacement): resolve it afresh, for this and every other lease.
    if let Err(error) = shared.store.reopen().await {
        tracing::warn!(%error, "the monitored container was replaced; opening it again failed, retrying");
        return false;
    }
    if !replaced {
        tracing::info!(lease = %document.id, "the monitored container was replaced; its client was resolved again");
        return false;
    }
    match shared.store.supersede(&document, &rid).await {
        Ok(created) => {
            shared.metrics.superseded.inc();
            // What the old container held after this continuation was deleted with it.
            tracing::error!(
                lease = %document.id,
                range = %document.feed_range,
                last_lsn = document.last_lsn,
                last_ts = document.last_ts,
                new_leases = created,
                incarnation = document.incarnation + 1,
                "the monitored container was deleted and created again: this lease's range belongs to the old one; \
                 the new container is read from its beginning under new leases. Changes of the old container \
                 after last_lsn were deleted with it and are not published (rebuild serving from history: contrail backfill serving)"
            );
            true
        }
        Err(ChangefeedError::LeaseLost(_)) => true,
        Err(error) => {
            tracing::warn!(lease = %document.id, %error, "the monitored container was replaced; handing the feed to leases of the new one failed, retrying");
            false
        }
    }
}
