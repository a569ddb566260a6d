//! The discovery service's controllers: `EnvoyConfig` (revisions and which one is published),
//! `EnvoyConfigRevision` (loads the published one, with its Secrets, into the xDS cache) and
//! the NACK consumer that taints rejected revisions. All run in `marin3r discovery-service`.

pub mod envoy_config;
pub mod metrics;
pub mod nacks;
pub mod publisher;
pub mod revision;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource};
use tokio::sync::mpsc;
use tracing::warn;

use crate::api::discovery_service::DISCOVERY_SERVICE_LABEL;
use crate::xds::{Cache, NackEvent};
pub use metrics::ControllerMetrics;
pub use publisher::Publisher;

const FIELD_MANAGER: &str = "marin3r-discovery-service";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("serializing status: {0}")]
    Json(#[from] serde_json::Error),
}

/// What the controllers serve.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Where the controllers count their work; register it with the process's registry.
    pub metrics: ControllerMetrics,
    /// Serve only `EnvoyConfig`s in namespaces labelled
    /// `marin3r.3scale.net/discovery-service=<name>`; `None`: every namespace.
    pub discovery_service: Option<String>,
    /// Let revisions reference Secrets in other namespaces (off: a cross-namespace reference
    /// is an error in status, so a namespace cannot have another's certificates served).
    pub allow_cross_namespace_secrets: bool,
    /// The share of a node's connected proxies that must have rejected a version before
    /// its revision is tainted.
    pub taint_threshold: nacks::TaintThreshold,
}

/// Shared by every controller.
pub(crate) struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub config: Config,
    pub publisher: Publisher,
    pub metrics: ControllerMetrics,
    /// Uids of the revisions the revision controller has tried to load since start (what
    /// readiness waits for).
    pub attempted: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Context {
    pub fn mark_attempted(&self, uid: &str) {
        if let Ok(mut set) = self.attempted.lock() {
            set.insert(uid.to_owned());
        }
    }

    /// Whether this discovery service serves `namespace`. Read on every reconcile: a label
    /// added later takes effect on the next change of the config.
    pub async fn serves(&self, namespace: &str) -> Result<bool, Error> {
        let Some(name) = &self.config.discovery_service else {
            return Ok(true);
        };
        let api: Api<Namespace> = Api::all(self.client.clone());
        Ok(api.get_opt(namespace).await?.is_some_and(|ns| {
            ns.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(DISCOVERY_SERVICE_LABEL))
                == Some(name)
        }))
    }

    /// With `--discovery-service-name`, labelling a namespace (or removing the label) takes
    /// effect at once: a namespace change reconciles every object of that namespace again.
    pub(crate) fn watch_namespaces<K>(
        &self,
        controller: kube::runtime::Controller<K>,
    ) -> kube::runtime::Controller<K>
    where
        K: Resource<DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        if self.config.discovery_service.is_none() {
            return controller;
        }
        let store = controller.store();
        controller.watches(
            Api::<Namespace>::all(self.client.clone()),
            kube::runtime::watcher::Config::default(),
            move |ns: Namespace| {
                let name = ns.metadata.name.unwrap_or_default();
                store
                    .state()
                    .into_iter()
                    .filter(|o| o.meta().namespace.as_deref() == Some(name.as_str()))
                    .map(|o| kube::runtime::reflector::ObjectRef::from_obj(&*o))
                    .collect::<Vec<_>>()
            },
        )
    }

    pub async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        note: &str,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, &obj.object_ref(&())).await {
            warn!(error = %err, "could not publish an event");
        }
    }
}

/// Readiness of the controllers: true once every watch has listed its objects and every
/// revision published at start has been loaded (or has failed to load, with a status).
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    pub envoy_configs: Arc<AtomicBool>,
    pub revisions: Arc<AtomicBool>,
}

impl Readiness {
    pub fn ready(&self) -> bool {
        self.envoy_configs.load(Ordering::SeqCst) && self.revisions.load(Ordering::SeqCst)
    }
}

/// Sets `flag` once `store` has listed its objects. kube's readiness future keeps only the
/// waker of its last poller (the controller's own), so it is polled again every 100 ms
/// rather than awaited once.
pub(crate) async fn mark_ready<K>(store: kube::runtime::reflector::Store<K>, flag: Arc<AtomicBool>)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    loop {
        match tokio::time::timeout(
            std::time::Duration::from_millis(100),
            store.wait_until_ready(),
        )
        .await
        {
            Ok(Ok(())) => {
                flag.store(true, Ordering::SeqCst);
                return;
            }
            Ok(Err(_)) => return,
            Err(_) => {}
        }
    }
}

/// Runs every controller and the NACK consumer until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: Config,
    cache: Cache,
    nacks: mpsc::Receiver<NackEvent>,
    readiness: Readiness,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        metrics: config.metrics.clone(),
        config,
        publisher: Publisher::new(cache),
        attempted: Default::default(),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let ec = tokio::spawn(envoy_config::run(
        Arc::clone(&ctx),
        readiness.envoy_configs.clone(),
        stopped(),
    ));
    let ecr = tokio::spawn(revision::run(
        Arc::clone(&ctx),
        readiness.revisions.clone(),
        stopped(),
    ));
    let nack = tokio::spawn(nacks::run(Arc::clone(&ctx), nacks, stopped()));
    shutdown.await;
    let _ = stop_tx.send(true);
    let _ = tokio::join!(ec, ecr, nack);
}

/// Sets condition `type_`, keeping its transition time unless its status flips. Returns
/// whether its status or reason changed.
pub(crate) fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> bool {
    let value = if status { "True" } else { "False" };
    let previous = conditions.iter().find(|c| c.type_ == type_).cloned();
    let transition = match &previous {
        Some(c) if c.status == value => c.last_transition_time.clone(),
        _ => now(),
    };
    let changed = previous
        .as_ref()
        .is_none_or(|c| c.status != value || c.reason != reason);
    let condition = Condition {
        type_: type_.into(),
        status: value.into(),
        reason: reason.into(),
        message: message.chars().take(32_000).collect(),
        last_transition_time: transition,
        observed_generation: generation,
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(slot) => *slot = condition,
        None => conditions.push(condition),
    }
    changed
}

pub(crate) fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// A status as a merge patch that also removes the optional fields it leaves unset (a plain
/// merge patch of a struct with skipped `None`s would keep their old values). The patch
/// carries the resource version it was computed from: several writers share a revision's
/// conditions (publisher, loader, NACK consumer), and a list in a merge patch replaces the
/// whole list, so a write based on a stale read must fail with a conflict and be redone.
pub(crate) fn status_patch<S: serde::Serialize>(
    status: &S,
    optional: &[&str],
    resource_version: Option<&str>,
) -> Result<serde_json::Value, Error> {
    let mut value = serde_json::to_value(status)?;
    if let Some(map) = value.as_object_mut() {
        for key in optional {
            map.entry(*key).or_insert(serde_json::Value::Null);
        }
    }
    let mut patch = serde_json::json!({ "status": value });
    if let Some(rv) = resource_version {
        patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    }
    Ok(patch)
}

impl Error {
    /// A write lost a race with another writer; retry soon with a fresh read.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Kube(kube::Error::Api(e)) if e.code == 409)
    }
}

/// How long a failed reconcile waits: a conflict is retried at once, anything else later.
pub(crate) fn retry_after(err: &Error) -> std::time::Duration {
    if err.is_conflict() {
        std::time::Duration::from_millis(100)
    } else {
        std::time::Duration::from_secs(5)
    }
}
