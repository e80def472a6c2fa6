//! One module per command of the `contrail` tool (`contrail <command> --help` says what each does).

pub(crate) mod admin;
pub(crate) mod alerts;
pub(crate) mod backfill;
pub(crate) mod board;
pub(crate) mod flights;
pub(crate) mod replay;
pub(crate) mod reprocess;
pub(crate) mod up;
