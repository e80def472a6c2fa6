//! The cross-service tests live in `tests/tests/` (one binary, `tests/tests/main.rs`); this
//! package holds no library code. Their harness (processes, broker, oracles, store readers) is
//! the `contrail-testkit` crate.
