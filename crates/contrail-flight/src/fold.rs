//! The fold of operational events into a [`FlightState`] (docs/CONTRACT.md, "Fold"). Pure.

use contrail_proto::v1::{EventType, FlightState, OperationalEvent};

/// Status names, as stored in `FlightState.status`.
pub mod status {
    /// SCHEDULED seen.
    pub const SCHEDULED: &str = "SCHEDULED";
    /// BOARDING seen.
    pub const BOARDING: &str = "BOARDING";
    /// OUT: pushed back from the gate.
    pub const DEPARTED: &str = "DEPARTED";
    /// OFF: wheels up.
    pub const AIRBORNE: &str = "AIRBORNE";
    /// ON: wheels down.
    pub const LANDED: &str = "LANDED";
    /// IN: at the arrival gate.
    pub const ARRIVED: &str = "ARRIVED";
    /// CANCELLED.
    pub const CANCELLED: &str = "CANCELLED";
    /// DIVERTED.
    pub const DIVERTED: &str = "DIVERTED";
}

/// Most delay codes a `FlightState` keeps: the newest in fold order (per-key state is bounded,
/// docs/CONTRACT.md). A real flight has a handful; a feed that repeats DELAYED thousands of times
/// must not grow the state without end.
pub const MAX_DELAY_CODES: usize = 32;

/// An empty state for a flight, identified by its key and the event's flight reference.
pub fn empty_state(event: &OperationalEvent) -> FlightState {
    let flight = event.flight.clone().unwrap_or_default();
    FlightState {
        flight_key: event.flight_key.clone(),
        carrier: flight.carrier,
        flight_number: flight.number,
        origin: flight.origin,
        service_date: flight.service_date,
        ..FlightState::default()
    }
}

