//! Admission webhooks, called as kube-apiserver calls them. Mutating: on Pod CREATE, every
//! matching MutatingWebhookConfiguration webhook, its JSONPatch applied. Validating: on CREATE
//! and UPDATE of any resource (subresources included), after mutation and schema validation,
//! every matching ValidatingWebhookConfiguration webhook. Matching is by rules (operations,
//! groups, versions, resources, scope), namespaceSelector and objectSelector; each call is
//! HTTPS trusting only the webhook's `caBundle`; `failurePolicy` and `timeoutSeconds` are
//! honoured; `response.warnings` are collected for the `Warning` headers of the response.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio_rustls::TlsConnector;

use super::ServerState;
use super::error::ApiError;
use super::meta;
use super::patch::{self, PatchKind};
use super::registry::ResourceInfo;
use super::selectors::{LabelSelector, Selectors};
use super::tls;

/// Where to send a review, resolved from `clientConfig`.
#[derive(Debug, Clone)]
struct Endpoint {
    /// What to connect to.
    connect: String,
    /// The name the certificate must carry.
    server_name: String,
    path: String,
    url: String,
}

/// The write being admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Self::Create => "CREATE",
            Self::Update => "UPDATE",
        }
    }

    fn options_kind(self) -> &'static str {
        match self {
            Self::Create => "CreateOptions",
            Self::Update => "UpdateOptions",
        }
    }
}

/// What the webhooks are asked about: the resource (and subresource) written, how, where.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    pub info: &'a ResourceInfo,
    pub subresource: Option<&'a str>,
    pub operation: Operation,
    pub namespace: &'a str,
    pub dry_run: bool,
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn any_matches(list: &[&str], want: &str) -> bool {
    list.iter().any(|x| *x == "*" || *x == want)
}

/// Whether a rule's `resources` entry selects `plural` (and `subresource`): `pods` only the
/// main resource, `pods/status` that subresource, `pods/*` both, `*` every main resource,
/// `*/*` everything, `*/status` every status subresource.
fn resource_matches(entry: &str, plural: &str, subresource: Option<&str>) -> bool {
    let (resource, sub) = match entry.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (entry, None),
    };
    let resource_ok = resource == "*" || resource == plural;
    resource_ok
        && match (sub, subresource) {
            (None, None) => true,
            (Some("*"), _) => true,
            (Some(want), Some(have)) => want == have,
            _ => false,
        }
}

/// Whether a webhook's rules select this write.
fn rules_match(webhook: &Value, attrs: &Attributes<'_>) -> bool {
    let info = attrs.info;
    webhook
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|rule| {
            let scope_ok = match rule.get("scope").and_then(Value::as_str) {
                Some("Cluster") => !info.namespaced,
                Some("Namespaced") => info.namespaced,
                _ => true,
            };
            scope_ok
                && any_matches(&strings(rule.get("operations")), attrs.operation.as_str())
                && any_matches(&strings(rule.get("apiGroups")), &info.group)
                && any_matches(&strings(rule.get("apiVersions")), &info.version)
                && strings(rule.get("resources"))
                    .iter()
                    .any(|r| resource_matches(r, &info.plural, attrs.subresource))
        })
}

fn selector_matches(
    sel: Option<&Value>,
    labels: Option<&serde_json::Map<String, Value>>,
) -> Result<bool, String> {
    match sel {
        None => Ok(true),
        Some(s) => Ok(LabelSelector::from_object(s)?.matches_labels(labels)),
    }
}

/// Which kind of webhook configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mutating,
    Validating,
}

impl Kind {
    fn plural(self) -> &'static str {
        match self {
            Self::Mutating => "mutatingwebhookconfigurations",
            Self::Validating => "validatingwebhookconfigurations",
        }
    }
}

