//! Identity de-duplication over a window of offsets (pure, I/O-free).
//!
//! Upstream stages never use Kafka transactions, so a topic may hold a redelivered record after a
//! crash (dedup-state re-sends its outbox, changefeed-sync re-publishes a page whose continuation
//! it had not stored). Such a copy is byte-identical and close to the original: it lies within the
//! producer's in-flight window. The archiver therefore drops a record when its identity occurred at
//! an offset in `[offset - span, offset)` of the same partition.
//!
//! The decision depends only on the topic's contents, never on when the archiver started: after a
//! restart at offset `n`, replaying `[n - span, n)` through [`RecentIdentities::observe`] (a
//! warm-up whose answers are ignored) rebuilds exactly the window a process that never stopped
//! would have. A replayed batch is therefore decided identically, which is what makes the
//! combination "seek to the stored Delta version + 1, then de-duplicate" exactly-once per identity.

use std::collections::{HashMap, VecDeque};

/// The identities of one partition's recent records.
#[derive(Debug, Clone)]
pub struct RecentIdentities {
    span: i64,
    order: VecDeque<(i64, Box<str>)>,
    latest: HashMap<Box<str>, i64>,
}

impl RecentIdentities {
    /// A window of `span` offsets (0 turns de-duplication off).
    pub fn new(span: i64) -> RecentIdentities {
        RecentIdentities {
            span: span.max(0),
            order: VecDeque::new(),
            latest: HashMap::new(),
        }
    }

    /// The first offset a warm-up must replay before resuming at `next` (never below `low`, the
    /// partition's first retained offset).
    pub fn warm_up_from(&self, next: i64, low: i64) -> i64 {
        (next - self.span).max(low).max(0)
    }

    /// Records the identity at `offset` and answers whether it is new, i.e. did not occur in
    /// `[offset - span, offset)`. Offsets must be observed in increasing order.
    pub fn observe(&mut self, offset: i64, identity: &str) -> bool {
        if self.span == 0 {
            return true;
        }
        let horizon = offset - self.span;
        while let Some((front, _)) = self.order.front() {
            if *front >= horizon {
                break;
            }
            if let Some((old_offset, old_identity)) = self.order.pop_front()
                && self.latest.get(&old_identity) == Some(&old_offset)
            {
                self.latest.remove(&old_identity);
            }
        }
        let seen = self.latest.contains_key(identity);
        let identity: Box<str> = identity.into();
        self.latest.insert(identity.clone(), offset);
        self.order.push_back((offset, identity));
        !seen
    }

    /// Identities currently remembered.
    pub fn len(&self) -> usize {
        self.latest.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.latest.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A topic partition: identities drawn from a small alphabet so duplicates are frequent.
    fn partition() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(0u8..40, 0..400)
    }

    fn decide_all(window: &mut RecentIdentities, records: &[u8], from: usize) -> Vec<bool> {
        records
            .iter()
            .enumerate()
            .skip(from)
            .map(|(offset, id)| window.observe(offset as i64, &id.to_string()))
            .collect()
    }

    proptest! {
        /// The decision for a record is exactly "its identity did not occur in the span before it".
        #[test]
        fn matches_the_definition(records in partition(), span in 0i64..60) {
            let mut window = RecentIdentities::new(span);
            let decisions = decide_all(&mut window, &records, 0);
            for (offset, id) in records.iter().enumerate() {
                let start = (offset as i64 - span).max(0) as usize;
                let expected_new = span == 0 || !records[start..offset].contains(id);
                prop_assert_eq!(decisions[offset], expected_new, "offset {}", offset);
            }
        }

        /// A restart at any offset, with the warm-up replay, decides every later record exactly as
        /// a process that never stopped.
        #[test]
        fn a_restart_with_warm_up_decides_identically(
            records in partition(),
            span in 0i64..60,
            restart in 0usize..400,
        ) {
            let restart = restart.min(records.len());
            let mut continuous = RecentIdentities::new(span);
            let reference = decide_all(&mut continuous, &records, 0);

            let mut restarted = RecentIdentities::new(span);
            let from = restarted.warm_up_from(restart as i64, 0) as usize;
            for (offset, id) in records.iter().enumerate().take(restart).skip(from) {
                restarted.observe(offset as i64, &id.to_string());
            }
            let resumed = decide_all(&mut restarted, &records, restart);
            prop_assert_eq!(&reference[restart..], &resumed[..]);
        }

        /// Memory is bounded by the span.
        #[test]
        fn remembers_at_most_span_identities(records in partition(), span in 1i64..60) {
            let mut window = RecentIdentities::new(span);
            for (offset, id) in records.iter().enumerate() {
                window.observe(offset as i64, &id.to_string());
                prop_assert!(window.len() as i64 <= span + 1);
            }
        }
    }

    #[test]
    fn a_redelivery_inside_the_span_is_dropped_and_outside_is_kept() {
        let mut window = RecentIdentities::new(3);
        assert!(window.observe(10, "a"));
        assert!(window.observe(11, "b"));
        assert!(!window.observe(12, "a"), "a at 10 is within [9, 12)");
        assert!(window.observe(16, "a"), "the last a (12) is outside [13, 16)");
    }
}
