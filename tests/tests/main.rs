//! Every cross-service test, one module per file of this directory, linked into one binary
//! (`cargo nextest run -E 'test(/^dedup_state::/)'` runs one file's tests). Each file says what it
//! proves; the harness they share is `contrail-testkit`.

mod auth;
mod build_sharing;
mod changefeed_sync;
mod contrail_up;
mod cosmos_dev;
mod cosmos_writer;
mod dedup_state;
mod delta_archiver;
mod deploy;
mod durable_broker;
mod exactly_once;
mod gaps;
mod ingest_api;
mod ingest_resilience;
mod large_restore;
mod layering;
mod module_loops;
mod poison;
mod replay_cli;
mod stage_catalog;
