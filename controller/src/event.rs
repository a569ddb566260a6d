//! Events: what a controller tells users about one of its objects.

use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};
use tracing::warn;

use crate::Reason;

/// The longest Event note the API server accepts.
const MAX_NOTE: usize = 1000;

/// One Event a plan asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub type_: EventType,
    pub reason: &'static str,
    pub message: String,
}

impl Note {
    pub fn normal(reason: impl Reason, message: impl Into<String>) -> Self {
        Self::new(EventType::Normal, reason, message)
    }

    pub fn warning(reason: impl Reason, message: impl Into<String>) -> Self {
        Self::new(EventType::Warning, reason, message)
    }

    pub fn new(type_: EventType, reason: impl Reason, message: impl Into<String>) -> Self {
        Self {
            type_,
            reason: reason.as_str(),
            message: message.into(),
        }
    }
}

/// What the certificate and `DiscoveryService` reconcilers share: the client, their Events
/// and their configuration.
pub struct Context<C> {
    pub client: Client,
    pub events: Events,
    pub config: C,
}

impl<C> Context<C> {
    /// `controller` names the Events' reporter.
    pub fn new(client: Client, controller: &str, config: C) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            events: Events::new(client.clone(), controller),
            client,
            config,
        })
    }
}

/// Publishes Events as one controller (the reporting instance is the pod, from `POD_NAME`).
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl Events {
    pub fn new(client: Client, controller: &str) -> Self {
        let reporter = Reporter {
            controller: controller.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// Publishes `note` about `obj`. An Event that cannot be written is logged, never an
    /// error: the reconcile it reports has already happened.
    pub async fn publish<K: Resource<DynamicType = ()>>(&self, obj: &K, note: &Note) {
        let event = Event {
            type_: note.type_,
            reason: note.reason.into(),
            note: Some(note.message.chars().take(MAX_NOTE).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, &obj.object_ref(&())).await {
            warn!(error = %err, "could not publish an event");
        }
    }

    /// Publishes every note, in order.
    pub async fn publish_all<K: Resource<DynamicType = ()>>(&self, obj: &K, notes: &[Note]) {
        for note in notes {
            self.publish(obj, note).await;
        }
    }
}
