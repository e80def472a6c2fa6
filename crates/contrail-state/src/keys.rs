//! Byte layouts of the shard's column families. Every layout sorts correctly as raw bytes, so
//! RocksDB's order is the order the engine needs (timers by time then key; a key's entries together).

/// Column families of a shard.
pub mod cf {
    /// Per-key state variables: `key ∙ 0x00 ∙ variable [∙ 0x00 ∙ map key]`.
    pub const VALUES: &str = "values";
    /// Timers by fire time: `time ∙ domain ∙ key ∙ 0x00 ∙ name`.
    pub const TIMERS_BY_TIME: &str = "timers_by_time";
    /// Timers by key: no longer written (the by-key index is in memory, rebuilt from
    /// [`TIMERS_BY_TIME`]); kept so that shards written by earlier versions open, and cleared on
    /// open.
    pub const TIMERS_BY_KEY: &str = "timers_by_key";
    /// Dedup entries: `key ∙ 0x00 ∙ id` → expiry time.
    pub const DEDUP: &str = "dedup";
    /// Shard metadata: input offset, max event time.
    pub const META: &str = "meta";
    /// Outputs not yet acknowledged by the broker: sequence number → record.
    pub const OUTBOX: &str = "outbox";
    /// All of them, in creation order.
    pub const ALL: [&str; 6] = [VALUES, TIMERS_BY_TIME, TIMERS_BY_KEY, DEDUP, META, OUTBOX];
}

/// Separator between a key and what follows. Keys must not contain it (flight keys never do;
/// [`crate::StateError::InvalidKey`] otherwise).
pub const SEPARATOR: u8 = 0x00;

/// `i64` → 8 bytes that sort like the numbers (sign bit flipped, big-endian).
pub fn encode_time(time: i64) -> [u8; 8] {
    ((time as u64) ^ (1 << 63)).to_be_bytes()
}

/// Inverse of [`encode_time`].
pub fn decode_time(bytes: &[u8]) -> Option<i64> {
    let array: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    Some((u64::from_be_bytes(array) ^ (1 << 63)) as i64)
}

/// `key ∙ 0x00 ∙ part`.
pub fn joined(key: &[u8], part: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(key.len() + 1 + part.len());
    bytes.extend_from_slice(key);
    bytes.push(SEPARATOR);
    bytes.extend_from_slice(part);
    bytes
}

/// The prefix of everything stored under `key` in a key-first family.
pub fn key_prefix(key: &[u8]) -> Vec<u8> {
    joined(key, &[])
}

/// A map variable's entry: `key ∙ 0x00 ∙ variable ∙ 0x00 ∙ map key`.
pub fn map_entry(key: &[u8], variable: &str, map_key: &[u8]) -> Vec<u8> {
    let mut bytes = joined(key, variable.as_bytes());
    bytes.push(SEPARATOR);
    bytes.extend_from_slice(map_key);
    bytes
}

/// Prefix of all entries of a map variable.
pub fn map_prefix(key: &[u8], variable: &str) -> Vec<u8> {
    map_entry(key, variable, &[])
}

/// The smallest byte string greater than every string with this prefix, for range ends.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    vec![u8::MAX; prefix.len() + 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn time_encoding_preserves_order(a in any::<i64>(), b in any::<i64>()) {
            prop_assert_eq!(a.cmp(&b), encode_time(a).cmp(&encode_time(b)));
            prop_assert_eq!(decode_time(&encode_time(a)), Some(a));
        }

        #[test]
        fn prefix_end_bounds_every_extension(prefix in prop::collection::vec(any::<u8>(), 1..6), tail in prop::collection::vec(any::<u8>(), 0..6)) {
            let mut extended = prefix.clone();
            extended.extend(tail);
            let end = prefix_end(&prefix);
            prop_assert!(extended.as_slice() < end.as_slice());
            prop_assert!(prefix.as_slice() < end.as_slice());
        }
    }
}
