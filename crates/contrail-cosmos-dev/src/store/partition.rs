//! One physical partition: its documents ordered by (effective partition key, id), and its change
//! feed — the latest version of each document indexed by `_lsn`, so a read of what changed after a
//! continuation costs O(log n + page), however many documents the partition holds.

use std::collections::BTreeMap;
use std::ops::Bound;

/// The end of the effective-partition-key space as the service writes it in a range (`"FF"`).
pub const EPK_END: u128 = u128::MAX;

/// Where a hash V2 key space ends: the hash keeps the low 126 bits. Splits halve ranges of this
/// space, so the last range's `"FF"` counts as this value when its middle is computed.
const V2_SPACE_END: u128 = 1 << 126;

/// A document's place in its container: effective partition key, then id.
pub type DocKey = (u128, Box<str>);

/// A stored document version.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The whole document as served, system properties included (`_rid … _lsn`).
    pub body: Box<str>,
    /// The write that produced this version (also its ETag).
    pub lsn: u64,
    /// The document's resource number, kept across replaces (its `_rid`).
    pub rid: u64,
}

/// A physical partition (a partition key range of the service).
#[derive(Debug)]
pub struct Partition {
    /// The range id (`x-ms-documentdb-partitionkeyrangeid`).
    pub id: u32,
    /// Inclusive lower bound (0 is `""`).
    pub min: u128,
    /// Exclusive upper bound ([`EPK_END`] is `"FF"`).
    pub max: u128,
    /// The ranges this one was split from, oldest first.
    pub parents: Vec<u32>,
    docs: BTreeMap<DocKey, Stored>,
    feed: BTreeMap<u64, DocKey>,
}

impl Partition {
    /// An empty partition.
    pub fn new(id: u32, min: u128, max: u128, parents: Vec<u32>) -> Partition {
        Partition {
            id,
            min,
            max,
            parents,
            docs: BTreeMap::new(),
            feed: BTreeMap::new(),
        }
    }

    /// Whether `epk` falls in this range.
    pub fn holds(&self, epk: u128) -> bool {
        self.min <= epk && epk < self.max
    }

    /// Number of documents.
    pub fn document_count(&self) -> usize {
        self.docs.len()
    }

    /// The stored version of a document.
    pub fn get(&self, key: &DocKey) -> Option<&Stored> {
        self.docs.get(key)
    }

    /// Stores a new version of a document: it leaves the feed at its old `_lsn` and enters at its
    /// new one (latest-version change feed).
    pub fn put(&mut self, key: DocKey, stored: Stored) {
        let lsn = stored.lsn;
        if let Some(old) = self.docs.insert(key.clone(), stored) {
            self.feed.remove(&old.lsn);
        }
        self.feed.insert(lsn, key);
    }

    /// Removes a document (a deletion does not appear in the latest-version change feed).
    pub fn remove(&mut self, key: &DocKey) -> Option<Stored> {
        let old = self.docs.remove(key)?;
        self.feed.remove(&old.lsn);
        Some(old)
    }

    /// The newest `_lsn` in this partition's feed.
    pub fn last_lsn(&self) -> Option<u64> {
        self.feed.keys().next_back().copied()
    }

    /// Up to `limit` changes after `after` (by `_lsn`, oldest first), only those whose key lies in
    /// `[within.0, within.1)` when given (a feed range narrower than the partition).
    pub fn changes_after(&self, after: u64, limit: usize, within: Option<(u128, u128)>) -> Vec<&Stored> {
        self.feed
            .range((Bound::Excluded(after), Bound::Unbounded))
            .filter(|(_, key)| within.is_none_or(|(low, high)| low <= key.0 && key.0 < high))
            .filter_map(|(_, key)| self.docs.get(key))
            .take(limit)
            .collect()
    }

    /// Documents in key order after `after` (exclusive), from the start when `None`.
    pub fn scan_after<'a>(
        &'a self,
        after: Option<&DocKey>,
    ) -> impl Iterator<Item = (&'a DocKey, &'a Stored)> + 'a {
        let start = match after {
            Some(key) => Bound::Excluded(key.clone()),
            None => Bound::Unbounded,
        };
        self.docs.range((start, Bound::Unbounded))
    }

    /// Splits the range at the middle of its key space into two children with the given ids,
    /// each taking its documents and their feed entries.
    pub fn split(self, left_id: u32, right_id: u32) -> (Partition, Partition) {
        let top = if self.max == EPK_END {
            V2_SPACE_END
        } else {
            self.max
        };
        let middle = self.min + (top.saturating_sub(self.min)) / 2;
        // The whole lineage, as the service lists it: a reader holding a grandparent's
        // continuation finds its descendants.
        let mut lineage = self.parents.clone();
        lineage.push(self.id);
        let mut left = Partition::new(left_id, self.min, middle, lineage.clone());
        let mut right = Partition::new(right_id, middle, self.max, lineage);
        for (key, stored) in self.docs {
            if key.0 < middle {
                left.put(key, stored);
            } else {
                right.put(key, stored);
            }
        }
        (left, right)
    }
}

