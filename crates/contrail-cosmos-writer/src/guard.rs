//! The version guard and the coalescing of a batch, as pure functions.
//!
//! A flight's document may only move forward: it is created when missing, replaced when the
//! incoming version is higher, and left alone otherwise. Within a batch only the highest version
//! of each flight needs writing — every lower one would be replaced right after.

use std::collections::HashMap;

/// What to do with an incoming version given the stored one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// No document yet: create it (a concurrent create shows up as 409, then decide again).
    Create,
    /// The stored version is lower: replace it under If-Match (412 → decide again).
    Replace,
    /// The stored version is the same or higher: nothing to do.
    SkipStale,
}

/// The guard: `existing` is the stored document's version, if any.
pub fn decide(existing: Option<u64>, incoming: u64) -> Decision {
    match existing {
        None => Decision::Create,
        Some(stored) if stored < incoming => Decision::Replace,
        Some(_) => Decision::SkipStale,
    }
}

/// Keeps, per key, the item with the highest version (the first of equal versions), in the order
/// the keys first appeared. Returns the survivors and how many items were dropped.
pub fn coalesce<T>(items: Vec<(String, u64, T)>) -> (Vec<(String, u64, T)>, usize) {
    let total = items.len();
    let mut index: HashMap<String, usize> = HashMap::with_capacity(total);
    let mut kept: Vec<(String, u64, T)> = Vec::with_capacity(total);
    for (key, version, item) in items {
        match index.get(&key) {
            Some(&at) => {
                if version > kept[at].1 {
                    kept[at] = (key, version, item);
                }
            }
            None => {
                index.insert(key.clone(), kept.len());
                kept.push((key, version, item));
            }
        }
    }
    let dropped = total - kept.len();
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn guard_only_moves_forward() {
        assert_eq!(decide(None, 1), Decision::Create);
        assert_eq!(decide(Some(1), 2), Decision::Replace);
        assert_eq!(decide(Some(2), 2), Decision::SkipStale);
        assert_eq!(decide(Some(3), 2), Decision::SkipStale);
    }

    proptest! {
        /// Applying any sequence of versions through the guard leaves the maximum, whatever the
        /// order, duplication or batching — the property replays and redeliveries rely on.
        #[test]
        fn any_order_ends_at_the_maximum(versions in proptest::collection::vec(1u64..50, 1..40),
                                         batch in 1usize..8) {
            let mut stored: Option<u64> = None;
            for chunk in versions.chunks(batch) {
                let items = chunk.iter().map(|v| ("k".to_owned(), *v, ())).collect();
                let (survivors, _) = coalesce(items);
                for (_, version, ()) in survivors {
                    match decide(stored, version) {
                        Decision::Create | Decision::Replace => stored = Some(version),
                        Decision::SkipStale => {}
                    }
                }
            }
            prop_assert_eq!(stored, versions.iter().copied().max());
        }

        /// Coalescing keeps exactly one item per key, with that key's highest version.
        #[test]
        fn coalesce_keeps_the_highest_per_key(items in proptest::collection::vec((0u8..6, 1u64..20), 0..60)) {
            let input: Vec<(String, u64, usize)> = items
                .iter()
                .enumerate()
                .map(|(i, (key, version))| (format!("F{key}"), *version, i))
                .collect();
            let (kept, dropped) = coalesce(input.clone());
            prop_assert_eq!(kept.len() + dropped, input.len());
            let mut best: HashMap<String, u64> = HashMap::new();
            for (key, version, _) in &input {
                let entry = best.entry(key.clone()).or_insert(*version);
                *entry = (*entry).max(*version);
            }
            prop_assert_eq!(kept.len(), best.len());
            for (key, version, _) in &kept {
                prop_assert_eq!(best.get(key), Some(version));
            }
        }
    }
}
