//! The `DiscoveryServiceCertificate` controller: issues each certificate into its Secret,
//! reissues on every trigger of SPEC §2.1, and wakes up exactly at the renewal instant.
//! The decisions are pure: [`plan::decide`] (from the triggers in [`triggers`] and the CA
//! rotation in [`rotation`]) and [`report::report`]; this module only reads and writes the API.

pub mod bundle;
mod immutable;
mod metrics;
pub mod plan;
mod report;
pub mod rotation;
pub mod triggers;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalize, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use marin3r_controller::{DEFAULT_RECONCILE_TIMEOUT, ReconcileMetrics, patch_status, status_patch};
use time::OffsetDateTime;
use tracing::info;

use crate::api::{
    DiscoveryServiceCertificate, DiscoveryServiceCertificateStatus, OWNER_NAME_LABEL,
    OWNER_NAMESPACE_LABEL, RENEW_ANNOTATION, ValidSpec, owner_name_label,
};
use crate::issue_self_signed;
use plan::{NotReady, Observed, Plan, Reason};

const FIELD_MANAGER: &str = "marin3r-certificates";
const FINALIZER: &str = "operator.marin3r.3scale.net/certificate-secret";
/// The controller's name in metrics and logs.
const CONTROLLER: &str = "certificate";

pub use marin3r_controller::Error;
pub use metrics::CertificateMetrics;
pub use triggers::DEFAULT_MIN_RENEWAL_INTERVAL;

/// What the controller may do.
#[derive(Debug, Clone)]
pub struct Config {
    /// Certificates in these namespaces may write their Secret to, and read their CA from, any
    /// namespace (the operator's own certificates). Everywhere else both must be the
    /// certificate's own namespace, so a user cannot have the operator's CA sign for them.
    pub trusted_namespaces: BTreeSet<String>,
    /// Time-based renewal waits at least this long after issuance, however short `validFor`
    /// is (see [`triggers::needs_issue`]).
    pub min_renewal_interval: Duration,
    /// How long a changed Secret may take to reach every reader; each step of a CA
    /// rotation waits this long for the previous one (see [`rotation`]).
    pub trust_propagation: Duration,
    /// Where reconciles are counted.
    pub metrics: ReconcileMetrics,
    /// Where the certificates' expiry and readiness are reported.
    pub certificates: CertificateMetrics,
    /// How long one reconcile may take before it is abandoned and retried (`None`:
    /// [`marin3r_controller::DEFAULT_RECONCILE_TIMEOUT`]).
    pub reconcile_timeout: Option<std::time::Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            trusted_namespaces: BTreeSet::new(),
            min_renewal_interval: DEFAULT_MIN_RENEWAL_INTERVAL,
            trust_propagation: rotation::DEFAULT_TRUST_PROPAGATION,
            metrics: ReconcileMetrics::default(),
            certificates: CertificateMetrics::default(),
            reconcile_timeout: None,
        }
    }
}

type Context = marin3r_controller::Context<Config>;

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let metrics = config.metrics.clone();
    let deadline = config
        .reconcile_timeout
        .unwrap_or(DEFAULT_RECONCILE_TIMEOUT);
    let certificates = config.certificates.clone();
    let ctx = Context::new(client.clone(), FIELD_MANAGER, config);
    let controller = marin3r_controller::watch_all::<DiscoveryServiceCertificate>(&client);
    let store = controller.store();
    certificates.watch(store.clone());
    // A change to a Secret this controller manages wakes the certificate that writes it,
    // every certificate it is the CA of, and the CA of the certificate that writes it (a
    // rotation waits for the certificates it signs).
    let secrets = watcher::Config::default().labels(OWNER_NAME_LABEL);
    let controller = controller.watches(
        Api::<Secret>::all(client),
        secrets,
        move |secret: Secret| {
            let key = (secret.namespace().unwrap_or_default(), secret.name_any());
            let all = store.state();
            let cas: Vec<(String, String)> = all
                .iter()
                .filter_map(|dsc| {
                    let valid = dsc
                        .spec
                        .validate(&dsc.namespace().unwrap_or_default())
                        .ok()?;
                    (valid.secret == key).then_some(valid.ca_secret).flatten()
                })
                .collect();
            all.iter()
                .filter(|dsc| references(dsc, &key) || cas.iter().any(|ca| writes(dsc, ca)))
                .map(|dsc| ObjectRef::from_obj(&**dsc))
                .collect::<Vec<_>>()
        },
    );
    marin3r_controller::run(
        controller, CONTROLLER, deadline, metrics, reconcile, ctx, shutdown,
    )
    .await;
}

