//! The chaos of `contrail up`: which stage to kill next.

/// A seeded chaos schedule: rounds in which every stage is killed once, in a shuffled order, so
/// every stage is hit equally often.
pub struct ChaosPlan {
    state: u64,
    round: Vec<usize>,
    stages: usize,
}

impl ChaosPlan {
    /// A plan over `stages` stages.
    pub fn new(seed: u64, stages: usize) -> ChaosPlan {
        ChaosPlan {
            state: seed ^ 0x9E37_79B9_7F4A_7C15,
            round: Vec::new(),
            stages,
        }
    }

    fn next_random(&mut self) -> u64 {
        // splitmix64
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The index of the next stage to kill.
    pub fn next_victim(&mut self) -> usize {
        if self.round.is_empty() {
            self.round = (0..self.stages).collect();
            for i in (1..self.round.len()).rev() {
                let j = (self.next_random() % (i as u64 + 1)) as usize;
                self.round.swap(i, j);
            }
        }
        self.round.pop().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chaos_kills_every_stage_once_per_round() {
        let mut plan = ChaosPlan::new(7, 5);
        for _ in 0..4 {
            let mut round: Vec<usize> = (0..5).map(|_| plan.next_victim()).collect();
            round.sort_unstable();
            assert_eq!(round, vec![0, 1, 2, 3, 4]);
        }
        let first: Vec<usize> = {
            let mut a = ChaosPlan::new(7, 5);
            (0..10).map(|_| a.next_victim()).collect()
        };
        let again: Vec<usize> = {
            let mut b = ChaosPlan::new(7, 5);
            (0..10).map(|_| b.next_victim()).collect()
        };
        assert_eq!(first, again, "same seed, same schedule");
    }
}
