//! Knock-on delay by aircraft rotation (pure): an aircraft (tail number) flies a chain of flights;
//! a flight cannot leave before its inbound flight — the same aircraft's previous flight — has
//! arrived and been turned around. From the newest `FlightState` of each flight of one tail,
//! [`predict`] propagates along the chain:
//!
//! - a flight that has left (actual out) left then; its arrival is its actual in, or its scheduled
//!   in moved by its departure delay (the estimated in when that is later);
//! - a flight still to leave leaves at the latest of its own estimate (scheduled out, or the
//!   estimated out when later) and the inbound's predicted in plus the minimum turn time; when the
//!   inbound sets it, the prediction names the inbound (`knock_on_from`);
//! - cancelled flights are not flown: the aircraft's next flight follows the last one it flies.
//!
//! The chain is the tail's flights ordered by (scheduled out, flight key). The predictions are a
//! function of the set of newest flight states only — whatever the order they arrived in (property
//! tested below).

use std::collections::BTreeMap;

use contrail_proto::v1::FlightState;

/// One microsecond-based minute.
pub const MINUTE_US: i64 = 60_000_000;

/// Minimum turn times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnRules {
    /// Minimum turn time of a flight's aircraft before it, µs (default 30 minutes).
    pub min_turn_us: i64,
    /// Per carrier (the outbound flight's), µs.
    pub per_carrier: BTreeMap<String, i64>,
    /// A prediction this far (µs) beyond the schedule, caused by the inbound, raises
    /// `KNOCK_ON_DELAY` (default 15 minutes).
    pub alert_after_us: i64,
}

impl Default for TurnRules {
    fn default() -> Self {
        TurnRules {
            min_turn_us: 30 * MINUTE_US,
            per_carrier: BTreeMap::new(),
            alert_after_us: 15 * MINUTE_US,
        }
    }
}

impl TurnRules {
    /// The minimum turn time before a flight of `carrier`.
    pub fn min_turn_of(&self, carrier: &str) -> i64 {
        self.per_carrier.get(carrier).copied().unwrap_or(self.min_turn_us)
    }
}

/// One flight's prediction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prediction {
    /// The flight.
    pub flight_key: String,
    /// Its scheduled out, µs.
    pub scheduled_out_us: i64,
    /// When it is predicted to leave (or left), µs.
    pub predicted_out_us: i64,
    /// When it is predicted to arrive (or arrived), µs; `None` without a scheduled or actual in.
    pub predicted_in_us: Option<i64>,
    /// The inbound flight whose predicted arrival plus the turn time sets `predicted_out_us`
    /// (later than the flight's own estimate).
    pub knock_on_from: Option<String>,
}

impl Prediction {
    /// Predicted out minus scheduled out, µs.
    pub fn delay_us(&self) -> i64 {
        self.predicted_out_us.saturating_sub(self.scheduled_out_us)
    }

    /// Whether it is a knock-on delay of at least `rules.alert_after_us`.
    pub fn is_knock_on_alert(&self, rules: &TurnRules) -> bool {
        self.knock_on_from.is_some() && self.delay_us() >= rules.alert_after_us
    }
}

/// Whether `state` takes part in a rotation: it has a tail and a scheduled out.
pub fn in_rotation(state: &FlightState) -> bool {
    state.scheduled_out_us.is_some() && state.tail_number.as_deref().is_some_and(|tail| !tail.is_empty())
}