/// Every webhook of every configuration of `kind` whose rules select the write (selectors
/// not yet applied), each with its configuration's order kept.
fn candidates(state: &Arc<ServerState>, kind: Kind, attrs: &Attributes<'_>) -> Vec<Value> {
    let registry = state.store.registry();
    let Some(info) = registry
        .find("admissionregistration.k8s.io", "v1", kind.plural())
        .cloned()
    else {
        return Vec::new();
    };
    let (configs, _) = state.store.list(&info, None, &Selectors::default());
    configs
        .iter()
        .flat_map(|c| {
            c.get("webhooks")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter(|w| rules_match(w, attrs))
        .collect()
}

/// Whether any validating webhook's rules select this write: when none does, the write
/// needs no dry run first.
pub fn validating_selected(state: &Arc<ServerState>, attrs: &Attributes<'_>) -> bool {
    !candidates(state, Kind::Validating, attrs).is_empty()
}

/// Whether the webhook's namespaceSelector and objectSelector select the write. A
/// cluster-scoped object other than a Namespace is selected by any namespaceSelector; a
/// Namespace is judged by its own labels. On UPDATE the objectSelector may match the new or
/// the old object.
fn selectors_match(
    state: &Arc<ServerState>,
    webhook: &Value,
    attrs: &Attributes<'_>,
    obj: &Value,
    old: Option<&Value>,
) -> bool {
    let info = attrs.info;
    let is_namespace = info.group.is_empty() && info.plural == "namespaces";
    let namespace_ok = if is_namespace {
        selector_matches(webhook.get("namespaceSelector"), meta::labels(obj)).unwrap_or(false)
    } else if !info.namespaced {
        true
    } else {
        let registry = state.store.registry();
        let ns_labels = registry
            .find("", "v1", "namespaces")
            .and_then(|nsi| state.store.get(nsi, "", attrs.namespace).ok())
            .and_then(|n| meta::labels(&n).cloned());
        selector_matches(webhook.get("namespaceSelector"), ns_labels.as_ref()).unwrap_or(false)
    };
    let object_selector = webhook.get("objectSelector");
    let object_ok = selector_matches(object_selector, meta::labels(obj)).unwrap_or(false)
        || old.is_some_and(|o| selector_matches(object_selector, meta::labels(o)).unwrap_or(false));
    namespace_ok && object_ok
}

fn webhook_name(webhook: &Value) -> String {
    webhook
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

/// A webhook's denial as kube-apiserver reports it (`webhookerrors.ToStatusErr`): the code
/// the webhook gave, at least 400; `admission webhook "<name>" denied the request: <message>`.
fn denial(name: &str, code: u16, reason: &str, message: &str) -> ApiError {
    let denied_by = format!("admission webhook {name:?} denied the request");
    let message = if !message.is_empty() {
        format!("{denied_by}: {message}")
    } else if !reason.is_empty() {
        format!("{denied_by}: {reason}")
    } else {
        format!("{denied_by} without explanation")
    };
    ApiError::new(code.max(400), static_reason(reason), message)
}

/// The webhook's `status.reason` when it is one of Kubernetes' reasons.
fn static_reason(reason: &str) -> &'static str {
    const REASONS: [&str; 16] = [
        "Unauthorized",
        "Forbidden",
        "NotFound",
        "AlreadyExists",
        "Conflict",
        "Gone",
        "Invalid",
        "ServerTimeout",
        "StoreReadError",
        "Timeout",
        "TooManyRequests",
        "BadRequest",
        "MethodNotAllowed",
        "NotAcceptable",
        "RequestEntityTooLarge",
        "UnsupportedMediaType",
    ];
    REASONS
        .iter()
        .find(|r| **r == reason)
        .copied()
        .unwrap_or("")
}

/// Runs every matching mutating webhook in order over `obj` (Pod CREATE), returning the
/// admitted object; their warnings are added to `warnings`.
pub async fn admit(
    state: &Arc<ServerState>,
    info: &ResourceInfo,
    ns: &str,
    mut obj: Value,
    dry_run: bool,
    warnings: &mut Vec<String>,
) -> Result<Value, ApiError> {
    let attrs = Attributes {
        info,
        subresource: None,
        operation: Operation::Create,
        namespace: ns,
        dry_run,
    };
    let webhooks = candidates(state, Kind::Mutating, &attrs);
    if webhooks.is_empty() {
        return Ok(obj);
    }
    meta::set(&mut obj, "namespace", json!(ns));
    for webhook in &webhooks {
        if !selectors_match(state, webhook, &attrs, &obj, None) {
            continue;
        }
        let name = webhook_name(webhook);
        let ignore = webhook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
        match call(state, Kind::Mutating, &attrs, &obj, None, webhook).await {
            Ok(Verdict::Allowed { patch, warnings: w }) => {
                warnings.extend(w);
                if let Some(patch) = patch {
                    obj = patch::apply(PatchKind::Json, &obj, &patch).map_err(|e| {
                        ApiError::internal(format!("Internal error occurred: webhook {name:?} returned a patch that does not apply: {e}"))
                    })?;
                }
            }
            Ok(Verdict::Denied {
                code,
                reason,
                message,
                warnings: w,
            }) => {
                warnings.extend(w);
                return Err(denial(&name, code, &reason, &message));
            }
            Err(e) if ignore => {
                tracing::warn!(webhook = %name, error = %e, "webhook failed; ignored by its failurePolicy");
            }
            Err(e) => {
                return Err(ApiError::internal(format!(
                    "Internal error occurred: failed calling webhook {name:?}: {e}"
                )));
            }
        }
    }
    Ok(obj)
}

/// Runs every matching validating webhook over `obj` (as it would be stored) and `old` (the
/// stored object, on UPDATE): the first denial or failed call (failurePolicy Fail) refuses
/// the write. Their warnings are added to `warnings`.
pub async fn validate(
    state: &Arc<ServerState>,
    attrs: &Attributes<'_>,
    obj: &Value,
    old: Option<&Value>,
    warnings: &mut Vec<String>,
) -> Result<(), ApiError> {
    for webhook in candidates(state, Kind::Validating, attrs) {
        if !selectors_match(state, &webhook, attrs, obj, old) {
            continue;
        }
        let name = webhook_name(&webhook);
        let ignore = webhook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
        match call(state, Kind::Validating, attrs, obj, old, &webhook).await {
            Ok(Verdict::Allowed { warnings: w, .. }) => warnings.extend(w),
            Ok(Verdict::Denied {
                code,
                reason,
                message,
                warnings: w,
            }) => {
                warnings.extend(w);
                return Err(denial(&name, code, &reason, &message));
            }
            Err(e) if ignore => {
                tracing::warn!(webhook = %name, error = %e, "webhook failed; ignored by its failurePolicy");
            }
            Err(e) => {
                return Err(ApiError::internal(format!(
                    "Internal error occurred: failed calling webhook {name:?}: {e}"
                )));
            }
        }
    }
    Ok(())
}

enum Verdict {
    Allowed {
        patch: Option<Vec<u8>>,
        warnings: Vec<String>,
    },
    Denied {
        code: u16,
        reason: String,
        message: String,
        warnings: Vec<String>,
    },
}

async fn call(
    state: &Arc<ServerState>,
    kind: Kind,
    attrs: &Attributes<'_>,
    obj: &Value,
    old: Option<&Value>,
    webhook: &Value,
) -> Result<Verdict, String> {
    let info = attrs.info;
    let endpoint = resolve(state, webhook.get("clientConfig").unwrap_or(&Value::Null))?;
    let ca_pem = webhook
        .pointer("/clientConfig/caBundle")
        .and_then(Value::as_str)
        .map(|b| base64::engine::general_purpose::STANDARD.decode(b))
        .transpose()
        .map_err(|e| format!("caBundle is not base64: {e}"))?
        .ok_or("the webhook has no caBundle")?;
    let ca_pem = String::from_utf8(ca_pem).map_err(|_| "caBundle is not PEM text".to_owned())?;
    let uid = uuid::Uuid::new_v4().to_string();
    let gvk = json!({"group": info.group, "version": info.version, "kind": info.kind});
    let resource = json!({"group": info.group, "version": info.version, "resource": info.plural});
    let mut request = json!({
        "uid": uid,
        "kind": gvk,
        "resource": resource,
        "requestKind": gvk,
        "requestResource": resource,
        "name": meta::name(obj),
        "operation": attrs.operation.as_str(),
        "userInfo": {"username": "local-cluster-admin", "groups": ["system:masters", "system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": attrs.dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": attrs.operation.options_kind()},
    });
    if info.namespaced {
        request["namespace"] = json!(attrs.namespace);
    }
    if let Some(sub) = attrs.subresource {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": request,
    });
    let timeout = Duration::from_secs(
        webhook
            .get("timeoutSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(10)
            .clamp(1, 30),
    );
    let (delay, fail) = state.faults.webhook_faults();
    let exchange = async {
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        if fail {
            return Err("connection refused (injected fault)".to_owned());
        }
        post(&endpoint, &ca_pem, &review).await
    };
    let response = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| {
            format!(
                "failed to call webhook: Post {:?}: context deadline exceeded (timeout {}s)",
                endpoint.url,
                timeout.as_secs()
            )
        })??;
    let response = response
        .get("response")
        .ok_or("the webhook's AdmissionReview has no response")?;
    if response.get("uid").and_then(Value::as_str) != Some(uid.as_str()) {
        return Err(format!(
            "expected response.uid={uid:?}, got {:?}",
            response.get("uid")
        ));
    }
    let warnings: Vec<String> = strings(response.get("warnings"))
        .into_iter()
        .map(str::to_owned)
        .collect();
    if response.get("allowed").and_then(Value::as_bool) != Some(true) {
        let text = |p: &str| {
            response
                .pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let code = response
            .pointer("/status/code")
            .and_then(Value::as_u64)
            .map_or(400, |c| u16::try_from(c).unwrap_or(500).min(599));
        return Ok(Verdict::Denied {
            code,
            reason: text("/status/reason"),
            message: text("/status/message"),
            warnings,
        });
    }
    let Some(patch) = response.get("patch").and_then(Value::as_str) else {
        return Ok(Verdict::Allowed {
            patch: None,
            warnings,
        });
    };
    if kind == Kind::Validating {
        return Err("validating webhook may not return a patch".into());
    }
    if let Some(t) = response.get("patchType").and_then(Value::as_str)
        && t != "JSONPatch"
    {
        return Err(format!("unsupported patchType {t:?}"));
    }
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .map_err(|e| format!("the patch is not base64: {e}"))?;
    Ok(Verdict::Allowed {
        patch: Some(patch),
        warnings,
    })
}

/// `clientConfig.url`, or `clientConfig.service` resolved to a ready pod behind the Service.
fn resolve(state: &Arc<ServerState>, config: &Value) -> Result<Endpoint, String> {
    if let Some(url) = config.get("url").and_then(Value::as_str) {
        let rest = url
            .strip_prefix("https://")
            .ok_or_else(|| format!("webhook url {url:?} must be https"))?;
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => (
                h,
                p.parse::<u16>()
                    .map_err(|_| format!("bad port in {url:?}"))?,
            ),
            _ => (authority, 443),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let connect = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        return Ok(Endpoint {
            connect,
            server_name: host.to_owned(),
            path: if path.is_empty() {
                "/".into()
            } else {
                path.into()
            },
            url: url.into(),
        });
    }
    let svc_ref = config
        .get("service")
        .ok_or("clientConfig has neither url nor service")?;
    let text = |k: &str| {
        svc_ref
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let (ns, name, path) = (text("namespace"), text("name"), text("path"));
    let port = svc_ref.get("port").and_then(Value::as_u64).unwrap_or(443);
    let registry = state.store.registry();
    let services = registry
        .find("", "v1", "services")
        .ok_or("services are not served")?;
    let pods = registry
        .find("", "v1", "pods")
        .ok_or("pods are not served")?;
    let svc = state
        .store
        .get(services, &ns, &name)
        .map_err(|_| format!("service \"{ns}/{name}\" not found"))?;
    let svc_port = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|p| p.get("port").and_then(Value::as_u64) == Some(port))
        .ok_or_else(|| format!("service \"{ns}/{name}\" has no port {port}"))?;
    let selector = svc.pointer("/spec/selector").cloned().unwrap_or(json!({}));
    let selector = LabelSelector::from_object(&json!({"matchLabels": selector}))?;
    let (candidates, _) = state.store.list(
        pods,
        Some(&ns),
        &Selectors {
            labels: selector,
            ..Selectors::default()
        },
    );
    // A ready endpoint, as the Service routes: terminating pods only when no other is ready
    // (their endpoints are `serving` but not `ready`).
    let ready: Vec<&Value> = candidates
        .iter()
        .filter(|p| {
            is_ready(p)
                && p.pointer("/status/podIP")
                    .and_then(Value::as_str)
                    .is_some_and(|ip| !ip.is_empty())
        })
        .collect();
    let pod = ready
        .iter()
        .find(|p| {
            p.pointer("/metadata/deletionTimestamp")
                .is_none_or(Value::is_null)
        })
        .or_else(|| ready.first())
        .copied()
        .ok_or_else(|| format!("no endpoints available for service \"{name}\""))?;
    let ip = pod
        .pointer("/status/podIP")
        .and_then(Value::as_str)
        .unwrap_or("");
    let target = match svc_port.get("targetPort") {
        Some(Value::Number(n)) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Some(Value::String(named)) => named_port(pod, named),
        _ => u16::try_from(port).ok(),
    }
    .ok_or_else(|| {
        format!("cannot resolve the target port of service \"{ns}/{name}\" port {port}")
    })?;
    let connect = if ip.contains(':') {
        format!("[{ip}]:{target}")
    } else {
        format!("{ip}:{target}")
    };
    Ok(Endpoint {
        url: format!("https://{name}.{ns}.svc:{port}{path}"),
        connect,
        server_name: format!("{name}.{ns}.svc"),
        path: if path.is_empty() { "/".into() } else { path },
    })
}

fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| {
            c.get("type").and_then(Value::as_str) == Some("Ready")
                && c.get("status").and_then(Value::as_str) == Some("True")
        })
}

fn named_port(pod: &Value, name: &str) -> Option<u16> {
    pod.pointer("/spec/containers")?
        .as_array()?
        .iter()
        .flat_map(|c| {
            c.get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .find(|p| p.get("name").and_then(Value::as_str) == Some(name))
        .and_then(|p| p.get("containerPort")?.as_u64())
        .and_then(|p| u16::try_from(p).ok())
}

async fn post(endpoint: &Endpoint, ca_pem: &str, review: &Value) -> Result<Value, String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        format!(
            "failed to call webhook: Post {:?}: {what}: {e}",
            endpoint.url
        )
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in tls::certs_from_pem(ca_pem).map_err(|e| format!("caBundle: {e}"))? {
        roots.add(cert).map_err(|e| format!("caBundle: {e}"))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server_name =
        ServerName::try_from(endpoint.server_name.clone()).map_err(|e| fail("server name", &e))?;
    let tcp = tokio::net::TcpStream::connect(&endpoint.connect)
        .await
        .map_err(|e| fail("dial tcp", &e))?;
    let stream = TlsConnector::from(Arc::new(config))
        .connect(server_name, tcp)
        .await
        .map_err(|e| fail("tls", &e))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| fail("http", &e))?;
    let conn = tokio::spawn(conn);
    let body = serde_json::to_vec(review).map_err(|e| e.to_string())?;
    let request = hyper::Request::post(&endpoint.path)
        .header("host", &endpoint.server_name)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| fail("request", &e))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| fail("send", &e))?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| fail("read", &e))?
        .to_bytes();
    conn.abort();
    if !status.is_success() {
        return Err(fail(
            "status",
            &format!("{status}: {}", String::from_utf8_lossy(&bytes)),
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| fail("decode AdmissionReview", &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_match_as_in_kube_apiserver() {
        let cases = [
            ("pods", "pods", None, true),
            ("pods", "pods", Some("status"), false),
            ("pods/status", "pods", Some("status"), true),
            ("pods/status", "pods", None, false),
            ("pods/*", "pods", None, true),
            ("pods/*", "pods", Some("status"), true),
            ("*", "configmaps", None, true),
            ("*", "configmaps", Some("status"), false),
            ("*/*", "configmaps", Some("status"), true),
            ("*/status", "envoyconfigs", Some("status"), true),
            ("*/status", "envoyconfigs", Some("scale"), false),
            ("envoyconfigs", "pods", None, false),
        ];
        for (entry, plural, sub, want) in cases {
            assert_eq!(
                resource_matches(entry, plural, sub),
                want,
                "{entry} {plural} {sub:?}"
            );
        }
    }

    #[test]
    fn denials_are_worded_and_coded_as_kube_apiserver_does() {
        let e = denial("hook.example.com", 0, "", "");
        assert_eq!(
            (e.code, e.reason, e.message.as_str()),
            (
                400,
                "",
                "admission webhook \"hook.example.com\" denied the request without explanation"
            )
        );
        let e = denial("hook.example.com", 403, "Forbidden", "no");
        assert_eq!(
            (e.code, e.reason, e.message.as_str()),
            (
                403,
                "Forbidden",
                "admission webhook \"hook.example.com\" denied the request: no"
            )
        );
        let e = denial("h", 200, "Invalid", "");
        assert_eq!(
            (e.code, e.reason, e.message.as_str()),
            (
                400,
                "Invalid",
                "admission webhook \"h\" denied the request: Invalid"
            )
        );
        assert_eq!(denial("h", 422, "made-up", "m").reason, "");
    }
}
