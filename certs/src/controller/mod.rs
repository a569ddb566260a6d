//! The `DiscoveryServiceCertificate` controller: issues each certificate into its Secret,
//! reissues on every trigger of SPEC §2.1, and wakes up exactly at the renewal instant.
//! The decisions are pure (`decide`); this module only reads and writes the API.

pub mod decide;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalize, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use thiserror::Error;
use time::OffsetDateTime;
use tracing::{debug, info, warn};

use crate::api::{
    DiscoveryServiceCertificate, DiscoveryServiceCertificateStatus, OWNER_NAME_LABEL,
    OWNER_NAMESPACE_LABEL, READY_CONDITION, RENEW_ANNOTATION, ValidSpec,
};
use crate::{CertificateAuthority, CertificateInfo, issue_self_signed};
use decide::{Readiness, TlsFiles, needs_issue, next_wakeup, readiness, renewal_due_at};

const FIELD_MANAGER: &str = "marin3r-certificates";
const FINALIZER: &str = "operator.marin3r.3scale.net/certificate-secret";
/// How long to wait before looking again for a CA Secret that is missing or unusable.
const DEPENDENCY_RETRY: Duration = Duration::from_secs(15);

#[derive(Debug, Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
}

/// What the controller may do.
#[derive(Debug, Clone)]
pub struct Config {
    /// Certificates in these namespaces may write their Secret to, and read their CA from, any
    /// namespace (the operator's own certificates). Everywhere else both must be the
    /// certificate's own namespace, so a user cannot have the operator's CA sign for them.
    pub trusted_namespaces: BTreeSet<String>,
    /// Time-based renewal waits at least this long after issuance, however short `validFor`
    /// is (see [`decide::needs_issue`]).
    pub min_renewal_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            trusted_namespaces: BTreeSet::new(),
            min_renewal_interval: DEFAULT_MIN_RENEWAL_INTERVAL,
        }
    }
}

/// A `validFor: 1` certificate is reissued once a minute, not five times a second.
pub const DEFAULT_MIN_RENEWAL_INTERVAL: Duration = Duration::from_secs(60);

struct Context {
    client: Client,
    recorder: Recorder,
    config: Config,
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let reporter = Reporter {
        controller: "marin3r-certificates".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
        config,
    });
    let controller = Controller::new(
        Api::<DiscoveryServiceCertificate>::all(client.clone()),
        watcher::Config::default(),
    );
    let store = controller.store();
    // A change to a Secret this controller manages wakes the certificate that writes it and
    // every certificate it is the CA of.
    let secrets = watcher::Config::default().labels(OWNER_NAME_LABEL);
    controller
        .watches(
            Api::<Secret>::all(client),
            secrets,
            move |secret: Secret| {
                let key = (secret.namespace().unwrap_or_default(), secret.name_any());
                store
                    .state()
                    .into_iter()
                    .filter(|dsc| references(dsc, &key))
                    .map(|dsc| ObjectRef::from_obj(&*dsc))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => debug!(certificate = %obj, "reconciled"),
                Err(err) => debug!(error = %err, "reconcile failed"),
            }
        })
        .await;
}

fn references(dsc: &DiscoveryServiceCertificate, key: &(String, String)) -> bool {
    let ns = dsc.namespace().unwrap_or_default();
    match dsc.spec.validate(&ns) {
        Ok(valid) => &valid.secret == key || valid.ca_secret.as_ref() == Some(key),
        Err(_) => false,
    }
}

