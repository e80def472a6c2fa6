//! The harness: real components as real processes (brokers, endpoints, stages, readers), the
//! plumbing to start, wait for and read them. Re-exported at the crate root.

pub mod azurite;
pub(crate) mod broker;
pub mod browser;
pub mod cosmos;
pub mod dedup;
pub mod delta;
pub(crate) mod durable_broker;
pub(crate) mod fixture;
pub(crate) mod http;
pub(crate) mod ingest;
pub mod otlp;
pub(crate) mod process;
pub mod prometheus;
pub(crate) mod topic;
pub mod up;
pub(crate) mod wait;