fn writes(dsc: &DiscoveryServiceCertificate, key: &(String, String)) -> bool {
    let ns = dsc.namespace().unwrap_or_default();
    dsc.spec
        .validate(&ns)
        .is_ok_and(|valid| &valid.secret == key)
}

fn references(dsc: &DiscoveryServiceCertificate, key: &(String, String)) -> bool {
    let ns = dsc.namespace().unwrap_or_default();
    match dsc.spec.validate(&ns) {
        Ok(valid) => &valid.secret == key || valid.ca_secret.as_ref() == Some(key),
        Err(_) => false,
    }
}

/// Issues on a blocking thread: key generation (RSA-4096 takes seconds) must not hold an
/// async worker.
async fn off_the_runtime(
    issue: impl FnOnce() -> Result<crate::IssuedCertificate, crate::CertError> + Send + 'static,
) -> Result<crate::IssuedCertificate, crate::CertError> {
    tokio::task::spawn_blocking(issue)
        .await
        .unwrap_or_else(|e| Err(crate::CertError::IssuingTask(e)))
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
            && marin3r_controller::delete_ignoring_missing(&secrets, &valid.secret.1).await?
        {
            info!(secret = %format!("{}/{}", valid.secret.0, valid.secret.1), "deleted the Secret of a deleted certificate");
        }
    }
    Ok(Action::await_change())
}

fn written_for(secret: &Secret, dsc: &DiscoveryServiceCertificate) -> bool {
    let labels = secret.labels();
    labels.get(OWNER_NAME_LABEL) == Some(&owner_name_label(&dsc.name_any()))
        && labels.get(OWNER_NAMESPACE_LABEL) == dsc.namespace().as_ref()
}

/// Reads what the certificate depends on: its Secret and its CA Secret, for a spec that
/// passes the checks.
async fn observe<'a>(
    dsc: &'a DiscoveryServiceCertificate,
    ctx: &Context,
) -> Result<Observed<'a>, Error> {
    let ns = dsc.namespace().unwrap_or_default();
    let spec = plan::check_spec(dsc, ctx.config.trusted_namespaces.contains(&ns));
    let (mut ca_secret, mut secret) = (None, None);
    if let Ok(valid) = &spec {
        if let Some((ca_ns, ca_name)) = &valid.ca_secret {
            let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ca_ns);
            ca_secret = api.get_opt(ca_name).await?;
        }
        let (secret_ns, secret_name) = &valid.secret;
        let api: Api<Secret> = Api::namespaced(ctx.client.clone(), secret_ns);
        secret = api.get_opt(secret_name).await?;
    }
    let mut dependents = Vec::new();
    if let Ok(valid) = &spec
        && valid.request.is_ca
        && secret.as_ref().is_some_and(bundle::rotating)
    {
        dependents = read_dependents(ctx, &valid.secret).await?;
    }
    Ok(Observed {
        dsc,
        spec,
        ca_secret,
        secret,
        now: OffsetDateTime::now_utc(),
        min_renewal_interval: ctx.config.min_renewal_interval,
        dependents,
        trust_propagation: ctx.config.trust_propagation,
    })
}