fn error_policy(dsc: Arc<DiscoveryServiceCertificate>, err: &Error, _: Arc<Context>) -> Action {
    warn!(certificate = %dsc.name_any(), namespace = ?dsc.namespace(), error = %err, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile(
    dsc: Arc<DiscoveryServiceCertificate>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let ns = dsc.namespace().unwrap_or_default();
    let api: Api<DiscoveryServiceCertificate> = Api::namespaced(ctx.client.clone(), &ns);
    // Secrets in another namespace cannot be owned, so a finalizer removes them instead.
    let cross_namespace = dsc
        .spec
        .validate(&ns)
        .is_ok_and(|valid| valid.secret.0 != ns);
    if cross_namespace || dsc.finalizers().iter().any(|f| f == FINALIZER) {
        finalizer(&api, FINALIZER, dsc, |event| async {
            match event {
                Finalize::Apply(dsc) => apply(dsc, &ctx).await,
                Finalize::Cleanup(dsc) => cleanup(dsc, &ctx).await,
            }
        })
        .await
        .map_err(|e| Error::Finalizer(Box::new(e)))
    } else if dsc.meta().deletion_timestamp.is_some() {
        Ok(Action::await_change())
    } else {
        apply(dsc, &ctx).await
    }
}

/// Removes the Secret of a certificate being deleted, if this controller wrote it.
async fn cleanup(dsc: Arc<DiscoveryServiceCertificate>, ctx: &Context) -> Result<Action, Error> {
    let ns = dsc.namespace().unwrap_or_default();
    if let Ok(valid) = dsc.spec.validate(&ns) {
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &valid.secret.0);
        if let Some(secret) = secrets.get_opt(&valid.secret.1).await?
            && written_for(&secret, &dsc)
        {
            secrets.delete(&valid.secret.1, &Default::default()).await?;
            info!(secret = %format!("{}/{}", valid.secret.0, valid.secret.1), "deleted the Secret of a deleted certificate");
        }
    }
    Ok(Action::await_change())
}

fn written_for(secret: &Secret, dsc: &DiscoveryServiceCertificate) -> bool {
    let labels = secret.labels();
    labels.get(OWNER_NAME_LABEL) == Some(&dsc.name_any())
        && labels.get(OWNER_NAMESPACE_LABEL) == dsc.namespace().as_ref()
}

/// Why a certificate is not ready, as the Ready condition's reason and message.
struct NotReady {
    reason: &'static str,
    message: String,
    retry: Option<Duration>,
}

impl NotReady {
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            retry: None,
        }
    }

    fn retry(mut self) -> Self {
        self.retry = Some(DEPENDENCY_RETRY);
        self
    }
}

async fn apply(dsc: Arc<DiscoveryServiceCertificate>, ctx: &Context) -> Result<Action, Error> {
    match issue_if_needed(&dsc, ctx).await? {
        Ok(action) => Ok(action),
        Err(not_ready) => {
            let mut status = dsc.status.clone().unwrap_or_default();
            status.ready = Some(false);
            let changed = set_ready_condition(
                &mut status,
                &dsc,
                false,
                not_ready.reason,
                &not_ready.message,
            );
            if changed {
                // One Warning per new problem, not one per retry.
                publish(
                    ctx,
                    &dsc,
                    EventType::Warning,
                    not_ready.reason,
                    &not_ready.message,
                )
                .await;
            }
            write_status(ctx, &dsc, status).await?;
            Ok(not_ready
                .retry
                .map_or_else(Action::await_change, Action::requeue))
        }
    }
}

