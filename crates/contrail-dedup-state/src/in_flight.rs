//! The count of outputs handed to the producer whose delivery report has not come back: what
//! holds consumption back when the broker is slow. Pure; property-tested.

use std::collections::HashMap;

/// Outputs handed to the producer and not yet reported, per (partition, generation of the
/// shard's open). Every report is counted off, whether its shard is still owned or not, and a
/// closed shard's entries go with it: the count cannot leak (pure; property-tested).
#[derive(Debug, Default)]
pub struct InFlight {
    counts: HashMap<(i32, u64), usize>,
}

impl InFlight {
    /// One output of `partition`/`generation` is being handed to the producer. Count it before
    /// the producer has it: its report may be applied, on another thread, before the hand-over
    /// returns, and a report with nothing to count off is ignored. One that was refused is counted
    /// off with [`InFlight::reported`].
    pub fn sent(&mut self, partition: i32, generation: u64) {
        *self.counts.entry((partition, generation)).or_default() += 1;
    }

    /// A delivery report came back (acknowledged or not).
    pub fn reported(&mut self, partition: i32, generation: u64) {
        if let Some(count) = self.counts.get_mut(&(partition, generation)) {
            *count -= 1;
            if *count == 0 {
                self.counts.remove(&(partition, generation));
            }
        }
    }

    /// The shard of `partition` was closed: its outstanding reports no longer count (the outputs
    /// are in its outbox, which the next owner re-sends).
    pub fn closed(&mut self, partition: i32) {
        self.counts.retain(|(owner, _), _| *owner != partition);
    }

    /// Outputs outstanding.
    pub fn total(&self) -> usize {
        self.counts.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Send(i32),
        Report,
        Close(i32),
        Reopen(i32),
    }

    proptest! {
        /// Whatever interleaving of sends, reports (in any order, for shards still owned or
        /// closed), closes and re-opens: the count is exactly the outputs of owned shards whose
        /// report has not come back, and it returns to 0 once every report arrived or its shard
        /// was closed — it can never stall consumption.
        #[test]
        fn the_in_flight_count_is_exact(
            steps in prop::collection::vec(
                prop_oneof![
                    (0i32..3).prop_map(Step::Send),
                    Just(Step::Report),
                    (0i32..3).prop_map(Step::Close),
                    (0i32..3).prop_map(Step::Reopen),
                ],
                0..80,
            ),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 80),
        ) {
            let mut in_flight = InFlight::default();
            let mut generation = [0u64; 3];
            let mut open = [true; 3];
            // Reports the producer still owes: (partition, generation).
            let mut owed: Vec<(i32, u64)> = Vec::new();
            let mut picks = picks.into_iter();
            for step in steps {
                match step {
                    Step::Send(partition) if open[partition as usize] => {
                        in_flight.sent(partition, generation[partition as usize]);
                        owed.push((partition, generation[partition as usize]));
                    }
                    Step::Send(_) => {}
                    Step::Report => {
                        if let (false, Some(pick)) = (owed.is_empty(), picks.next()) {
                            let (partition, generation) = owed.remove(pick.index(owed.len()));
                            in_flight.reported(partition, generation);
                        }
                    }
                    Step::Close(partition) => {
                        in_flight.closed(partition);
                        open[partition as usize] = false;
                    }
                    Step::Reopen(partition) => {
                        if !open[partition as usize] {
                            generation[partition as usize] += 1;
                            open[partition as usize] = true;
                        }
                    }
                }
                let expected = owed
                    .iter()
                    .filter(|(partition, owed_generation)| {
                        open[*partition as usize] && *owed_generation == generation[*partition as usize]
                    })
                    .count();
                prop_assert_eq!(in_flight.total(), expected);
            }
            for (partition, owed_generation) in owed.drain(..) {
                in_flight.reported(partition, owed_generation);
            }
            prop_assert_eq!(in_flight.total(), 0);
        }
    }
}
