//! The independent expectation of the rotation processor (knock-on delay by aircraft rotation),
//! written apart from `contrail_flight::rotation`: per tail, the newest state of each flight
//! (highest version), the chain in scheduled order, each departure the later of the flight's own
//! estimate and the previous flown flight's arrival + 30 minutes; the arrival is the actual in, or
//! the scheduled in moved by the departure's delay (the estimated in when later).

use std::collections::BTreeMap;

use contrail_proto::v1::FlightState;

const MINUTE: i64 = 60_000_000;
/// The default minimum turn time.
pub const TURN: i64 = 30 * MINUTE;
/// The default alert threshold.
pub const ALERT_AFTER: i64 = 15 * MINUTE;

/// A flight's expected final prediction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedPrediction {
    /// Predicted (or actual) out, µs.
    pub departure: i64,
    /// Predicted (or actual) in, µs.
    pub arrival: Option<i64>,
    /// The inbound flight setting the departure; empty when the flight's own times do.
    pub cause: String,
    /// Whether a KNOCK_ON_DELAY alert is raised: set by the inbound, 15 minutes or more beyond
    /// the schedule, not departed.
    pub alert: bool,
}

/// Whether `state` belongs to a rotation (the rotation processor's input holds only these).
pub fn has_rotation(state: &FlightState) -> bool {
    state.scheduled_out_us.is_some() && state.tail_number.as_deref().is_some_and(|tail| !tail.is_empty())
}

/// The final prediction of every flown flight (cancelled flights have none) from `states`, any
/// order, copies and older versions included.
pub fn expected_predictions(states: &[FlightState]) -> BTreeMap<String, ExpectedPrediction> {
    let mut newest: BTreeMap<String, FlightState> = BTreeMap::new();
    for state in states.iter().filter(|state| has_rotation(state)) {
        let keep = newest
            .get(&state.flight_key)
            .is_none_or(|kept| kept.version < state.version);
        if keep {
            newest.insert(state.flight_key.clone(), state.clone());
        }
    }
    let mut by_tail: BTreeMap<String, Vec<FlightState>> = BTreeMap::new();
    for state in newest.into_values() {
        by_tail
            .entry(state.tail_number.clone().unwrap_or_default())
            .or_default()
            .push(state);
    }
    let mut expected = BTreeMap::new();
    for (_, mut flights) in by_tail {
        flights.sort_by_key(|state| {
            (
                state.scheduled_out_us.unwrap_or_default(),
                state.flight_key.clone(),
            )
        });
        let mut previous_arrival: Option<(i64, String)> = None;
        for state in flights {
            if state.status == "CANCELLED" {
                continue;
            }
            let scheduled = state.scheduled_out_us.unwrap_or_default();
            let mut cause = String::new();
            let departure = if let Some(actual) = state.actual_out_us {
                actual
            } else {
                let mut own = scheduled;
                if let Some(estimate) = state.estimated_out_us
                    && estimate > own
                {
                    own = estimate;
                }
                match &previous_arrival {
                    Some((arrival, key)) if arrival + TURN > own => {
                        cause = key.clone();
                        arrival + TURN
                    }
                    _ => own,
                }
            };
            let arrival = match state.actual_in_us {
                Some(actual) => Some(actual),
                None => {
                    let shifted = state.scheduled_in_us.map(|time| time + (departure - scheduled));
                    [shifted, state.estimated_in_us].into_iter().flatten().max()
                }
            };
            previous_arrival = arrival.map(|time| (time, state.flight_key.clone()));
            let alert =
                !cause.is_empty() && state.actual_out_us.is_none() && departure - scheduled >= ALERT_AFTER;
            expected.insert(
                state.flight_key.clone(),
                ExpectedPrediction {
                    departure,
                    arrival,
                    cause,
                    alert,
                },
            );
        }
    }
    expected
}
