//! Lease balancing as a pure function: which leases an instance should take this round.
//!
//! Like the change feed processor of the .NET/Java SDKs: the live owners are the owners of leases
//! renewed within the expiry, plus this instance. An instance first takes free or expired leases,
//! up to its fair share (`ceil(leases / owners)`); when none are free and some owner holds at
//! least two more leases than this instance, it takes one lease from the busiest owner (one per
//! round, so ownership settles without thrashing). Races between instances are settled by the
//! lease documents' ETags, not here.

use std::collections::BTreeMap;

/// What the balancer needs to know of a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// Lease id.
    pub id: String,
    /// Owner instance; empty = free.
    pub owner: String,
    /// When the owner last renewed it (ms since the epoch).
    pub renewed_at_ms: i64,
}

/// Whether `lease` has no live owner at `now_ms`.
pub fn is_free(lease: &LeaseView, now_ms: i64, expiry_ms: i64) -> bool {
    lease.owner.is_empty() || now_ms.saturating_sub(lease.renewed_at_ms) > expiry_ms
}

/// The leases `me` should try to take now.
pub fn leases_to_take(leases: &[LeaseView], me: &str, now_ms: i64, expiry_ms: i64) -> Vec<String> {
    if leases.is_empty() {
        return Vec::new();
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    counts.insert(me, 0);
    for lease in leases {
        if !is_free(lease, now_ms, expiry_ms) {
            *counts.entry(lease.owner.as_str()).or_insert(0) += 1;
        }
    }
    let mine = counts.get(me).copied().unwrap_or(0);
    let target = leases.len().div_ceil(counts.len());
    if mine >= target {
        return Vec::new();
    }
    let free: Vec<String> = leases
        .iter()
        .filter(|lease| is_free(lease, now_ms, expiry_ms))
        .map(|lease| lease.id.clone())
        .take(target - mine)
        .collect();
    if !free.is_empty() {
        return free;
    }
    let busiest = counts
        .iter()
        .filter(|(owner, _)| **owner != me)
        .max_by_key(|(owner, count)| (**count, std::cmp::Reverse(**owner)));
    match busiest {
        Some((owner, count)) if *count >= mine + 2 => leases
            .iter()
            .find(|lease| lease.owner == *owner && !is_free(lease, now_ms, expiry_ms))
            .map(|lease| vec![lease.id.clone()])
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lease(id: &str, owner: &str, renewed_at_ms: i64) -> LeaseView {
        LeaseView {
            id: id.to_owned(),
            owner: owner.to_owned(),
            renewed_at_ms,
        }
    }

    #[test]
    fn takes_free_and_expired_up_to_the_fair_share() {
        let leases = vec![
            lease("a", "", 0),
            lease("b", "x", 0),
            lease("c", "y", 9_000),
            lease("d", "y", 9_000),
        ];
        // x expired (renewed at 0, now 10 000, expiry 5 000); live owners: y and me → share 2.
        let take = leases_to_take(&leases, "me", 10_000, 5_000);
        assert_eq!(take, vec!["a".to_owned(), "b".to_owned()]);
    }

    #[test]
    fn steals_one_from_the_busiest_only_when_it_evens_out() {
        let leases = vec![
            lease("a", "x", 100),
            lease("b", "x", 100),
            lease("c", "x", 100),
            lease("d", "x", 100),
        ];
        assert_eq!(leases_to_take(&leases, "me", 200, 5_000).len(), 1);
        let leases = vec![lease("a", "x", 100), lease("b", "x", 100), lease("c", "me", 100)];
        assert!(leases_to_take(&leases, "me", 200, 5_000).is_empty());
    }

    proptest! {
        /// Whatever the start, rounds of balancing among live instances end with every lease
        /// owned by a live instance and shares differing by at most one.
        #[test]
        fn rounds_converge(n in 1usize..12, workers in 1usize..5, start in proptest::collection::vec(0usize..6, 12)) {
            let names: Vec<String> = (0..workers).map(|w| format!("w{w}")).collect();
            let mut leases: Vec<LeaseView> = (0..n)
                .map(|i| {
                    // Owners beyond the live workers are dead instances whose leases expired.
                    let owner = match start[i] { o if o < workers => names[o].clone(), 5 => String::new(), o => format!("dead{o}") };
                    let renewed = if owner.starts_with("dead") { 0 } else { 1_000_000 };
                    lease(&format!("l{i}"), &owner, renewed)
                })
                .collect();
            for _round in 0..(4 * n + 4) {
                for me in &names {
                    for id in leases_to_take(&leases, me, 1_000_000, 10_000) {
                        if let Some(lease) = leases.iter_mut().find(|lease| lease.id == id) {
                            lease.owner = me.clone();
                            lease.renewed_at_ms = 1_000_000;
                        }
                    }
                }
            }
            let mut counts: BTreeMap<&str, usize> = names.iter().map(|name| (name.as_str(), 0)).collect();
            for lease in &leases {
                prop_assert!(names.contains(&lease.owner), "lease {} owned by {:?}", lease.id, lease.owner);
                *counts.get_mut(lease.owner.as_str()).expect("live") += 1;
            }
            let max = counts.values().max().copied().unwrap_or(0);
            let min = counts.values().min().copied().unwrap_or(0);
            prop_assert!(max - min <= 1, "unbalanced: {:?}", counts);
        }
    }
}
