//! contrail's stateful stream engine, independent of airlines.
//!
//! - [`Shard`]: one RocksDB instance per input partition, with column families for values, timers
//!   (by time and by key), dedup entries, metadata (the input offset) and an outbox.
//! - [`StatefulProcessor`] / [`KeyContext`]: the `transformWithState`-like API — typed value, list
//!   and map state with a TTL per variable, dedup entries, event- and processing-time timers, and
//!   outputs. [`Shard::process_batch`] commits state, timers, outputs and the input offset of a
//!   micro-batch in ONE write batch: after a crash the shard is exactly at a batch boundary, and its
//!   outbox holds every output not yet acknowledged.
//! - [`protocol`]: the checkpoint protocol's decisions as pure functions (completeness, garbage
//!   collection, restore plan, resume offset).
//! - [`checkpoints::CheckpointStore`]: RocksDB checkpoints uploaded to an `object_store` (a local
//!   directory by default), epoch manifests, restore and garbage collection.

pub mod checkpoints;
pub mod engine;
pub mod error;
pub mod keys;
pub mod protocol;
pub mod shard;

pub use engine::{BatchResult, EngineConfig, InputRecord, KeyContext, StatefulProcessor, inspect};
pub use error::StateError;
pub use shard::{
    Checkpointer, GIVE_UP_EVERY, HeldSummary, OutboxRecord, Shard, ShardMemory, ShardProgress, StorageMemory,
    TimeDomain, Timer,
};
