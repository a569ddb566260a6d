//! Conditions: one per type, the transition time kept unless the status flips.

use std::fmt::Display;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A condition or Event reason: a fixed set per controller (see [`crate::reasons!`]), so
/// code branches on variants, never on the strings users read.
pub trait Reason: Copy + Display + 'static {
    fn as_str(self) -> &'static str;
}

/// The longest message the API server accepts in a condition.
const MAX_MESSAGE: usize = 32_000;

/// Sets condition `type_`, keeping its transition time unless its status flips (a new or
/// flipped condition takes `now`). Returns whether its status or reason changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: impl Reason,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> bool {
    let value = if status { "True" } else { "False" };
    let reason = reason.as_str();
    let previous = conditions.iter().find(|c| c.type_ == type_);
    let transition = match previous {
        Some(c) if c.status == value => c.last_transition_time.clone(),
        _ => now.clone(),
    };
    let changed = previous.is_none_or(|c| c.status != value || c.reason != reason);
    let condition = Condition {
        type_: type_.into(),
        status: value.into(),
        reason: reason.into(),
        message: message.chars().take(MAX_MESSAGE).collect(),
        last_transition_time: transition,
        observed_generation: generation,
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(slot) => *slot = condition,
        None => conditions.push(condition),
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::reasons! {
        enum Why { Up, Down, Broken }
    }

    fn at(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(second).unwrap())
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_flips() {
        let mut conditions = Vec::new();
        assert!(set_condition(
            &mut conditions,
            "Ready",
            true,
            Why::Up,
            "m",
            Some(1),
            &at(10)
        ));
        assert!(!set_condition(
            &mut conditions,
            "Ready",
            true,
            Why::Up,
            "n",
            Some(2),
            &at(20)
        ));
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, at(10));
        assert_eq!(conditions[0].message, "n");
        assert_eq!(conditions[0].observed_generation, Some(2));
        // A new reason with the same status is a change, but not a transition.
        assert!(set_condition(
            &mut conditions,
            "Ready",
            true,
            Why::Broken,
            "x",
            None,
            &at(30)
        ));
        assert_eq!(conditions[0].last_transition_time, at(10));
        assert!(set_condition(
            &mut conditions,
            "Ready",
            false,
            Why::Down,
            "y",
            None,
            &at(40)
        ));
        assert_eq!(conditions[0].last_transition_time, at(40));
        assert_eq!(
            (conditions[0].status.as_str(), conditions[0].reason.as_str()),
            ("False", "Down")
        );
    }

    #[test]
    fn other_types_keep_their_place_and_long_messages_are_cut() {
        let mut conditions = Vec::new();
        set_condition(&mut conditions, "A", true, Why::Up, "a", None, &at(1));
        set_condition(&mut conditions, "B", true, Why::Up, "b", None, &at(1));
        set_condition(
            &mut conditions,
            "A",
            false,
            Why::Down,
            &"x".repeat(40_000),
            None,
            &at(2),
        );
        let types: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["A", "B"]);
        assert_eq!(conditions[0].message.len(), MAX_MESSAGE);
    }
}
