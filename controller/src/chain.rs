//! An error as a person reads it: its message and every cause under it.

use std::error::Error;

/// `error`'s message followed by each of its causes (`std::error::Error::source`), joined by
/// ": ": what a status message, an Event or a log line shows, so that no cause is lost. A
/// cause whose text the message already holds (an error that prints its source itself) is
/// not repeated.
pub fn chain(error: &(dyn Error + 'static)) -> String {
    let mut message = said(error);
    let mut cause = error.source();
    while let Some(e) = cause {
        let text = said(e);
        if !text.is_empty() && !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = e.source();
    }
    message
}

/// What one error says. kube's API errors print the API server's whole Status in Rust's
/// Debug form after its message; a person needs the message, the code and the reason.
fn said(error: &(dyn Error + 'static)) -> String {
    #[cfg(feature = "kube")]
    if let Some(kube::Error::Api(status)) = error.downcast_ref::<kube::Error>() {
        return match status.reason.as_str() {
            "" => format!("{} (HTTP {})", status.message, status.code),
            reason => format!("{} (HTTP {} {reason})", status.message, status.code),
        };
    }
    // The Status under it, said by its message alone (which the line above holds).
    #[cfg(feature = "kube")]
    if let Some(status) = error.downcast_ref::<Box<kube::core::Status>>() {
        return status.message.clone();
    }
    error.to_string()
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

    #[cfg(feature = "kube")]
    #[test]
    fn an_api_error_says_the_api_servers_message_not_its_debug_form() {
        let status = kube::core::Status::failure("configmaps \"x\" is forbidden", "Forbidden")
            .with_code(403);
        #[derive(Debug, thiserror::Error)]
        #[error("reading x")]
        struct Reading(#[source] kube::Error);
        let error = Reading(kube::Error::Api(Box::new(status)));
        assert_eq!(
            chain(&error),
            "reading x: configmaps \"x\" is forbidden (HTTP 403 Forbidden)"
        );
    }
}
