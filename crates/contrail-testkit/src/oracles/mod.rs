//! The independent expectations: what the stages must output, computed from the inputs and the
//! contract (docs/CONTRACT.md) in code of their own, not with the code under test. Everything else
//! in this crate is the harness (processes, brokers, endpoints, readers).

pub mod dedup;
pub mod fold;
pub mod rotation;
pub mod serving;