async fn issue_if_needed(
    dsc: &DiscoveryServiceCertificate,
    ctx: &Context,
) -> Result<Result<Action, NotReady>, Error> {
    let ns = dsc.namespace().unwrap_or_default();
    let valid = match dsc.spec.validate(&ns) {
        Ok(valid) => valid,
        Err(message) => return Ok(Err(NotReady::new("InvalidSpec", message))),
    };
    if let Some(message) = forbidden_reference(&ns, &valid, &ctx.config) {
        return Ok(Err(NotReady::new("CrossNamespaceReference", message)));
    }
    let ca = match &valid.ca_secret {
        None => None,
        Some((ca_ns, ca_name)) => {
            let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ca_ns);
            let Some(secret) = api.get_opt(ca_name).await? else {
                let msg = format!("CA Secret {ca_ns}/{ca_name} not found");
                return Ok(Err(NotReady::new("CASecretNotFound", msg).retry()));
            };
            let files = tls_files(&secret);
            let (Some(cert), Some(key)) = (files.cert, files.key) else {
                let msg = format!("CA Secret {ca_ns}/{ca_name} lacks tls.crt or tls.key");
                return Ok(Err(NotReady::new("CASecretInvalid", msg).retry()));
            };
            match CertificateAuthority::from_pem(&cert, &key) {
                Ok(ca) => Some(ca),
                Err(e) => {
                    let msg = format!("CA Secret {ca_ns}/{ca_name} is not a usable CA: {e}");
                    return Ok(Err(NotReady::new("CASecretInvalid", msg).retry()));
                }
            }
        }
    };

    let (secret_ns, secret_name) = &valid.secret;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), secret_ns);
    let existing = secrets.get_opt(secret_name).await?;
    let files = existing.as_ref().map(tls_files).unwrap_or_default();
    let now = OffsetDateTime::now_utc();
    let renew_request = dsc.annotations().get(RENEW_ANNOTATION).cloned();
    let previous = dsc.status.clone().unwrap_or_default();
    // The Secret records the renewal request it was issued for. It is read fresh from the API,
    // unlike `dsc`, which may come from a cache that has not seen our last status write yet
    // (deciding from the status would then renew twice).
    let handled = existing
        .as_ref()
        .and_then(|s| s.annotations().get(RENEW_ANNOTATION).cloned());
    let manual = renew_request.is_some() && renew_request != handled;
    let issuer_pem = ca.as_ref().map(|ca| ca.cert_pem());

    let min_renewal = ctx.config.min_renewal_interval;
    let decision = needs_issue(&valid, &files, issuer_pem, manual, now, min_renewal);
    let (cert_pem, issued_because) = match decision {
        None => (files.cert.unwrap_or_default(), None),
        Some(reason) => {
            // Key generation (RSA-4096 takes seconds) must not block an async worker.
            let request = valid.request.clone();
            let issued = tokio::task::spawn_blocking(move || match &ca {
                Some(ca) => ca.issue(&request),
                None => issue_self_signed(&request),
            })
            .await
            .unwrap_or_else(|e| {
                Err(crate::CertError::Generation(format!(
                    "the issuing task failed: {e}"
                )))
            });
            let issued = match issued {
                Ok(issued) => issued,
                Err(e) => return Ok(Err(NotReady::new("IssuanceFailed", e.to_string()))),
            };
            write_secret(&secrets, dsc, &valid, &issued, renew_request.as_deref()).await?;
            info!(certificate = %dsc.name_any(), namespace = %ns, %reason, "issued certificate");
            (issued.cert_pem, Some(reason))
        }
    };
    let info = match CertificateInfo::from_pem(&cert_pem) {
        Ok(info) => info,
        Err(e) => return Ok(Err(NotReady::new("IssuanceFailed", e.to_string()))),
    };

    let mut status = previous;
    status.not_before = Some(to_time(info.not_before));
    status.not_after = Some(to_time(info.not_after));
    status.renewal_time = valid
        .renewal_enabled
        .then(|| to_time(renewal_due_at(&info, min_renewal)));
    status.certificate_hash = Some(info.hash());
    status.last_renewal_request = renew_request;
    let secret_ref = format!("{secret_ns}/{secret_name}");
    let (ready, reason, message) = match readiness(&info, now) {
        Readiness::Ready => (
            true,
            "Issued",
            format!("certificate is valid and stored in Secret {secret_ref}"),
        ),
        Readiness::NotYetValid => (
            false,
            "NotYetValid",
            "certificate is not valid yet".to_owned(),
        ),
        Readiness::Expired => (
            false,
            "Expired",
            "certificate expired and renewal is disabled".to_owned(),
        ),
    };
    status.ready = Some(ready);
    set_ready_condition(&mut status, dsc, ready, reason, &message);
    if let Some(because) = &issued_because {
        let note = format!("issued into Secret {secret_ref}: {because}");
        publish(ctx, dsc, EventType::Normal, "Issued", &note).await;
    } else if !ready
        && reason == "Expired"
        && dsc.status.as_ref().and_then(|s| s.ready) == Some(true)
    {
        publish(ctx, dsc, EventType::Warning, "Expired", &message).await;
    }
    write_status(ctx, dsc, status).await?;

    Ok(Ok(
        match next_wakeup(&info, valid.renewal_enabled, now, min_renewal) {
            Some(wait) => Action::requeue(wait.max(Duration::from_millis(200))),
            None => Action::await_change(),
        },
    ))
}

