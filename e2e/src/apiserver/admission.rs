//! Mutating admission for Pod CREATE: every matching MutatingWebhookConfiguration webhook
//! (rules, namespaceSelector, objectSelector) is called over HTTPS trusting only its
//! `caBundle`, its JSONPatch applied; `failurePolicy` and `timeoutSeconds` honoured.

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

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn any_matches(list: &[&str], want: &str) -> bool {
    list.iter().any(|x| *x == "*" || *x == want)
}

/// Whether a webhook's rules select a CREATE of `info`.
fn rules_match(webhook: &Value, info: &ResourceInfo) -> bool {
    webhook
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|rule| {
            any_matches(&strings(rule.get("operations")), "CREATE")
                && any_matches(&strings(rule.get("apiGroups")), &info.group)
                && any_matches(&strings(rule.get("apiVersions")), &info.version)
                && strings(rule.get("resources"))
                    .iter()
                    .any(|r| *r == "*" || *r == "*/*" || *r == info.plural)
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

/// Runs every matching webhook in order over `obj`, returning the admitted object.
pub async fn admit(
    state: &Arc<ServerState>,
    info: &ResourceInfo,
    ns: &str,
    mut obj: Value,
    dry_run: bool,
) -> Result<Value, ApiError> {
    let registry = state.store.registry();
    let Some(mwc) = registry
        .find(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
        )
        .cloned()
    else {
        return Ok(obj);
    };
    let (configs, _) = state.store.list(&mwc, None, &Selectors::default());
    if configs.is_empty() {
        return Ok(obj);
    }
    meta::set(&mut obj, "namespace", json!(ns));
    let ns_labels = registry
        .find("", "v1", "namespaces")
        .and_then(|nsi| state.store.get(nsi, "", ns).ok())
        .and_then(|n| meta::labels(&n).cloned());
    for config in &configs {
        for webhook in config
            .get("webhooks")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = webhook
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let selected = rules_match(webhook, info)
                && selector_matches(webhook.get("namespaceSelector"), ns_labels.as_ref())
                    .unwrap_or(false)
                && selector_matches(webhook.get("objectSelector"), meta::labels(&obj))
                    .unwrap_or(false);
            if !selected {
                continue;
            }
            let ignore = webhook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
            match call(state, info, ns, &obj, webhook, dry_run).await {
                Ok(Verdict::Allowed(Some(patch))) => {
                    obj = patch::apply(PatchKind::Json, &obj, &patch).map_err(|e| {
                        ApiError::internal(format!("Internal error occurred: webhook {name:?} returned a patch that does not apply: {e}"))
                    })?;
                }
                Ok(Verdict::Allowed(None)) => {}
                Ok(Verdict::Denied { code, message }) => {
                    let mut err = ApiError::forbidden(format!(
                        "admission webhook {name:?} denied the request: {message}"
                    ));
                    err.code = code;
                    return Err(err);
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
    }
    Ok(obj)
}

enum Verdict {
    Allowed(Option<Vec<u8>>),
    Denied { code: u16, message: String },
}

async fn call(
    state: &Arc<ServerState>,
    info: &ResourceInfo,
    ns: &str,
    obj: &Value,
    webhook: &Value,
    dry_run: bool,
) -> Result<Verdict, String> {
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
    let kind = json!({"group": info.group, "version": info.version, "kind": info.kind});
    let resource = json!({"group": info.group, "version": info.version, "resource": info.plural});
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "requestResource": resource,
            "name": meta::name(obj),
            "namespace": ns,
            "operation": "CREATE",
            "userInfo": {"username": "local-cluster-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": obj,
            "oldObject": null,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
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
    if response.get("allowed").and_then(Value::as_bool) != Some(true) {
        let message = response
            .pointer("/status/message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let code = response
            .pointer("/status/code")
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok())
            .filter(|c| (400..600).contains(c))
            .unwrap_or(403);
        return Ok(Verdict::Denied { code, message });
    }
    let Some(patch) = response.get("patch").and_then(Value::as_str) else {
        return Ok(Verdict::Allowed(None));
    };
    if let Some(t) = response.get("patchType").and_then(Value::as_str)
        && t != "JSONPatch"
    {
        return Err(format!("unsupported patchType {t:?}"));
    }
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .map_err(|e| format!("the patch is not base64: {e}"))?;
    Ok(Verdict::Allowed(Some(patch)))
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
    let pod = candidates
        .iter()
        .find(|p| {
            is_ready(p)
                && p.pointer("/status/podIP")
                    .and_then(Value::as_str)
                    .is_some_and(|ip| !ip.is_empty())
        })
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
