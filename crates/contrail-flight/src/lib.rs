//! The flight logic of the dedup-state stage (docs/CONTRACT.md, "Processing in dedup-state"): the
//! fold of operational events into a `FlightState`, and the per-event decision — duplicate, late,
//! or accepted in (event_time, event_id) order with `version` = accepted count — plus the
//! DEPARTURE_OVERDUE timer rule and the TTLs. Everything here is pure; the stateful engine
//! (`contrail-state`) stores the results.

pub mod document;
pub mod flight;
pub mod fold;
pub mod rotation;

pub use flight::{Rules, Verdict, decide};
