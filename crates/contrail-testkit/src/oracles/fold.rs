//! The fold, modelled apart from `contrail_flight::fold` (docs/CONTRACT.md, "Fold"): written from
//! the contract's table of which event type writes which field, as "each field holds the newest
//! value written to it, in (event_time, event_id) order" — one question per field over the
//! ordered events — where the stage's fold steps a state through the events one at a time. A
//! mistake in either shows as a difference between them.

use contrail_proto::v1::{EventData, EventType, FlightState, OperationalEvent};

/// How many delay codes a state keeps: the newest (docs/CONTRACT.md, "Bounded state").
const DELAY_CODES_KEPT: usize = 32;

const MINUTE_US: i64 = 60_000_000;

/// The state of a flight after `events` (any order, one flight, no duplicates; at least one),
/// without `version` and `input`, which the caller sets.
pub fn folded_state(events: &[&OperationalEvent]) -> FlightState {
    let mut ordered: Vec<&OperationalEvent> = events.to_vec();
    ordered.sort_by(|a, b| (a.event_time_us, &a.event_id).cmp(&(b.event_time_us, &b.event_id)));
    let Some(newest_event) = ordered.last() else {
        return FlightState::default();
    };
    let flight = ordered[0].flight.clone().unwrap_or_default();
    let data = |event: &OperationalEvent| event.data.clone().unwrap_or_default();
    let kind = |event: &OperationalEvent| EventType::try_from(event.r#type).unwrap_or(EventType::Unspecified);
    // The newest value that an event of one of `types` writes (`None`: none writes one).
    let newest = |types: &[EventType], field: fn(&EventData) -> Option<String>| {
        ordered
            .iter()
            .rev()
            .filter(|event| types.contains(&kind(event)))
            .find_map(|event| field(&data(event)))
    };
    let newest_time = |types: &[EventType], field: fn(&EventData) -> Option<i64>| {
        ordered
            .iter()
            .rev()
            .filter(|event| types.contains(&kind(event)))
            .find_map(|event| field(&data(event)))
    };
    // OUT, OFF, ON and IN: the newest such event's own time.
    let actual = |of: EventType| {
        ordered
            .iter()
            .rev()
            .find(|event| kind(event) == of)
            .map(|event| event.event_time_us)
    };
    // The estimated departure: written by ESTIMATED (its estimate) and by DELAYED (the schedule
    // known at that moment plus the delay, when both are known).
    let estimated_out = ordered
        .iter()
        .enumerate()
        .rev()
        .find_map(|(index, event)| match kind(event) {
            EventType::Estimated => data(event).estimated_out_us,
            EventType::Delayed => {
                let minutes = data(event).delay_minutes?;
                let scheduled = ordered[..index]
                    .iter()
                    .rev()
                    .filter(|earlier| kind(earlier) == EventType::Scheduled)
                    .find_map(|earlier| data(earlier).scheduled_out_us)?;
                Some(scheduled + i64::from(minutes) * MINUTE_US)
            }
            _ => None,
        });
    let codes: Vec<String> = ordered
        .iter()
        .filter(|event| kind(event) == EventType::Delayed)
        .filter_map(|event| data(event).delay_code)
        .collect();
    let status = ordered.iter().rev().find_map(|event| {
        Some(match kind(event) {
            EventType::Scheduled => "SCHEDULED",
            EventType::Boarding => "BOARDING",
            EventType::Out => "DEPARTED",
            EventType::Off => "AIRBORNE",
            EventType::On => "LANDED",
            EventType::In => "ARRIVED",
            EventType::Cancelled => "CANCELLED",
            EventType::Diverted => "DIVERTED",
            _ => return None,
        })
    });
    use EventType::{Delayed, Diverted, Estimated, GateAssigned, Out, Scheduled, TailAssigned};
    FlightState {
        flight_key: ordered[0].flight_key.clone(),
        carrier: flight.carrier,
        flight_number: flight.number,
        origin: flight.origin,
        service_date: flight.service_date,
        destination: newest(&[Scheduled], |data| data.destination.clone()),
        status: status.unwrap_or_default().to_owned(),
        scheduled_out_us: newest_time(&[Scheduled], |data| data.scheduled_out_us),
        scheduled_in_us: newest_time(&[Scheduled], |data| data.scheduled_in_us),
        estimated_out_us: estimated_out,
        estimated_in_us: newest_time(&[Estimated], |data| data.estimated_in_us),
        actual_out_us: actual(EventType::Out),
        actual_off_us: actual(EventType::Off),
        actual_on_us: actual(EventType::On),
        actual_in_us: actual(EventType::In),
        gate: newest(&[GateAssigned, Out], |data| data.gate.clone()),
        terminal: newest(&[GateAssigned], |data| data.terminal.clone()),
        tail_number: newest(&[Scheduled, TailAssigned], |data| data.tail_number.clone()),
        delay_minutes: ordered
            .iter()
            .rev()
            .filter(|event| kind(event) == Delayed)
            .find_map(|event| data(event).delay_minutes),
        delay_codes: codes[codes.len().saturating_sub(DELAY_CODES_KEPT)..].to_vec(),
        diverted_to: newest(&[Diverted], |data| data.diverted_to.clone()),
        version: 0,
        last_event_id: newest_event.event_id.clone(),
        last_event_time_us: newest_event.event_time_us,
        updated_at_us: newest_event.event_time_us,
        input: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use contrail_proto::v1::FlightRef;
    use proptest::prelude::*;

    fn event(id: &str, kind: EventType, minute: i64, data: EventData) -> OperationalEvent {
        OperationalEvent {
            event_id: id.to_owned(),
            r#type: kind as i32,
            event_time_us: minute * MINUTE_US,
            flight_key: "UA1-2013-01-01-EWR".to_owned(),
            flight: Some(FlightRef {
                carrier: "UA".to_owned(),
                number: 1,
                origin: "EWR".to_owned(),
                service_date: "2013-01-01".to_owned(),
            }),
            data: Some(data),
            ..OperationalEvent::default()
        }
    }

    /// A flight's day written out by hand: each expected field read off the contract's table.
    #[test]
    fn a_flights_day_folds_to_the_state_written_out_by_hand() {
        let events = [
            event(
                "s",
                EventType::Scheduled,
                0,
                EventData {
                    scheduled_out_us: Some(600 * MINUTE_US),
                    scheduled_in_us: Some(780 * MINUTE_US),
                    destination: Some("ORD".into()),
                    tail_number: Some("N1".into()),
                    ..EventData::default()
                },
            ),
            event(
                "g",
                EventType::GateAssigned,
                500,
                EventData {
                    gate: Some("C1".into()),
                    terminal: Some("C".into()),
                    ..EventData::default()
                },
            ),
            event(
                "d",
                EventType::Delayed,
                550,
                EventData {
                    delay_minutes: Some(20),
                    delay_code: Some("WX".into()),
                    ..EventData::default()
                },
            ),
            event(
                "t",
                EventType::TailAssigned,
                560,
                EventData {
                    tail_number: Some("N2".into()),
                    ..EventData::default()
                },
            ),
            event(
                "o",
                EventType::Out,
                625,
                EventData {
                    gate: Some("C9".into()),
                    ..EventData::default()
                },
            ),
            event("f", EventType::Off, 640, EventData::default()),
        ];
        // Arrival order is not fold order.
        let arrived: Vec<&OperationalEvent> = events.iter().rev().collect();
        let state = folded_state(&arrived);
        assert_eq!(state.status, "AIRBORNE");
        assert_eq!(state.scheduled_out_us, Some(600 * MINUTE_US));
        assert_eq!(
            state.estimated_out_us,
            Some(620 * MINUTE_US),
            "schedule + 20 minutes"
        );
        assert_eq!(state.actual_out_us, Some(625 * MINUTE_US));
        assert_eq!(state.actual_off_us, Some(640 * MINUTE_US));
        assert_eq!(state.actual_on_us, None);
        assert_eq!(state.gate.as_deref(), Some("C9"), "OUT's gate is newer");
        assert_eq!(state.terminal.as_deref(), Some("C"));
        assert_eq!(state.tail_number.as_deref(), Some("N2"));
        assert_eq!(state.destination.as_deref(), Some("ORD"));
        assert_eq!(state.delay_minutes, Some(20));
        assert_eq!(state.delay_codes, ["WX"]);
        assert_eq!(state.last_event_id, "f");
        assert_eq!(state.updated_at_us, 640 * MINUTE_US);
    }

    /// A delay before any schedule sets no estimate; the newest 32 codes are kept.
    #[test]
    fn a_delay_without_a_schedule_sets_no_estimate_and_codes_keep_the_newest_32() {
        let delays: Vec<OperationalEvent> = (0..40)
            .map(|minute| {
                event(
                    &format!("d{minute:02}"),
                    EventType::Delayed,
                    minute,
                    EventData {
                        delay_minutes: Some(5),
                        delay_code: Some(format!("C{minute}")),
                        ..EventData::default()
                    },
                )
            })
            .collect();
        let state = folded_state(&delays.iter().collect::<Vec<_>>());
        assert_eq!(state.estimated_out_us, None);
        assert_eq!(state.delay_codes.len(), 32);
        assert_eq!(state.delay_codes[0], "C8");
        assert_eq!(state.status, "", "DELAYED bears no status");
    }

    /// An event of any type (unknown ones included), any minute (ties broken by id), any of its
    /// data fields present or not.
    fn any_event(index: usize, type_number: i32, minute: i64, present: [bool; 6]) -> OperationalEvent {
        let value = index as i64;
        let text = |prefix: &str, on: bool| on.then(|| format!("{prefix}{index}"));
        let data = EventData {
            scheduled_out_us: present[0].then_some((600 + value) * MINUTE_US),
            scheduled_in_us: present[0].then_some((700 + value) * MINUTE_US),
            destination: text("D", present[5]),
            tail_number: text("N", present[5]),
            estimated_out_us: present[4].then_some((610 + value) * MINUTE_US),
            estimated_in_us: present[4].then_some((710 + value) * MINUTE_US),
            gate: text("G", present[1]),
            terminal: text("T", present[1] && present[5]),
            delay_minutes: present[2].then_some(index as i32),
            delay_code: text("C", present[3]),
            reason: None,
            diverted_to: text("X", present[5]),
        };
        let mut event = event(&format!("e{index:03}"), EventType::Unspecified, minute, data);
        event.r#type = type_number;
        event
    }

    proptest! {
        /// The model and the stage's fold (`contrail_flight::fold`) agree on any events in any
        /// arrival order: written apart, a mistake in either one shows here.
        #[test]
        fn the_model_and_the_stages_fold_agree(
            specs in prop::collection::vec((0i32..14, 0i64..90, any::<[bool; 6]>()), 1..60),
        ) {
            let events: Vec<OperationalEvent> = specs
                .iter()
                .enumerate()
                .map(|(index, (type_number, minute, present))| any_event(index, *type_number, *minute, *present))
                .collect();
            let arrived: Vec<&OperationalEvent> = events.iter().collect();
            let model = folded_state(&arrived);
            let mut ordered = arrived.clone();
            ordered.sort_by(|a, b| {
                contrail_flight::fold::order_key(a).cmp(&contrail_flight::fold::order_key(b))
            });
            let mut stage = contrail_flight::fold::empty_state(ordered[0]);
            for event in ordered {
                contrail_flight::fold::apply(&mut stage, event);
            }
            prop_assert_eq!(model, stage);
        }
    }
}
