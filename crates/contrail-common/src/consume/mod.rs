//! What every consuming stage does the same way, written once: where a partition stands and what
//! a gap in it is ([`position`], pure), and sending a record it cannot process to the
//! dead-letter topic ([`dead_letters`]).

pub mod dead_letters;
pub mod position;

pub use dead_letters::DeadLetters;
pub use position::{GAP_RETRIES, Gap, Placement, judge_gap, place, resume_at};
