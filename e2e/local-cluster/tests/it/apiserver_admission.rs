//! Admission webhooks: a test webhook over HTTPS (its own CA, trusted only through
//! `caBundle`) reached by URL and through a Service resolved to a ready pod. Mutating on Pod
//! create: its JSONPatch is applied, its denial blocks the create, and failurePolicy,
//! timeoutSeconds, objectSelector and namespaceSelector are honoured. Validating on create
//! and update, after mutation, through real kubectl: denials as kube-apiserver words them,
//! selectors, failurePolicy with the webhook down, and warnings printed as `Warning:` lines.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use base64::Engine;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use marin3r_local_cluster::apiserver::{ApiServer, ApiServerConfig};
use marin3r_local_cluster::pki::Ca;
use serde_json::{Value, json};

type Reviews = Arc<Mutex<Vec<Value>>>;

async fn mutate(State(seen): State<Reviews>, Json(review): Json<Value>) -> Json<Value> {
    seen.lock().unwrap().push(review.clone());
    let request = &review["request"];
    let uid = request["uid"].clone();
    let response = if request["object"]["metadata"]["labels"]["deny"] == "true" {
        json!({"uid": uid, "allowed": false, "status": {"code": 403, "message": "pods labelled deny are not welcome"}})
    } else {
        let patch = json!([{"op": "add", "path": "/metadata/labels/hooked", "value": "yes"}]);
        let patch = base64::engine::general_purpose::STANDARD.encode(patch.to_string());
        json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": patch, "warnings": ["the test webhook added the label \"hooked\""]})
    };
    Json(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
    )
}

/// Denies objects labelled `deny: "true"` (without a code: the API server answers 400),
/// warns about every object it admits.
async fn validate(State(seen): State<Reviews>, Json(review): Json<Value>) -> Json<Value> {
    seen.lock().unwrap().push(review.clone());
    let request = &review["request"];
    let uid = request["uid"].clone();
    let name = request["object"]["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    let response = if request["object"]["metadata"]["labels"]["deny"] == "true" {
        json!({"uid": uid, "allowed": false, "status": {"message": format!("{name} is labelled deny")}})
    } else {
        json!({"uid": uid, "allowed": true, "warnings": [format!("{name} was checked by the test webhook")]})
    };
    Json(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
    )
}

/// Starts the test webhook on loopback with a certificate for `hosts`; returns its port, CA.
async fn start_webhook(
    hosts: &[String],
    seen: Reviews,
) -> (u16, String, tokio::task::JoinHandle<()>) {
    let ca = Ca::new("webhook-ca").unwrap();
    let cert = ca.server("webhook", hosts).unwrap();
    let certs = rustls_pemfile::certs(&mut cert.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls_pemfile::private_key(&mut cert.key_pem.as_bytes())
        .unwrap()
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let router = axum::Router::new()
        .route("/mutate", axum::routing::post(mutate))
        .route("/validate", axum::routing::post(validate))
        .with_state(seen);
    let task = tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, service) = (acceptor.clone(), TowerToHyperService::new(router.clone()));
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                }
            });
        }
    });
    (port, ca.cert_pem(), task)
}

fn webhook(name: &str, client_config: Value, ca: &str, object_label: &str, extra: Value) -> Value {
    let mut hook = json!({
        "name": format!("{name}.test.marin3r.io"),
        "clientConfig": client_config,
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
        "objectSelector": {"matchLabels": {"hook": object_label}},
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "failurePolicy": "Fail",
    });
    hook["clientConfig"]["caBundle"] = json!(base64::engine::general_purpose::STANDARD.encode(ca));
    for (k, v) in extra.as_object().unwrap() {
        hook[k] = v.clone();
    }
    hook
}

fn pod(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }))
    .unwrap()
}

/// The pod "serving" the webhook: its named port `https` is the webhook's port.
fn serving_pod(port: u16) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "hook-pod", "labels": {"app": "hook"}},
        "spec": {"containers": [{"name": "main", "image": "webhook", "ports": [{"name": "https", "containerPort": port}]}]},
    }))
    .unwrap()
}