fn forbidden_reference(ns: &str, valid: &ValidSpec, config: &Config) -> Option<String> {
    if config.trusted_namespaces.contains(ns) {
        return None;
    }
    let refs = [
        Some(("secretRef", &valid.secret)),
        valid
            .ca_secret
            .as_ref()
            .map(|c| ("signer.caSigned.caSecretRef", c)),
    ];
    refs.into_iter().flatten().find(|(_, (other, _))| other != ns).map(|(field, (other, name))| {
        format!(
            "spec.{field} names Secret {other}/{name} in another namespace; only certificates in the operator's namespaces may do that"
        )
    })
}

fn tls_files(secret: &Secret) -> TlsFiles {
    let text = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    TlsFiles {
        cert: text("tls.crt"),
        key: text("tls.key"),
        ca: text("ca.crt"),
    }
}

async fn write_secret(
    secrets: &Api<Secret>,
    dsc: &DiscoveryServiceCertificate,
    valid: &ValidSpec,
    issued: &crate::IssuedCertificate,
    renew_request: Option<&str>,
) -> Result<(), Error> {
    let (ns, name) = &valid.secret;
    let mut labels = BTreeMap::new();
    labels.insert(OWNER_NAME_LABEL.to_owned(), dsc.name_any());
    labels.insert(
        OWNER_NAMESPACE_LABEL.to_owned(),
        dsc.namespace().unwrap_or_default(),
    );
    labels.insert(
        "app.kubernetes.io/managed-by".to_owned(),
        "marin3r".to_owned(),
    );
    let owner = (Some(ns) == dsc.namespace().as_ref())
        .then(|| dsc.controller_owner_ref(&()))
        .flatten();
    let data = [
        ("tls.crt", &issued.cert_pem),
        ("tls.key", &issued.key_pem),
        ("ca.crt", &issued.ca_pem),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
    .collect();
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            labels: Some(labels),
            annotations: renew_request
                .map(|r| BTreeMap::from([(RENEW_ANNOTATION.to_owned(), r.to_owned())])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    };
    let mut value = serde_json::to_value(&secret).unwrap_or_default();
    value["apiVersion"] = "v1".into();
    value["kind"] = "Secret".into();
    secrets
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(value),
        )
        .await?;
    Ok(())
}

/// Sets the Ready condition, keeping its transition time unless its status flips. Returns
/// whether the reason or status changed.
fn set_ready_condition(
    status: &mut DiscoveryServiceCertificateStatus,
    dsc: &DiscoveryServiceCertificate,
    ready: bool,
    reason: &str,
    message: &str,
) -> bool {
    let value = if ready { "True" } else { "False" };
    let previous = status
        .conditions
        .iter()
        .find(|c| c.type_ == READY_CONDITION)
        .cloned();
    let transition = match &previous {
        Some(c) if c.status == value => c.last_transition_time.clone(),
        _ => to_time(OffsetDateTime::now_utc()),
    };
    let condition = Condition {
        type_: READY_CONDITION.into(),
        status: value.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: transition,
        observed_generation: dsc.metadata.generation,
    };
    let changed = previous
        .as_ref()
        .is_none_or(|c| c.status != condition.status || c.reason != condition.reason);
    status.conditions.retain(|c| c.type_ != READY_CONDITION);
    status.conditions.push(condition);
    status.observed_generation = dsc.metadata.generation;
    changed
}

async fn write_status(
    ctx: &Context,
    dsc: &DiscoveryServiceCertificate,
    status: DiscoveryServiceCertificateStatus,
) -> Result<(), Error> {
    if dsc.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let api: Api<DiscoveryServiceCertificate> =
        Api::namespaced(ctx.client.clone(), &dsc.namespace().unwrap_or_default());
    let patch = serde_json::json!({ "status": status });
    api.patch_status(
        &dsc.name_any(),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await?;
    Ok(())
}

async fn publish(
    ctx: &Context,
    dsc: &DiscoveryServiceCertificate,
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
    if let Err(err) = ctx.recorder.publish(&event, &dsc.object_ref(&())).await {
        warn!(error = %err, "could not publish an event");
    }
}

fn to_time(t: OffsetDateTime) -> Time {
    let ts = k8s_openapi::jiff::Timestamp::from_second(t.unix_timestamp())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    Time(ts)
}
