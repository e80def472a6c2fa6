//! The history tables (docs/CONTRACT.md, "Stores") as a contract of their own: what
//! `delta-archiver` writes and what the tools (`contrail up`'s checks, `contrail store`, the
//! flight board, the benchmarks) read back.
//!
//! - [`tables`]: the six tables, their partition columns and Delta schemas.
//! - [`location`]: where a table lives below the Delta root (a local directory or a URL).
//! - [`reader`]: reading a table's current snapshot without a query engine.
//!
//! Depending on this crate instead of the stage keeps the tools free of the stage's broker
//! client and gives both sides one definition of the schema.

pub mod error;
pub mod location;
pub mod reader;
pub mod tables;

pub use deltalake::arrow;
pub use error::HistoryError;
pub use tables::{Kind, Table};