fn api_error(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn labels(p: &Pod) -> std::collections::BTreeMap<String, String> {
    p.metadata.labels.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_webhooks_are_called_and_honoured() {
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let client = server.kube_client().await.unwrap();
    let ns = format!("adm-{}", std::process::id());
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
    )
    .await
    .unwrap();

    let seen: Reviews = Arc::default();
    let (port, ca, hook_task) = start_webhook(
        &["127.0.0.1".into(), format!("hook.{ns}.svc")],
        seen.clone(),
    )
    .await;
    let dead_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = |p: u16| json!({"url": format!("https://127.0.0.1:{p}/mutate")});
    let this_ns = json!({"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": [ns]}]}});
    let hooks = json!({
        "metadata": {"name": "test-hooks"},
        "webhooks": [
            webhook("url", url(port), &ca, "url", json!({"timeoutSeconds": 1, "namespaceSelector": this_ns["namespaceSelector"]})),
            webhook("other-ns", url(port), &ca, "url", json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "elsewhere"}}})),
            webhook("svc", json!({"service": {"namespace": ns, "name": "hook", "path": "/mutate", "port": 443}}), &ca, "svc", json!({})),
            webhook("dead-ignore", url(dead_port), &ca, "dead-ignore", json!({"failurePolicy": "Ignore"})),
            webhook("dead-fail", url(dead_port), &ca, "dead-fail", json!({})),
        ],
    });
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    mwcs.create(
        &PostParams::default(),
        &serde_json::from_value(hooks).unwrap(),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // By URL: called once (the other-namespace webhook is not), with the right review.
    let created = pods
        .create(&PostParams::default(), &pod("a", json!({"hook": "url"})))
        .await
        .unwrap();
    assert_eq!(
        labels(&created).get("hooked").map(String::as_str),
        Some("yes")
    );
    let reviews = seen.lock().unwrap().clone();
    assert_eq!(reviews.len(), 1, "{reviews:#?}");
    let req = &reviews[0]["request"];
    assert_eq!(reviews[0]["apiVersion"], "admission.k8s.io/v1");
    assert!(req["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert_eq!(
        req["kind"],
        json!({"group": "", "version": "v1", "kind": "Pod"})
    );
    assert_eq!(
        req["resource"],
        json!({"group": "", "version": "v1", "resource": "pods"})
    );
    assert_eq!(
        (req["namespace"].as_str(), req["operation"].as_str()),
        (Some(ns.as_str()), Some("CREATE"))
    );
    assert_eq!(req["object"]["metadata"]["name"], "a");
    assert_eq!(req["dryRun"], false);

    // A denial blocks the create with the webhook's message.
    let denied = pods
        .create(
            &PostParams::default(),
            &pod("b", json!({"hook": "url", "deny": "true"})),
        )
        .await
        .unwrap_err();
    let (code, message) = api_error(denied);
    assert_eq!(code, 403);
    assert!(
        message.contains("pods labelled deny are not welcome"),
        "{message}"
    );
    assert_eq!(
        pods.get_opt("b").await.unwrap().map(|p| p.metadata.name),
        None
    );

    // A webhook slower than its timeoutSeconds fails the create (failurePolicy Fail).
    server.faults().delay_webhooks(Some(Duration::from_secs(3)));
    let (code, message) = api_error(
        pods.create(&PostParams::default(), &pod("slow", json!({"hook": "url"})))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 500);
    assert!(message.contains("deadline exceeded"), "{message}");
    server.faults().delay_webhooks(None);

    // Through a Service: resolved to its ready pod's IP and (named) target port.
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "hook"},
        "spec": {"selector": {"app": "hook"}, "ports": [{"port": 443, "targetPort": "https"}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let (_, message) = api_error(
        pods.create(
            &PostParams::default(),
            &pod("early", json!({"hook": "svc"})),
        )
        .await
        .unwrap_err(),
    );
    assert!(message.contains("no endpoints available"), "{message}");
    pods.create(&PostParams::default(), &serving_pod(port))
        .await
        .unwrap();
    let ready = json!({"status": {"podIP": "127.0.0.1", "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status("hook-pod", &PatchParams::default(), &Patch::Merge(ready))
        .await
        .unwrap();
    let via_service = pods
        .create(&PostParams::default(), &pod("c", json!({"hook": "svc"})))
        .await
        .unwrap();
    assert_eq!(
        labels(&via_service).get("hooked").map(String::as_str),
        Some("yes")
    );

    // A dead webhook: Ignore lets the pod through unchanged, Fail rejects it.
    let ignored = pods
        .create(
            &PostParams::default(),
            &pod("d", json!({"hook": "dead-ignore"})),
        )
        .await
        .unwrap();
    assert_eq!(labels(&ignored).get("hooked"), None);
    let (code, message) = api_error(
        pods.create(
            &PostParams::default(),
            &pod("e", json!({"hook": "dead-fail"})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(code, 500);
    assert!(
        message.contains("failed calling webhook \"dead-fail.test.marin3r.io\""),
        "{message}"
    );

    // Injected webhook failures behave like a dead webhook.
    server.faults().fail_webhooks(true);
    let (code, _) = api_error(
        pods.create(&PostParams::default(), &pod("f", json!({"hook": "url"})))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 500);
    server.faults().fail_webhooks(false);
    hook_task.abort();
}

fn config_map(name: &str, labels: Value, data: &str) -> String {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": {"key": data},
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validating_webhooks_judge_creates_and_updates_and_kubectl_prints_their_warnings() {
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let client = server.kube_client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let kubectl = marin3r_testkit::kubectl::Kubectl::new(&kubeconfig).unwrap();
    let ns = format!("vadm-{}", std::process::id());
    let other = format!("vadm-other-{}", std::process::id());
    let nss: Api<Namespace> = Api::all(client.clone());
    for (name, team) in [(&ns, "a"), (&other, "b")] {
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name, "labels": {"team": team}}}))
                .unwrap(),
        )
        .await
        .unwrap();
    }
    let seen: Reviews = Arc::default();
    let (port, ca, hook_task) = start_webhook(&["127.0.0.1".into()], seen.clone()).await;
    let dead_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = |p: u16, path: &str| json!({"url": format!("https://127.0.0.1:{p}{path}")});
    let on = |resources: Value| {
        json!({"rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": resources, "scope": "Namespaced"}],
               "namespaceSelector": {"matchLabels": {"team": "a"}}})
    };
    let validating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "test-validators"},
        "webhooks": [
            webhook("validate", url(port, "/validate"), &ca, "check", on(json!(["configmaps", "pods"]))),
            webhook("dead-ignore", url(dead_port, "/validate"), &ca, "dead-ignore", {
                let mut w = on(json!(["configmaps"]));
                w["failurePolicy"] = json!("Ignore");
                w
            }),
            webhook("dead-fail", url(dead_port, "/validate"), &ca, "dead-fail", on(json!(["configmaps"]))),
            // Rules that select only the status subresource never see a main write.
            webhook("status-only", url(dead_port, "/validate"), &ca, "check", on(json!(["configmaps/status"]))),
        ],
    });
    kubectl
        .ok_with(&["apply", "-f", "-"], &validating.to_string())
        .await
        .unwrap();
    let reviews = || seen.lock().unwrap().clone();

    // CREATE: judged, admitted, and kubectl prints the webhook's warning.
    let created = kubectl
        .run_with(
            &["apply", "-n", &ns, "-f", "-"],
            &config_map("settings", json!({"hook": "check"}), "one"),
        )
        .await
        .unwrap();
    assert!(created.success, "{created:?}");
    assert!(
        created
            .stderr
            .contains("Warning: settings was checked by the test webhook"),
        "{created:?}"
    );
    let all = reviews();
    assert_eq!(all.len(), 1, "{all:#?}");
    let req = &all[0]["request"];
    assert_eq!(req["operation"], "CREATE");
    assert_eq!(req["namespace"], ns.as_str());
    assert_eq!(
        req["kind"],
        json!({"group": "", "version": "v1", "kind": "ConfigMap"})
    );
    assert_eq!(req["oldObject"], Value::Null);
    // The object as it will be stored: server-set metadata included.
    assert!(req["object"]["metadata"]["uid"].is_string(), "{req}");
    assert_eq!(req["object"]["data"]["key"], "one");

    // UPDATE: the new object and the stored one.
    let updated = kubectl
        .run_with(
            &["apply", "-n", &ns, "-f", "-"],
            &config_map("settings", json!({"hook": "check"}), "two"),
        )
        .await
        .unwrap();
    assert!(updated.success, "{updated:?}");
    assert!(
        updated.stderr.contains("Warning: settings was checked"),
        "{updated:?}"
    );
    let all = reviews();
    let req = &all.last().unwrap()["request"];
    assert_eq!(req["operation"], "UPDATE");
    assert_eq!(
        (
            req["object"]["data"]["key"].as_str(),
            req["oldObject"]["data"]["key"].as_str()
        ),
        (Some("two"), Some("one"))
    );

    // A denial: kubectl prints kube-apiserver's wording; nothing is written.
    let denied = kubectl
        .run_with(
            &["apply", "-n", &ns, "-f", "-"],
            &config_map(
                "settings",
                json!({"hook": "check", "deny": "true"}),
                "three",
            ),
        )
        .await
        .unwrap();
    assert!(!denied.success, "{denied:?}");
    assert!(
        denied.stderr.contains(
            "admission webhook \"validate.test.marin3r.io\" denied the request: settings is labelled deny"
        ),
        "{denied:?}"
    );
    let stored = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns)
        .get("settings")
        .await
        .unwrap();
    assert_eq!(stored.data.unwrap()["key"], "two");
    // Without a status code in the denial, the API answers 400.
    let cms = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns);
    let (code, message) = api_error(
        cms.create(
            &PostParams::default(),
            &serde_json::from_str(&config_map(
                "refused",
                json!({"hook": "check", "deny": "true"}),
                "x",
            ))
            .unwrap(),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(code, 400, "{message}");
    assert_eq!(
        cms.get_opt("refused")
            .await
            .unwrap()
            .map(|c| c.metadata.name),
        None
    );

    // Selectors that do not match: another namespace, an unlabelled object. Not called.
    let before = reviews().len();
    for (namespace, labels) in [(&other, json!({"hook": "check"})), (&ns, json!({}))] {
        let out = kubectl
            .run_with(
                &["apply", "-n", namespace, "-f", "-"],
                &config_map("quiet", labels, "x"),
            )
            .await
            .unwrap();
        assert!(out.success, "{out:?}");
        assert!(!out.stderr.contains("Warning"), "{out:?}");
    }
    assert_eq!(reviews().len(), before);

    // The webhook down: Ignore admits, Fail refuses with the call's error.
    let ignored = kubectl
        .run_with(
            &["apply", "-n", &ns, "-f", "-"],
            &config_map("ignored", json!({"hook": "dead-ignore"}), "x"),
        )
        .await
        .unwrap();
    assert!(ignored.success, "{ignored:?}");
    let failed = kubectl
        .run_with(
            &["apply", "-n", &ns, "-f", "-"],
            &config_map("failed", json!({"hook": "dead-fail"}), "x"),
        )
        .await
        .unwrap();
    assert!(!failed.success, "{failed:?}");
    assert!(
        failed
            .stderr
            .contains("failed calling webhook \"dead-fail.test.marin3r.io\""),
        "{failed:?}"
    );
    assert_eq!(
        cms.get_opt("failed")
            .await
            .unwrap()
            .map(|c| c.metadata.name),
        None
    );

    // Validation comes after mutation: the validating webhook sees the mutated pod, and
    // kubectl prints the warnings of both.
    let mutating = json!({
        "metadata": {"name": "test-mutators"},
        "webhooks": [webhook("mutate", url(port, "/mutate"), &ca, "check", json!({"namespaceSelector": {"matchLabels": {"team": "a"}}}))],
    });
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(mutating).unwrap(),
        )
        .await
        .unwrap();
    let pod_json = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"hook": "check"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    });
    let out = kubectl
        .run_with(&["create", "-n", &ns, "-f", "-"], &pod_json.to_string())
        .await
        .unwrap();
    assert!(out.success, "{out:?}");
    assert!(
        out.stderr
            .contains("Warning: the test webhook added the label \"hooked\""),
        "{out:?}"
    );
    assert!(
        out.stderr
            .contains("Warning: p was checked by the test webhook"),
        "{out:?}"
    );
    let all = reviews();
    let last = &all.last().unwrap()["request"];
    assert_eq!(last["kind"]["kind"], "Pod");
    assert_eq!(last["object"]["metadata"]["labels"]["hooked"], "yes");
    hook_task.abort();
}