/// The predictions of every flight of one tail from the newest state of each (any order; states
/// without a scheduled out are left out), in chain order. Cancelled flights get none.
pub fn predict(states: &[&FlightState], rules: &TurnRules) -> Vec<Prediction> {
    let mut chain: Vec<(&FlightState, i64)> = states
        .iter()
        .filter(|state| state.status != "CANCELLED")
        .filter_map(|state| state.scheduled_out_us.map(|out| (*state, out)))
        .collect();
    chain.sort_by(|(a, a_out), (b, b_out)| (a_out, &a.flight_key).cmp(&(b_out, &b.flight_key)));
    let mut predictions = Vec::with_capacity(chain.len());
    // The previous flown flight's predicted in and key.
    let mut inbound: Option<(i64, &str)> = None;
    for (state, scheduled_out) in chain {
        let (predicted_out, knock_on_from) = match state.actual_out_us {
            Some(actual) => (actual, None),
            None => {
                let own = state
                    .estimated_out_us
                    .map_or(scheduled_out, |estimate| estimate.max(scheduled_out));
                match inbound {
                    Some((arrival, key))
                        if arrival.saturating_add(rules.min_turn_of(&state.carrier)) > own =>
                    {
                        (
                            arrival.saturating_add(rules.min_turn_of(&state.carrier)),
                            Some(key.to_owned()),
                        )
                    }
                    _ => (own, None),
                }
            }
        };
        let predicted_in = state.actual_in_us.or_else(|| {
            let moved = state
                .scheduled_in_us
                .map(|scheduled_in| scheduled_in.saturating_add(predicted_out.saturating_sub(scheduled_out)));
            match (moved, state.estimated_in_us) {
                (Some(moved), Some(estimate)) => Some(moved.max(estimate)),
                (moved, estimate) => moved.or(estimate),
            }
        });
        // Without an arrival the next flight has no inbound to wait for.
        inbound = predicted_in.map(|arrival| (arrival, state.flight_key.as_str()));
        predictions.push(Prediction {
            flight_key: state.flight_key.clone(),
            scheduled_out_us: scheduled_out,
            predicted_out_us: predicted_out,
            predicted_in_us: predicted_in,
            knock_on_from,
        });
    }
    predictions
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HOUR: i64 = 60 * MINUTE_US;

    fn leg(key: &str, out_h: i64, in_h: i64) -> FlightState {
        FlightState {
            flight_key: key.to_owned(),
            carrier: "UA".to_owned(),
            tail_number: Some("N1".to_owned()),
            status: "SCHEDULED".to_owned(),
            scheduled_out_us: Some(out_h * HOUR),
            scheduled_in_us: Some(in_h * HOUR),
            version: 1,
            ..FlightState::default()
        }
    }

    #[test]
    fn a_late_inbound_pushes_the_next_flight_and_the_delay_propagates() {
        let mut first = leg("A", 6, 8);
        first.actual_out_us = Some(7 * HOUR); // left an hour late: arrives 9:00
        let second = leg("B", 9, 11); // needs 9:30 at the earliest
        let third = leg("C", 11, 13); // B arrives 11:30 → 12:00
        let fourth = leg("D", 15, 17); // enough slack
        let predictions = predict(&[&fourth, &second, &first, &third], &TurnRules::default());
        let summary: Vec<(&str, i64, Option<&str>)> = predictions
            .iter()
            .map(|p| {
                (
                    p.flight_key.as_str(),
                    p.predicted_out_us,
                    p.knock_on_from.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("A", 7 * HOUR, None),
                ("B", 9 * HOUR + 30 * MINUTE_US, Some("A")),
                ("C", 12 * HOUR, Some("B")),
                ("D", 15 * HOUR, None),
            ]
        );
        assert!(predictions[1].is_knock_on_alert(&TurnRules::default()));
        assert!(predictions[2].is_knock_on_alert(&TurnRules::default()));
        assert!(!predictions[3].is_knock_on_alert(&TurnRules::default()));
        assert_eq!(predictions[3].predicted_in_us, Some(17 * HOUR));
    }

    #[test]
    fn cancelled_flights_are_skipped_and_carrier_turn_times_apply() {
        let mut first = leg("A", 6, 8);
        first.actual_in_us = Some(9 * HOUR);
        let mut cancelled = leg("B", 9, 10);
        cancelled.status = "CANCELLED".to_owned();
        let mut third = leg("C", 9, 11);
        third.carrier = "B6".to_owned();
        let rules = TurnRules {
            per_carrier: [("B6".to_owned(), 45 * MINUTE_US)].into(),
            ..TurnRules::default()
        };
        let predictions = predict(&[&first, &cancelled, &third], &rules);
        assert_eq!(predictions.len(), 2);
        assert_eq!(predictions[1].predicted_out_us, 9 * HOUR + 45 * MINUTE_US);
        assert_eq!(predictions[1].knock_on_from.as_deref(), Some("A"));
    }

    #[test]
    fn extreme_times_do_not_overflow() {
        let mut first = leg("A", 0, 0);
        first.scheduled_out_us = Some(i64::MIN);
        first.scheduled_in_us = Some(i64::MAX);
        first.actual_out_us = Some(i64::MAX);
        let mut second = leg("B", 0, 0);
        second.scheduled_out_us = Some(i64::MAX);
        second.estimated_out_us = Some(i64::MIN);
        let predictions = predict(&[&first, &second], &TurnRules::default());
        assert_eq!(predictions.len(), 2);
        assert_eq!(predictions[0].delay_us(), i64::MAX);
    }

    #[test]
    fn an_estimate_later_than_the_inbound_is_the_flights_own() {
        let first = leg("A", 6, 8);
        let mut second = leg("B", 8, 10);
        second.estimated_out_us = Some(10 * HOUR);
        let predictions = predict(&[&first, &second], &TurnRules::default());
        assert_eq!(predictions[1].predicted_out_us, 10 * HOUR);
        assert_eq!(predictions[1].knock_on_from, None);
    }

    /// Versions of flights of one tail, each a later version of the previous one of its flight.
    fn versions() -> impl Strategy<Value = Vec<FlightState>> {
        prop::collection::vec(
            (
                0usize..5,
                0i64..24,
                1i64..5,
                prop::option::of(-30i64..240),
                any::<bool>(),
            ),
            1..40,
        )
        .prop_map(|updates| {
            let mut version: BTreeMap<usize, u64> = BTreeMap::new();
            updates
                .into_iter()
                .map(|(flight, out_h, block_h, delay_min, cancelled)| {
                    let counter = version.entry(flight).or_default();
                    *counter += 1;
                    let mut state = leg(&format!("F{flight}"), out_h, out_h + block_h);
                    state.version = *counter;
                    state.estimated_out_us = delay_min.map(|delay| out_h * HOUR + delay * MINUTE_US);
                    if cancelled && (*counter).is_multiple_of(3) {
                        state.status = "CANCELLED".to_owned();
                    }
                    state
                })
                .collect()
        })
    }

    /// The newest version of each flight among `states`, whatever their order.
    fn newest(states: &[FlightState]) -> Vec<&FlightState> {
        let mut by_key: BTreeMap<&str, &FlightState> = BTreeMap::new();
        for state in states {
            let entry = by_key.entry(&state.flight_key).or_insert(state);
            if state.version > entry.version {
                *entry = state;
            }
        }
        by_key.into_values().collect()
    }

    proptest! {
        /// Any arrival order (and redelivered copies) of the flights' versions gives the same
        /// predictions, and every prediction respects the chain: never before the flight's own
        /// schedule (unless it left earlier) and never before its inbound's arrival + turn time.
        #[test]
        fn any_arrival_order_gives_the_same_predictions(
            states in versions(),
            order in prop::collection::vec(any::<prop::sample::Index>(), 0..60),
        ) {
            let rules = TurnRules::default();
            let expected = predict(&newest(&states), &rules);
            let mut shuffled = states.clone();
            for (i, index) in order.iter().enumerate() {
                let len = shuffled.len();
                shuffled.swap(i % len, index.index(len));
            }
            shuffled.extend(states.iter().take(order.len() % 4).cloned());
            // `predict` itself gets the flights in the shuffled order, not sorted.
            let mut given = newest(&shuffled);
            for (i, index) in order.iter().enumerate() {
                let len = given.len();
                given.swap(i % len, index.index(len));
            }
            prop_assert_eq!(&predict(&given, &rules), &expected);
            for pair in expected.windows(2) {
                let (inbound, outbound) = (&pair[0], &pair[1]);
                prop_assert!(outbound.predicted_out_us >= outbound.scheduled_out_us);
                if let Some(arrival) = inbound.predicted_in_us {
                    prop_assert!(outbound.predicted_out_us >= arrival + rules.min_turn_us);
                }
            }
        }
    }
}