/// The Secrets (those that exist) of every certificate signed from the CA Secret `ca`.
async fn read_dependents(
    ctx: &Context,
    ca: &(String, String),
) -> Result<Vec<(String, triggers::TlsFiles)>, Error> {
    let all = Api::<DiscoveryServiceCertificate>::all(ctx.client.clone())
        .list(&Default::default())
        .await?;
    let mut out = Vec::new();
    let trusted = &ctx.config.trusted_namespaces;
    for (secret_ns, secret_name) in all.iter().filter_map(|d| plan::dependent(d, ca, trusted)) {
        let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &secret_ns);
        if let Some(secret) = api.get_opt(&secret_name).await? {
            out.push((
                format!("{secret_ns}/{secret_name}"),
                plan::tls_files(&secret),
            ));
        }
    }
    Ok(out)
}

/// Observes, decides, issues when the plan says so, and writes the outcome.
async fn apply(dsc: Arc<DiscoveryServiceCertificate>, ctx: &Context) -> Result<Action, Error> {
    let obs = observe(&dsc, ctx).await?;
    let outcome = act(ctx, &obs).await?;
    ctx.events.publish_all(&*dsc, &outcome.events).await;
    write_status(ctx, &dsc, &outcome.status).await?;
    Ok(outcome
        .requeue
        .map_or_else(Action::await_change, Action::requeue))
}

/// Carries out the plan for what was observed: writes the Secret, issuing first when asked.
async fn act(ctx: &Context, obs: &Observed<'_>) -> Result<report::Outcome, Error> {
    let valid = match &obs.spec {
        Ok(valid) => valid,
        Err(not_ready) => return Ok(report::not_ready(obs, not_ready.clone())),
    };
    Ok(match plan::decide(obs) {
        Plan::NotReady(not_ready) => report::not_ready(obs, not_ready),
        Plan::Keep(current) => report::report(obs, valid, &current, None),
        Plan::Update { update, then } => {
            patch_secret(ctx, obs.dsc, valid, &update).await?;
            report::report(obs, valid, &then, None)
        }
        Plan::StartRotation {
            state,
            reason,
            renew_request,
        } => start_rotation(ctx, obs, valid, &state, reason, renew_request).await?,
        Plan::Issue {
            ca,
            reason,
            renew_request,
            trust_pem,
        } => {
            let issuing = Issuing {
                ca,
                reason,
                renew_request,
                trust_pem,
            };
            issue(ctx, obs, valid, issuing).await?
        }
    })
}

/// What [`Plan::Issue`] asks for.
struct Issuing {
    ca: Option<Box<crate::CertificateAuthority>>,
    reason: triggers::IssueReason,
    renew_request: Option<String>,
    trust_pem: Option<String>,
}

/// Issues the next CA of a self-signed CA and writes it beside the current one.
async fn start_rotation(
    ctx: &Context,
    obs: &Observed<'_>,
    valid: &ValidSpec,
    state: &rotation::CaState<bundle::Cert>,
    reason: triggers::IssueReason,
    renew_request: Option<String>,
) -> Result<report::Outcome, Error> {
    let request = valid.request.clone();
    let next = match off_the_runtime(move || issue_self_signed(&request)).await {
        Ok(next) => next,
        Err(e) => {
            let not_ready = NotReady::new(Reason::IssuanceFailed, marin3r_controller::chain(&e));
            return Ok(report::not_ready(obs, not_ready));
        }
    };
    let update = bundle::start(state, &next, renew_request.as_deref());
    patch_secret(ctx, obs.dsc, valid, &update).await?;
    let bundle_pem = update
        .data
        .get("ca.crt")
        .cloned()
        .flatten()
        .unwrap_or_default();
    let dsc = obs.dsc;
    info!(certificate = %dsc.name_any(), namespace = ?dsc.namespace(), %reason, "issued the next CA; rotation started");
    let current = plan::started(&reason, bundle_pem, state.signer.id.pem.clone());
    Ok(report::report(obs, valid, &current, None))
}

