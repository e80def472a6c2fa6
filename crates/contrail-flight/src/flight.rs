//! What dedup-state decides for one event of one flight (docs/CONTRACT.md, "Processing in dedup-state"):
//! duplicate, late, or accepted — and, when accepted, the new per-flight state and the
//! `FlightState` to emit. Pure: the caller supplies whether the event id was seen, the end of the
//! flight's service date and the shard watermark, and persists the result.
//!
//! Invariant (property-tested): for any arrival order and any duplication of a flight's events
//! within the lateness bound, the final `FlightState` and `version` are those of folding the distinct
//! events in (event_time, event_id) order.

use contrail_proto::state::v1::{FlightKeyState, SeenEvent};
use contrail_proto::v1::{EventType, FlightState, OperationalEvent, SourcePosition};

use crate::fold::{apply, empty_state, order_key, status};

/// The default of [`Rules::max_events_per_flight`]: a real flight has tens of events; a source
/// that sends thousands of distinct ones for one flight is broken, and its events are
/// dead-lettered past this rather than growing the flight's stored record without end.
pub const DEFAULT_MAX_EVENTS_PER_FLIGHT: u64 = 2_048;

/// The rules of docs/CONTRACT.md, "Processing in dedup-state" (times in microseconds of event
/// time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// How far behind the key's newest event an event may be and still be applied (default 1 h).
    pub allowed_lateness_us: i64,
    /// How long after its event time a dedup entry is kept (default 72 h).
    pub dedup_ttl_us: i64,
    /// How long a flight's state is kept after the later of its service date's end and its last
    /// event (default 48 h): see [`horizon_us`].
    pub state_ttl_us: i64,
    /// DEPARTURE_OVERDUE fires this long after `scheduled_out` without OUT/CANCELLED (15 min).
    pub overdue_after_us: i64,
    /// How far ahead of the processing clock an event time may be (plausible time, 1 h).
    pub max_clock_skew_us: i64,
    /// Most events a flight accepts in its life (default 2,048): its stored dedup entries and
    /// pending events never exceed it, so one flight's stored record stays bounded however many
    /// distinct events a source sends for it. A new event past it is [`Verdict::Full`].
    pub max_events_per_flight: u64,
}

impl Default for Rules {
    fn default() -> Self {
        const HOUR: i64 = 3_600_000_000;
        Rules {
            allowed_lateness_us: HOUR,
            dedup_ttl_us: 72 * HOUR,
            state_ttl_us: 48 * HOUR,
            overdue_after_us: 15 * 60_000_000,
            max_clock_skew_us: HOUR,
            max_events_per_flight: DEFAULT_MAX_EVENTS_PER_FLIGHT,
        }
    }
}

/// Why an event is late (docs/CONTRACT.md, "Lateness" and "Lifetime"). Carried on the
/// late event (`late_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateReason {
    /// Older than its flight's watermark (the flight's newest event − `allowed_lateness`).
    Lateness,
    /// Its flight's horizon is behind the shard watermark: the flight no longer operates, and
    /// applying the event would restart its versions.
    Expired,
}

impl LateReason {
    /// The `late_reason` text on the late event.
    pub fn as_str(self) -> &'static str {
        match self {
            LateReason::Lateness => "lateness",
            LateReason::Expired => "expired",
        }
    }
}

/// The verdict on one event.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Its event id was already accepted for this flight: dropped and counted.
    Duplicate,
    /// Not applied: to `ops.events.late`.
    Late {
        /// The watermark it missed, µs: the flight's watermark (`lateness`) or its horizon
        /// (`expired`).
        watermark_us: i64,
        /// Why.
        reason: LateReason,
    },
    /// Not applied: the flight already accepted `limit` events ([`Rules::max_events_per_flight`]).
    /// Dead-lettered with the reason; the flight's state stays as it was.
    Full {
        /// The limit it reached.
        limit: u64,
    },
    /// Applied: emit `state` (version = accepted count) and the event itself.
    Accepted {
        /// The new `FlightState`.
        state: Box<FlightState>,
    },
}

/// The end of the service date written in `flight_key` (00:00 UTC of the day after
/// `flight.date`), µs; `None` for a key not of the form `{carrier}{number}-{date}-{origin}`.
pub fn service_end_us(flight_key: &str) -> Option<i64> {
    contrail_events::service_date_of_key(flight_key)
        .map(|date| contrail_events::date_start_us(date).saturating_add(contrail_events::DAY_US))
}

