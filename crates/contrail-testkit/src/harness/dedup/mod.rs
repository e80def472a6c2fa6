//! Helpers for dedup-state tests: real nycflights13 events on the raw topic, the stage as a real
//! process, and an oracle that computes — independently of the stage's code — what dedup-state
//! must output for the records on the raw topic.
//!
//! The oracle re-implements the decisions of docs/CONTRACT.md's "Processing in dedup-state"
//! (dedup with TTL, per-key lateness, state TTL, version = accepted count) from the contract's
//! text, in a few lines of maps; only the fold itself (`contrail_flight::fold`, property-tested on
//! its own) is shared with the stage.
//!
//! Three rooms: [`feed`] (the events on the raw topic), [`oracle`] (the expectation and the check
//! of the outputs against it, in [`crate::oracles::dedup`]) and [`stage`] (the process and its
//! admin API).

pub mod feed;
pub mod stage;

/// The expectation, in [`crate::oracles`].
pub use crate::oracles::dedup as oracle;

pub use feed::{RawRecord, produce_events, raw_records, realistic_feed, replay_events};
pub use oracle::*;
pub use stage::*;
