//! The test and benchmark harness: real components, started as real processes, and the
//! independent expectations the cross-service tests in `tests/tests/` and the benchmarks in
//! `contrail-bench` check against.
//!
//! Processes and plumbing:
//! - [`Broker`]: a tansu Kafka-protocol broker on a free port (in-memory storage). One broker is
//!   shared by all tests of a process ([`shared_broker`]); a test that breaks its broker (SIGSTOP)
//!   starts its own with [`Broker::start`]. [`DurableBroker`]: one that keeps its records and
//!   consumer groups on disk (nisshi on SQLite), to `kill -9` and restart.
//! - [`StageProcess`]: a stage binary of this workspace as a child process, with its log in a file,
//!   `kill -9`, SIGTERM and readiness polling; [`IngestUnderTest`] is one for ingest.
//! - [`wait_until`]: every wait is on a condition, with a deadline that says what it saw last.
//! - [`read_topic`], [`TopicReader`]: read a whole topic back, every partition, no consumer group.
//!
//! Independent expectations, in [`oracles`] (code of their own, not the code under test):
//! [`oracles::dedup`] re-derives dedup-state's outputs over the raw records from docs/CONTRACT.md,
//! "Processing in dedup-state"; [`oracles::serving`] the serving documents from the events;
//! [`oracles::rotation`] the knock-on predictions from the newest states.
//!
//! Harness per store or stage (all of the harness is in `src/harness/`):
//! - [`dedup`]: the raw feed and dedup-state as a process (its oracle re-exported as `oracle`);
//! - [`delta`]: the Delta tables read back by an independent Python reader (`deltalake`);
//! - [`cosmos`]: the Cosmos DB endpoint stand-in and cosmos-writer / changefeed-sync processes;
//! - [`up`]: a whole `contrail up` platform; [`browser`]: headless Chromium over WebDriver.
//!
//! Children die with the test process (`PR_SET_PDEATHSIG`), so a failed test leaks no process.
#![allow(unsafe_code)] // prctl/kill on child processes.

mod harness;
pub mod oracles;

pub use harness::broker::{Broker, shared_broker, tansu_binary};
pub use harness::durable_broker::{DurableBroker, nisshi_binary};
pub use harness::fixture::{Moments, test_dir, unique, workspace_root};
pub use harness::http::{answers_200, http_get, http_post};
pub use harness::ingest::{IngestOptions, IngestUnderTest, event_ids, spawn_ingest, start_ingest};
pub use harness::process::{
    StageProcess, binary_dir, die_with_parent, free_port, send_signal, workspace_binary,
};
pub use harness::topic::{
    TopicReader, commit_group_offsets, create_topics, key_of, quiescent_ends, read_to_end,
    read_to_end_at_least, read_topic, recreate_topics, send_waiting, settled_ends, test_producer,
};
pub use harness::wait::{Probe, log_tail, wait_for_port, wait_until};
pub use harness::{azurite, browser, cosmos, dedup, delta, otlp, prometheus, up};
/// Signal numbers for [`send_signal`].
pub use libc;
pub use oracles::rotation;