/// A flight's *horizon*: max(end of its service date, its latest accepted event time) +
/// `state_ttl`. The flight lives while the shard watermark is before it; once the watermark
/// reaches it the flight is expired, its state can go, and every further event of it is late
/// (`expired`). Decided from the key (`service_end_us`, see [`service_end_us`]) and the stored
/// state if any: without a stored state the horizon is the service date's alone, which is never
/// later than the horizon the deleted state had, so expiry holds with or without a tombstone and a
/// flight's versions never restart.
pub fn horizon_us(service_end_us: i64, key_state: Option<&FlightKeyState>, rules: &Rules) -> i64 {
    let newest = key_state.map_or(i64::MIN, |state| state.max_event_time_us);
    service_end_us.max(newest).saturating_add(rules.state_ttl_us)
}

/// Whether a flight is expired: its horizon is at or behind the shard watermark.
pub fn is_expired(
    service_end_us: i64,
    key_state: Option<&FlightKeyState>,
    shard_watermark_us: i64,
    rules: &Rules,
) -> bool {
    horizon_us(service_end_us, key_state, rules) <= shard_watermark_us
}

/// Decides on `event` for a flight whose stored record is `key_state` (`None`: a flight never
/// seen, or whose record was deleted after it expired). `service_end_us`: the end of the service
/// date in the event's key ([`service_end_us`]). `already_seen`: a live dedup entry for the event id
/// kept outside `key_state` (the engine's dedup family, written by earlier versions); the ids
/// accepted into `key_state` are checked here, and the event's id is added to them when accepted.
/// `shard_watermark_us`: the shard's max event time − `allowed_lateness`, with this event
/// observed. In order:
/// 1. a live dedup entry (in `key_state`'s `seen`, or `already_seen` from elsewhere) → duplicate;
/// 2. the flight's horizon is at or behind the shard watermark → late, `expired`;
/// 3. older than the flight's watermark (its newest event − `allowed_lateness`) → late;
/// 4. the flight already accepted `max_events_per_flight` events → full (not applied);
/// 5. otherwise accepted: `key_state` is updated in place (created for a new flight).
pub fn decide(
    key_state: &mut Option<FlightKeyState>,
    event: &OperationalEvent,
    input: &SourcePosition,
    already_seen: bool,
    service_end_us: i64,
    shard_watermark_us: i64,
    rules: &Rules,
) -> Verdict {
    let horizon = horizon_us(service_end_us, key_state.as_ref(), rules);
    if already_seen
        || key_state
            .as_ref()
            .is_some_and(|state| has_seen(state, &event.event_id, horizon, shard_watermark_us))
    {
        return Verdict::Duplicate;
    }
    if horizon <= shard_watermark_us {
        return Verdict::Late {
            watermark_us: horizon,
            reason: LateReason::Expired,
        };
    }
    if let Some(state) = key_state.as_ref() {
        let watermark_us = state.max_event_time_us.saturating_sub(rules.allowed_lateness_us);
        if event.event_time_us < watermark_us {
            return Verdict::Late {
                watermark_us,
                reason: LateReason::Lateness,
            };
        }
        if state.accepted >= rules.max_events_per_flight {
            return Verdict::Full {
                limit: rules.max_events_per_flight,
            };
        }
    }
    let state = key_state.get_or_insert_with(|| FlightKeyState {
        base: Some(empty_state(event)),
        pending: Vec::new(),
        max_event_time_us: i64::MIN,
        accepted: 0,
        overdue_alerted: false,
        seen: Vec::new(),
        overdue_resolved: false,
        overdue_fired_at_us: 0,
        rotation_tail: String::new(),
    });
    state
        .seen
        .retain(|seen| entry_is_live(seen.expires_at_us, horizon, shard_watermark_us));
    state.seen.push(SeenEvent {
        event_id: event.event_id.clone(),
        expires_at_us: dedup_expiry(event, service_end_us, rules),
    });
    let position = state
        .pending
        .partition_point(|pending| order_key(pending) < order_key(event));
    let mut stored = event.clone();
    stored.input = Some(input.clone());
    state.pending.insert(position, stored);
    state.max_event_time_us = state.max_event_time_us.max(event.event_time_us);
    state.accepted += 1;

    // Events below the new watermark are final: fold them into the base.
    let new_watermark = state.max_event_time_us.saturating_sub(rules.allowed_lateness_us);
    let final_count = state
        .pending
        .partition_point(|pending| pending.event_time_us < new_watermark);
    let base = state.base.get_or_insert_with(|| empty_state(event));
    for finished in state.pending.drain(..final_count) {
        apply(base, &finished);
    }
    let mut current = base.clone();
    for pending in &state.pending {
        apply(&mut current, pending);
    }
    current.version = state.accepted;
    current.input = Some(input.clone());
    Verdict::Accepted {
        state: Box::new(current),
    }
}

