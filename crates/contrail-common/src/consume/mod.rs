//! What every consuming stage does the same way, written once: the consume → effect → commit
//! loop ([`frame`]), where a partition stands and what
//! a gap in it is ([`position`], pure), rebalances recorded for the loop ([`rebalance`]), how far
//! behind each partition is ([`standing`]), sending a record it cannot process to the
//! dead-letter topic ([`dead_letters`]), and holding a partition whose stored position the topic
//! no longer has until an operator accepts the gap ([`gaps`], and [`gap_watch`] on the polling
//! thread).

pub mod dead_letters;
pub mod frame;
pub mod gap_watch;
pub mod gaps;
pub mod position;
pub mod rebalance;
pub mod standing;

pub use dead_letters::DeadLetters;
pub use frame::{Effect, Frame, Points, Start, group_positions};
pub use gap_watch::{Accepted, GapWatch};
pub use gaps::Gaps;
pub use position::{GAP_RETRIES, Jump, Placement, judge_jump, place};
pub use rebalance::{RebalanceEvent, Rebalances, RecordingConsumer, RecordingContext, TopicPartition};
pub use standing::{Standing, standings, standings_off_runtime};