/// The hex form of a range bound: `""` for the start, `"FF"` for the end, 32 digits otherwise.
pub fn bound_hex(bound: u128) -> String {
    match bound {
        0 => String::new(),
        EPK_END => "FF".to_owned(),
        value => format!("{value:032X}"),
    }
}

/// Parses an effective partition key or range bound as the client writes it: uppercase or
/// lowercase hex, `""` the start, `"FF"` the end, shorter keys padded with zeros on the right.
pub fn parse_epk(hex: &str) -> Option<u128> {
    if hex.is_empty() {
        return Some(0);
    }
    if hex.eq_ignore_ascii_case("FF") {
        return Some(EPK_END);
    }
    if hex.len() > 32 || !hex.len().is_multiple_of(2) {
        return None;
    }
    let value = u128::from_str_radix(hex, 16).ok()?;
    let shift = u32::try_from((32 - hex.len()) * 4).ok()?;
    value.checked_shl(shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(lsn: u64) -> Stored {
        Stored {
            body: format!("{{\"_lsn\":{lsn}}}").into_boxed_str(),
            lsn,
            rid: lsn,
        }
    }

    fn key(epk: u128, id: &str) -> DocKey {
        (epk, id.into())
    }

    #[test]
    fn the_feed_holds_only_the_latest_version_in_lsn_order() {
        let mut partition = Partition::new(0, 0, EPK_END, Vec::new());
        partition.put(key(5, "a"), stored(1));
        partition.put(key(3, "b"), stored(2));
        partition.put(key(5, "a"), stored(3));
        let all: Vec<u64> = partition
            .changes_after(0, 10, None)
            .iter()
            .map(|stored| stored.lsn)
            .collect();
        assert_eq!(all, vec![2, 3]);
        let after_two: Vec<u64> = partition
            .changes_after(2, 10, None)
            .iter()
            .map(|stored| stored.lsn)
            .collect();
        assert_eq!(after_two, vec![3]);
        assert_eq!(partition.changes_after(0, 1, None).len(), 1);
        assert_eq!(partition.last_lsn(), Some(3));
        partition.remove(&key(5, "a"));
        assert_eq!(partition.changes_after(0, 10, None).len(), 1);
        assert_eq!(partition.document_count(), 1);
    }

    #[test]
    fn a_narrower_range_sees_only_its_keys() {
        let mut partition = Partition::new(0, 0, EPK_END, Vec::new());
        partition.put(key(10, "a"), stored(1));
        partition.put(key(20, "b"), stored(2));
        partition.put(key(30, "c"), stored(3));
        let lsns: Vec<u64> = partition
            .changes_after(0, 10, Some((15, 30)))
            .iter()
            .map(|stored| stored.lsn)
            .collect();
        assert_eq!(lsns, vec![2]);
    }

    #[test]
    fn a_split_halves_the_v2_space_and_keeps_every_document_and_change() {
        let third = 3_u128 << 124;
        let mut partition = Partition::new(3, third, EPK_END, Vec::new());
        let low = third + 1;
        let high = (7_u128 << 123) + 5; // above the middle of [3·2^124, 2^126)
        partition.put(key(low, "low"), stored(1));
        partition.put(key(high, "high"), stored(2));
        let (left, right) = partition.split(4, 5);
        assert_eq!(left.min, third);
        assert_eq!(left.max, 7_u128 << 123);
        assert_eq!(right.min, 7_u128 << 123);
        assert_eq!(right.max, EPK_END);
        assert_eq!(left.parents, vec![3]);
        assert_eq!(left.changes_after(0, 10, None).len(), 1);
        assert_eq!(right.changes_after(0, 10, None)[0].lsn, 2);
        assert_eq!(bound_hex(right.min), "38000000000000000000000000000000");
    }

    #[test]
    fn bounds_and_keys_parse_as_the_client_writes_them() {
        assert_eq!(parse_epk(""), Some(0));
        assert_eq!(parse_epk("FF"), Some(EPK_END));
        assert_eq!(parse_epk("10000000000000000000000000000000"), Some(1 << 124));
        assert_eq!(parse_epk("10"), Some(1 << 124));
        assert_eq!(parse_epk("1"), None);
        assert_eq!(parse_epk("zz"), None);
        assert_eq!(bound_hex(0), "");
        assert_eq!(bound_hex(EPK_END), "FF");
        assert_eq!(parse_epk(&bound_hex(1 << 124)), Some(1 << 124));
    }
}