/// Whether a dedup entry expiring at `expires_at_us` still counts: until its own expiry, and in
/// any case while its flight lives (the watermark is before the flight's `horizon_us`). Dedup
/// entries therefore live at least as long as the state.
fn entry_is_live(expires_at_us: i64, horizon_us: i64, shard_watermark_us: i64) -> bool {
    expires_at_us > shard_watermark_us || horizon_us > shard_watermark_us
}

/// Whether `event_id` was accepted for this flight and its dedup entry is live (see
/// [`dedup_expiry`]; while the flight lives, every entry is). `horizon_us`: the flight's
/// [`horizon_us`].
pub fn has_seen(
    key_state: &FlightKeyState,
    event_id: &str,
    horizon_us: i64,
    shard_watermark_us: i64,
) -> bool {
    key_state.seen.iter().any(|seen| {
        seen.event_id == event_id && entry_is_live(seen.expires_at_us, horizon_us, shard_watermark_us)
    })
}

/// The flight's live dedup entries: accepted event ids and when each expires.
pub fn live_dedup_entries(
    key_state: &FlightKeyState,
    horizon_us: i64,
    shard_watermark_us: i64,
) -> Vec<(&str, i64)> {
    key_state
        .seen
        .iter()
        .filter(|seen| entry_is_live(seen.expires_at_us, horizon_us, shard_watermark_us))
        .map(|seen| (seen.event_id.as_str(), seen.expires_at_us))
        .collect()
}

/// When the DEPARTURE_OVERDUE timer of a flight should fire: `scheduled_out + 15 min`, while the
/// flight has a schedule, has not departed, is not cancelled, and was not alerted yet.
pub fn overdue_timer(state: &FlightState, alerted: bool, rules: &Rules) -> Option<i64> {
    if alerted || state.actual_out_us.is_some() || state.status == status::CANCELLED {
        return None;
    }
    state
        .scheduled_out_us
        .map(|scheduled| scheduled + rules.overdue_after_us)
}

/// Whether the overdue rule still holds when its timer fires at `fire_at_us`.
pub fn is_overdue(state: &FlightState, fire_at_us: i64, rules: &Rules) -> bool {
    overdue_timer(state, false, rules) == Some(fire_at_us)
}

/// How a raised DEPARTURE_OVERDUE alert ends: `CANCELLED` once the flight is cancelled, else
/// `DEPARTED` once it has an actual out time; `None` while it is still overdue.
pub fn overdue_resolution(state: &FlightState) -> Option<&'static str> {
    if state.status == status::CANCELLED {
        Some(status::CANCELLED)
    } else if state.actual_out_us.is_some() {
        Some(status::DEPARTED)
    } else {
        None
    }
}

/// Whether accepting the event that produced `state` resolves the flight's alert: it was raised,
/// not resolved yet, and the flight has now departed or is cancelled. Returns how it ended.
pub fn resolves_overdue(key_state: &FlightKeyState, state: &FlightState) -> Option<&'static str> {
    if !key_state.overdue_alerted || key_state.overdue_resolved {
        return None;
    }
    overdue_resolution(state)
}

/// When a flight's stored record is deleted: `dedup_ttl` after the later of its service date's
/// end and its last event (at least its horizon, as `dedup_ttl >= state_ttl` is required at start).
/// From the horizon on the flight is expired ([`is_expired`]); the record stays until then so that
/// a redelivery is still counted a duplicate, not a late event.
pub fn record_expiry(key_state: &FlightKeyState, service_end_us: i64, rules: &Rules) -> i64 {
    service_end_us
        .max(key_state.max_event_time_us)
        .saturating_add(rules.dedup_ttl_us.max(rules.state_ttl_us))
}

/// When a dedup entry for an event expires: `dedup_ttl` after the later of its event time and its
/// flight's service date's end. While the flight lives the entry counts in any case
/// ([`has_seen`]).
pub fn dedup_expiry(event: &OperationalEvent, service_end_us: i64, rules: &Rules) -> i64 {
    event
        .event_time_us
        .max(service_end_us)
        .saturating_add(rules.dedup_ttl_us)
}

/// The current `FlightState` of a stored key state (for reads through the admin API).
pub fn current_state(key_state: &FlightKeyState) -> FlightState {
    let mut current = key_state.base.clone().unwrap_or_default();
    for pending in &key_state.pending {
        apply(&mut current, pending);
    }
    current.version = key_state.accepted;
    current.input = key_state.pending.last().and_then(|event| event.input.clone());
    current
}

/// Whether an event type ends the overdue watch (used by callers deciding to delete the timer).
pub fn ends_departure_watch(event: &OperationalEvent) -> bool {
    matches!(
        EventType::try_from(event.r#type),
        Ok(EventType::Out | EventType::Cancelled)
    )
}

#[cfg(test)]
mod tests;