/// Issues the certificate (signed by the CA, or self-signed) and writes it into its Secret.
async fn issue(
    ctx: &Context,
    obs: &Observed<'_>,
    valid: &ValidSpec,
    issuing: Issuing,
) -> Result<report::Outcome, Error> {
    let Issuing {
        ca,
        reason,
        renew_request,
        trust_pem,
    } = issuing;
    let request = valid.request.clone();
    let issued = off_the_runtime(move || match &ca {
        Some(ca) => ca.issue(&request),
        None => issue_self_signed(&request),
    })
    .await;
    let mut issued = match issued {
        Ok(issued) => issued,
        Err(e) => {
            let not_ready = NotReady::new(Reason::IssuanceFailed, marin3r_controller::chain(&e));
            return Ok(report::not_ready(obs, not_ready));
        }
    };
    if let Some(trust) = trust_pem {
        issued.ca_pem = trust;
    }
    let dsc = obs.dsc;
    write_secret(ctx, dsc, valid, &issued, renew_request.as_deref()).await?;
    // A CA issued afresh starts no rotation where an earlier one stopped.
    if let Some(forget) = obs.secret.as_ref().and_then(bundle::forget_rotation) {
        patch_secret(ctx, dsc, valid, &forget).await?;
    }
    info!(certificate = %dsc.name_any(), namespace = ?dsc.namespace(), %reason, "issued certificate");
    let current = plan::Current {
        cert_pem: issued.cert_pem.clone(),
        ca_pem: Some(issued.ca_pem.clone()),
        rotation: None,
    };
    Ok(report::report(obs, valid, &current, Some(&reason)))
}

async fn write_secret(
    ctx: &Context,
    dsc: &DiscoveryServiceCertificate,
    valid: &ValidSpec,
    issued: &crate::IssuedCertificate,
    renew_request: Option<&str>,
) -> Result<(), Error> {
    let (ns, name) = &valid.secret;
    let mut labels = BTreeMap::new();
    labels.insert(
        OWNER_NAME_LABEL.to_owned(),
        owner_name_label(&dsc.name_any()),
    );
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
    let data = bundle::secret_data([
        ("tls.crt", issued.cert_pem.as_str()),
        ("tls.key", &issued.key_pem),
        ("ca.crt", &issued.ca_pem),
    ]);
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
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    match marin3r_controller::apply::<_, Error>(&secrets, &secret, FIELD_MANAGER).await {
        Err(Error::Kube(e)) if immutable::refused_as_immutable(&e) => {
            if immutable::unfreeze(&secrets, name, dsc).await?.is_none() {
                return Err(Error::Kube(e));
            }
            marin3r_controller::apply::<_, Error>(&secrets, &secret, FIELD_MANAGER).await?;
            Ok(())
        }
        result => result.map(|_| ()),
    }
}

/// Changes some keys of the certificate's Secret (a merge patch); one `dsc` wrote that was
/// made immutable is created again with the change (see [`immutable`]).
async fn patch_secret(
    ctx: &Context,
    dsc: &DiscoveryServiceCertificate,
    valid: &ValidSpec,
    update: &bundle::SecretUpdate,
) -> Result<(), Error> {
    let (ns, name) = &valid.secret;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let patched = secrets
        .patch(
            name,
            &kube::api::PatchParams::apply(FIELD_MANAGER),
            &kube::api::Patch::Merge(update.merge_patch()),
        )
        .await;
    match patched {
        Err(e) if immutable::refused_as_immutable(&e) => {
            let Some(old) = immutable::unfreeze(&secrets, name, dsc).await? else {
                return Err(e.into());
            };
            immutable::recreate(&secrets, &old, update).await
        }
        result => result.map(|_| ()).map_err(Error::from),
    }
}

async fn write_status(
    ctx: &Context,
    dsc: &DiscoveryServiceCertificate,
    status: &DiscoveryServiceCertificateStatus,
) -> Result<(), Error> {
    if dsc.status.as_ref() == Some(status) {
        return Ok(());
    }
    let api: Api<DiscoveryServiceCertificate> =
        Api::namespaced(ctx.client.clone(), &dsc.namespace().unwrap_or_default());
    // `rotation` goes when a rotation ends.
    let patch = status_patch(status, &["rotation"], None)?;
    patch_status(&api, &dsc.name_any(), patch, FIELD_MANAGER).await?;
    Ok(())
}
