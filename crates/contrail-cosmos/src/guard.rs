//! The version guard, as a pure function.
//!
//! A flight's document may only move forward: it is created when missing, replaced when the
//! incoming version is higher, and left alone otherwise. (Coalescing — writing only the newest
//! version a flight has in the write window — is cosmos-writer's.)

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
        fn any_order_ends_at_the_maximum(versions in proptest::collection::vec(1u64..50, 1..40)) {
            let mut stored: Option<u64> = None;
            for version in &versions {
                match decide(stored, *version) {
                    Decision::Create | Decision::Replace => stored = Some(*version),
                    Decision::SkipStale => {}
                }
            }
            prop_assert_eq!(stored, versions.iter().copied().max());
        }
    }
}