/// Applies one event to a state. The caller applies events in (event_time, event_id) order; the
/// version and provenance are set by the caller.
pub fn apply(state: &mut FlightState, event: &OperationalEvent) {
    let data = event.data.clone().unwrap_or_default();
    let event_type = EventType::try_from(event.r#type).unwrap_or(EventType::Unspecified);
    match event_type {
        EventType::Scheduled => {
            set_if_some(&mut state.scheduled_out_us, data.scheduled_out_us);
            set_if_some(&mut state.scheduled_in_us, data.scheduled_in_us);
            set_if_some(&mut state.destination, data.destination);
            set_if_some(&mut state.tail_number, data.tail_number);
            state.status = status::SCHEDULED.to_owned();
        }
        EventType::Estimated => {
            set_if_some(&mut state.estimated_out_us, data.estimated_out_us);
            set_if_some(&mut state.estimated_in_us, data.estimated_in_us);
        }
        EventType::GateAssigned => {
            set_if_some(&mut state.gate, data.gate);
            set_if_some(&mut state.terminal, data.terminal);
        }
        EventType::Boarding => state.status = status::BOARDING.to_owned(),
        EventType::Delayed => {
            if let Some(minutes) = data.delay_minutes {
                state.delay_minutes = Some(minutes);
                if let Some(scheduled_out) = state.scheduled_out_us {
                    state.estimated_out_us = Some(scheduled_out + i64::from(minutes) * 60_000_000);
                }
            }
            if let Some(code) = data.delay_code {
                if state.delay_codes.len() >= MAX_DELAY_CODES {
                    // Bounded per-key state: the oldest code makes room (the fold's order is
                    // deterministic, so which ones are kept is too).
                    let excess = state.delay_codes.len() + 1 - MAX_DELAY_CODES;
                    state.delay_codes.drain(..excess);
                }
                state.delay_codes.push(code);
            }
        }
        EventType::TailAssigned => set_if_some(&mut state.tail_number, data.tail_number),
        EventType::Out => {
            state.actual_out_us = Some(event.event_time_us);
            set_if_some(&mut state.gate, data.gate);
            state.status = status::DEPARTED.to_owned();
        }
        EventType::Off => {
            state.actual_off_us = Some(event.event_time_us);
            state.status = status::AIRBORNE.to_owned();
        }
        EventType::On => {
            state.actual_on_us = Some(event.event_time_us);
            state.status = status::LANDED.to_owned();
        }
        EventType::In => {
            state.actual_in_us = Some(event.event_time_us);
            state.status = status::ARRIVED.to_owned();
        }
        EventType::Cancelled => state.status = status::CANCELLED.to_owned(),
        EventType::Diverted => {
            set_if_some(&mut state.diverted_to, data.diverted_to);
            state.status = status::DIVERTED.to_owned();
        }
        EventType::Unspecified => {}
    }
    state.last_event_id = event.event_id.clone();
    state.last_event_time_us = event.event_time_us;
    state.updated_at_us = state.updated_at_us.max(event.event_time_us);
}

fn set_if_some<T>(target: &mut Option<T>, value: Option<T>) {
    if value.is_some() {
        *target = value;
    }
}

/// The (event_time, event_id) order in which events are applied.
pub fn order_key(event: &OperationalEvent) -> (i64, &str) {
    (event.event_time_us, event.event_id.as_str())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use contrail_proto::v1::{EventData, FlightRef};

    /// A test event of flight UA1 from EWR on 2013-01-01 at `minute` (µs = minute · 60 s).
    pub(crate) fn event(id: &str, event_type: EventType, minute: i64, data: EventData) -> OperationalEvent {
        OperationalEvent {
            event_id: id.to_owned(),
            r#type: event_type as i32,
            event_time_us: minute * 60_000_000,
            flight_key: "UA1-2013-01-01-EWR".to_owned(),
            flight: Some(FlightRef {
                carrier: "UA".into(),
                number: 1,
                origin: "EWR".into(),
                service_date: "2013-01-01".into(),
            }),
            data: Some(data),
            ..OperationalEvent::default()
        }
    }

    #[test]
    fn a_flight_through_its_life() {
        let events = [
            event(
                "s",
                EventType::Scheduled,
                0,
                EventData {
                    scheduled_out_us: Some(600 * 60_000_000),
                    destination: Some("IAH".into()),
                    ..EventData::default()
                },
            ),
            event(
                "g",
                EventType::GateAssigned,
                480,
                EventData {
                    gate: Some("C71".into()),
                    ..EventData::default()
                },
            ),
            event(
                "d",
                EventType::Delayed,
                570,
                EventData {
                    delay_minutes: Some(20),
                    delay_code: Some("93".into()),
                    ..EventData::default()
                },
            ),
            event("o", EventType::Out, 620, EventData::default()),
            event("f", EventType::Off, 640, EventData::default()),
        ];
        let mut state = empty_state(&events[0]);
        for event in &events {
            apply(&mut state, event);
        }
        assert_eq!(state.status, status::AIRBORNE);
        assert_eq!(state.gate.as_deref(), Some("C71"));
        assert_eq!(
            state.estimated_out_us,
            Some(620 * 60_000_000),
            "scheduled_out + delay"
        );
        assert_eq!(state.delay_codes, ["93"]);
        assert_eq!(state.actual_out_us, Some(620 * 60_000_000));
        assert_eq!(state.actual_off_us, Some(640 * 60_000_000));
        assert_eq!(state.last_event_id, "f");
        assert_eq!((state.carrier.as_str(), state.flight_number), ("UA", 1));
    }

    /// Thousands of DELAYED events on one flight: the state keeps the newest 32 codes, in order.
    #[test]
    fn delay_codes_keep_the_newest_thirty_two() {
        let mut state = FlightState::default();
        for n in 0..5_000 {
            let delayed = event(
                &format!("d{n}"),
                EventType::Delayed,
                n,
                EventData {
                    delay_minutes: Some(5),
                    delay_code: Some(format!("c{n}")),
                    ..EventData::default()
                },
            );
            apply(&mut state, &delayed);
        }
        let expected: Vec<String> = (4_968..5_000).map(|n| format!("c{n}")).collect();
        assert_eq!(state.delay_codes, expected);
    }

    #[test]
    fn status_follows_the_last_status_event_only() {
        let mut state = FlightState::default();
        apply(
            &mut state,
            &event("b", EventType::Boarding, 1, EventData::default()),
        );
        apply(
            &mut state,
            &event("g", EventType::GateAssigned, 2, EventData::default()),
        );
        apply(
            &mut state,
            &event("e", EventType::Estimated, 3, EventData::default()),
        );
        assert_eq!(state.status, status::BOARDING);
        apply(
            &mut state,
            &event("c", EventType::Cancelled, 4, EventData::default()),
        );
        assert_eq!(state.status, status::CANCELLED);
    }

    /// docs/CONTRACT.md's "Fold" as a table: each event type applied to the same prior state, with
    /// the whole resulting state written out field by field (not derived from `apply`).
    #[test]
    fn every_event_type_sets_exactly_the_fields_of_the_contract() {
        const MINUTE: i64 = 60_000_000;
        let prior = FlightState {
            flight_key: "UA1-2013-01-01-EWR".to_owned(),
            carrier: "UA".to_owned(),
            flight_number: 1,
            origin: "EWR".to_owned(),
            service_date: "2013-01-01".to_owned(),
            status: status::SCHEDULED.to_owned(),
            scheduled_out_us: Some(600 * MINUTE),
            scheduled_in_us: Some(800 * MINUTE),
            destination: Some("IAH".to_owned()),
            tail_number: Some("N14228".to_owned()),
            gate: Some("C70".to_owned()),
            delay_codes: vec!["81".to_owned()],
            delay_minutes: Some(5),
            last_event_id: "prior".to_owned(),
            last_event_time_us: 100 * MINUTE,
            updated_at_us: 100 * MINUTE,
            ..FlightState::default()
        };
        let at = 700 * MINUTE;
        let after = |change: &dyn Fn(&mut FlightState)| {
            let mut expected = prior.clone();
            expected.last_event_id = "e".to_owned();
            expected.last_event_time_us = at;
            expected.updated_at_us = at;
            change(&mut expected);
            expected
        };
        let cases: Vec<(EventType, EventData, FlightState)> = vec![
            (
                EventType::Scheduled,
                EventData {
                    scheduled_out_us: Some(610 * MINUTE),
                    scheduled_in_us: Some(810 * MINUTE),
                    destination: Some("ORD".to_owned()),
                    tail_number: Some("N24211".to_owned()),
                    ..EventData::default()
                },
                after(&|s| {
                    s.scheduled_out_us = Some(610 * MINUTE);
                    s.scheduled_in_us = Some(810 * MINUTE);
                    s.destination = Some("ORD".to_owned());
                    s.tail_number = Some("N24211".to_owned());
                    s.status = "SCHEDULED".to_owned();
                }),
            ),
            (
                EventType::Estimated,
                EventData {
                    estimated_out_us: Some(615 * MINUTE),
                    estimated_in_us: Some(815 * MINUTE),
                    ..EventData::default()
                },
                after(&|s| {
                    s.estimated_out_us = Some(615 * MINUTE);
                    s.estimated_in_us = Some(815 * MINUTE);
                }),
            ),
            (
                EventType::GateAssigned,
                EventData {
                    gate: Some("C71".to_owned()),
                    terminal: Some("C".to_owned()),
                    ..EventData::default()
                },
                after(&|s| {
                    s.gate = Some("C71".to_owned());
                    s.terminal = Some("C".to_owned());
                }),
            ),
            (
                EventType::Boarding,
                EventData::default(),
                after(&|s| s.status = "BOARDING".to_owned()),
            ),
            (
                EventType::Delayed,
                EventData {
                    delay_minutes: Some(45),
                    delay_code: Some("93".to_owned()),
                    ..EventData::default()
                },
                after(&|s| {
                    s.delay_minutes = Some(45);
                    s.delay_codes = vec!["81".to_owned(), "93".to_owned()];
                    s.estimated_out_us = Some(645 * MINUTE);
                }),
            ),
            (
                EventType::TailAssigned,
                EventData {
                    tail_number: Some("N66051".to_owned()),
                    ..EventData::default()
                },
                after(&|s| s.tail_number = Some("N66051".to_owned())),
            ),
            (
                EventType::Out,
                EventData {
                    gate: Some("C72".to_owned()),
                    ..EventData::default()
                },
                after(&|s| {
                    s.actual_out_us = Some(700 * MINUTE);
                    s.gate = Some("C72".to_owned());
                    s.status = "DEPARTED".to_owned();
                }),
            ),
            (
                EventType::Off,
                EventData::default(),
                after(&|s| {
                    s.actual_off_us = Some(700 * MINUTE);
                    s.status = "AIRBORNE".to_owned();
                }),
            ),
            (
                EventType::On,
                EventData::default(),
                after(&|s| {
                    s.actual_on_us = Some(700 * MINUTE);
                    s.status = "LANDED".to_owned();
                }),
            ),
            (
                EventType::In,
                EventData::default(),
                after(&|s| {
                    s.actual_in_us = Some(700 * MINUTE);
                    s.status = "ARRIVED".to_owned();
                }),
            ),
            (
                EventType::Cancelled,
                EventData {
                    reason: Some("weather".to_owned()),
                    ..EventData::default()
                },
                after(&|s| s.status = "CANCELLED".to_owned()),
            ),
            (
                EventType::Diverted,
                EventData {
                    diverted_to: Some("AUS".to_owned()),
                    ..EventData::default()
                },
                after(&|s| {
                    s.diverted_to = Some("AUS".to_owned());
                    s.status = "DIVERTED".to_owned();
                }),
            ),
        ];
        assert_eq!(
            cases.len(),
            12,
            "every event type of docs/CONTRACT.md, \"Events\""
        );
        for (event_type, data, expected) in cases {
            let mut state = prior.clone();
            apply(&mut state, &event("e", event_type, 700, data));
            assert_eq!(state, expected, "{event_type:?}");
        }
        // Optional fields absent from the event leave the state as it was.
        let mut state = prior.clone();
        apply(
            &mut state,
            &event("e", EventType::GateAssigned, 700, EventData::default()),
        );
        assert_eq!(state.gate.as_deref(), Some("C70"));
        // A DELAYED without a schedule has no estimate to derive.
        let mut unscheduled = FlightState::default();
        let delayed = EventData {
            delay_minutes: Some(10),
            ..EventData::default()
        };
        apply(&mut unscheduled, &event("d", EventType::Delayed, 1, delayed));
        assert_eq!(
            (unscheduled.delay_minutes, unscheduled.estimated_out_us),
            (Some(10), None)
        );
    }
}
