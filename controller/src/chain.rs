//! An error as a person reads it: its message and every cause under it.

use std::error::Error;

/// `error`'s message followed by each of its causes (`std::error::Error::source`), joined by
/// ": ": what a status message, an Event or a log line shows, so that no cause is lost. A
/// cause whose text the message already holds (an error that prints its source itself) is
/// not repeated.
pub fn chain(error: &(dyn Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let text = e.to_string();
        if !text.is_empty() && !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = e.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("loading the revision")]
        Load(#[source] Inner),
        #[error("printing its cause itself: {0}")]
        Loud(#[source] Inner),
    }

    #[derive(Debug, thiserror::Error)]
    #[error("Secret a/b not found")]
    struct Inner;

    #[test]
    fn every_cause_is_shown_once() {
        assert_eq!(
            chain(&Outer::Load(Inner)),
            "loading the revision: Secret a/b not found"
        );
        assert_eq!(
            chain(&Outer::Loud(Inner)),
            "printing its cause itself: Secret a/b not found"
        );
        assert_eq!(chain(&Inner), "Secret a/b not found");
    }
}
