//! `spec.resources`, the original MARIN3R's API since v0.12, through the path its users take:
//! EnvoyConfigs in that form (`tests/testdata/resources`) applied with kubectl to the real
//! cluster (which prunes what a CRD does not know), served to a real Envoy with
//! the certificate from a TLS Secret, the OAuth2 secrets from an Opaque Secret and the
//! endpoints from EndpointSlices that change while it runs. A manifest the old CRD would have
//! emptied is refused, never published empty, and served once the CRD knows the field.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use marin3r_certs::{CertificateRequest, IssuedCertificate, Usage};
use marin3r_testkit::kubectl::Kubectl;
use marin3r_webhook::bootstrap::AdsMode;
use serde_json::json;
use support::free_port;
use support::plane::*;

const RESOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/testdata/resources");

/// A manifest of `testdata/resources` with its listener on `port` (8443 may be taken).
fn manifest(file: &str, port: u16) -> String {
    std::fs::read_to_string(format!("{RESOURCES}/{file}.yaml"))
        .unwrap()
        .replace("port_value: 8443", &format!("port_value: {port}"))
}

fn kubectl(plane: &Plane) -> Kubectl {
    plane.kubectl()
}

fn server_cert(plane: &Plane) -> IssuedCertificate {
    plane
        .pki
        .ca
        .issue(
            &CertificateRequest::new("kuard", Usage::Server, Duration::from_secs(86_400))
                .with_hosts(["localhost"]),
        )
        .unwrap()
}

/// This machine's address towards the cluster: EndpointSlices may not point at loopback.
fn node_address(plane: &Plane) -> std::net::IpAddr {
    plane
        .rt
        .block_on(marin3r_testkit::namespaces::local_address(&plane.cluster))
}

/// An HTTP server on [`node_address`] that answers every request with `body` (the example's
/// kuard).
fn backend(plane: &Plane, body: &'static str) -> u16 {
    let listener = plane
        .rt
        .block_on(tokio::net::TcpListener::bind((node_address(plane), 0)))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    plane.rt.spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
            });
        }
    });
    port
}

/// `GET https://localhost:port/` through Envoy's TLS listener, trusting only the CA: the
/// response body, when there is one.
fn https_get(plane: &Plane, port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pem_der(plane.pki.ca_pem()).into()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    plane.rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
        let mut tls = tokio::time::timeout(Duration::from_secs(2), connector.connect(name, tcp))
            .await
            .ok()?
            .ok()?;
        tls.write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut response = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), tls.read_to_end(&mut response)).await;
        let response = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = response.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
    })
}

fn wait_for_https_body(plane: &Plane, proxy: &support::Proxy, port: u16, want: &str) {
    let mut last = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        last = match https_get(plane, port) {
            Some(body) if body == want => return,
            other => other.or(last),
        };
        assert!(
            std::time::Instant::now() < deadline,
            "https://localhost:{port}/ never answered {want:?}; last: {last:?}\n{}",
            proxy.envoy.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An EndpointSlice of the Service `kuard` with one ready endpoint at `address`:`port`, as
/// the EndpointSlice controller writes it.
fn kuard_slice(address: std::net::IpAddr, port: u16) -> EndpointSlice {
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "kuard-x7k2p", "labels": {"kubernetes.io/service-name": "kuard"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address.to_string()], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    }))
    .unwrap()
}

#[test]
fn a_tls_front_reaches_envoy_with_its_tls_secret_and_live_endpoint_slices() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let k = kubectl(&plane);
    plane.apply_checked_in_crds(&k);
    let cert = server_cert(&plane);
    let secrets: Api<Secret> = Api::namespaced(plane.client.clone(), ns);
    plane
        .rt
        .block_on(secrets.create(&PostParams::default(), &tls_secret("kuard", &cert)))
        .unwrap();
    let (blue, green) = (
        backend(&plane, "kuard blue"),
        backend(&plane, "kuard green"),
    );
    let slices: Api<EndpointSlice> = Api::namespaced(plane.client.clone(), ns);
    plane
        .rt
        .block_on(slices.create(
            &PostParams::default(),
            &kuard_slice(node_address(&plane), blue),
        ))
        .unwrap();

    let port = free_port();
    plane
        .rt
        .block_on(k.ok_with(
            &["apply", "--server-side", "-n", ns, "-f", "-"],
            &manifest("tls-endpoints", port),
        ))
        .unwrap();
    let ec = plane.wait_in_sync(ns, "kuard");
    // The API server kept every entry: nothing was pruned.
    assert_eq!(ec.spec.resources.len(), 5);
    let proxy = plane.proxy(ns, "kuard", AdsMode::StateOfTheWorld);
    wait_for_https_body(&plane, &proxy, port, "kuard blue");
    assert_eq!(
        served_certificate(&plane.rt, port, plane.pki.ca_pem()),
        Some(pem_der(&cert.cert_pem))
    );

    let before = wait(
        "the revision to report its versions",
        Duration::from_secs(10),
        || {
            let provided = plane.list_revisions(ns).pop()?.status?.provides_versions?;
            provided.endpoints.is_some().then_some(provided)
        },
    );

    // The Service's pods move: the EndpointSlice changes, the EnvoyConfig does not.
    let mut moved = kuard_slice(node_address(&plane), green);
    moved.metadata.resource_version = plane
        .rt
        .block_on(slices.get("kuard-x7k2p"))
        .unwrap()
        .metadata
        .resource_version;
    plane
        .rt
        .block_on(slices.replace("kuard-x7k2p", &PostParams::default(), &moved))
        .unwrap();
    wait_for_https_body(&plane, &proxy, port, "kuard green");
    let clusters = proxy.envoy.admin_get("/clusters").unwrap();
    assert!(
        clusters.contains(&format!(
            "kuard::{}:{green}::health_flags::healthy",
            node_address(&plane)
        )),
        "{clusters}"
    );
    assert!(
        !clusters.contains(&format!("{}:{blue}", node_address(&plane))),
        "{clusters}"
    );
    let ec = plane.get(ns, "kuard");
    assert_eq!(
        plane.list_revisions(ns).len(),
        1,
        "endpoints make no revision"
    );
    assert_eq!(
        ec.status.as_ref().unwrap().published_version,
        Some(ec.spec.version())
    );

    // The revision says which version of each type it serves: Envoy's listener version is
    // the one it names, and the endpoints' changed with the slice while nothing else did.
    let revision = wait(
        "the revision to report the new endpoints' version",
        Duration::from_secs(10),
        || {
            let r = plane.list_revisions(ns).pop()?;
            let provided = r.status.as_ref()?.provides_versions.clone()?;
            (provided.endpoints != before.endpoints).then_some(r)
        },
    );
    let provided = revision.status.unwrap().provides_versions.unwrap();
    assert_eq!(
        (&provided.listeners, &provided.clusters, &provided.secrets),
        (&before.listeners, &before.clusters, &before.secrets)
    );
    let dump: serde_json::Value = serde_json::from_str(
        &proxy
            .envoy
            .admin_get("/config_dump?resource=dynamic_listeners")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        dump["configs"][0]["active_state"]["version_info"].as_str(),
        provided.listeners.as_deref(),
        "{dump:#}"
    );
    for v in [
        &provided.listeners,
        &provided.routes,
        &provided.clusters,
        &provided.secrets,
    ] {
        assert!(v.is_some(), "{provided:?}");
    }
    assert_eq!(provided.runtimes, None);
    let labels = revision.metadata.labels.unwrap();
    assert_eq!(labels["marin3r.3scale.net/envoy-api"], "v3");
}

#[test]
fn the_oauth2_filter_gets_its_opaque_secrets_over_sds() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let k = kubectl(&plane);
    plane.apply_checked_in_crds(&k);
    let secrets: Api<Secret> = Api::namespaced(plane.client.clone(), ns);
    plane
        .rt
        .block_on(secrets.create(
            &PostParams::default(),
            &tls_secret("kuard", &server_cert(&plane)),
        ))
        .unwrap();
    // The example's kustomization makes it from `oauth-secrets.env`; kubectl does the same.
    plane
        .rt
        .block_on(k.ok(&[
            "create",
            "secret",
            "generic",
            "oauth-secrets",
            "-n",
            ns,
            "--from-literal=client_secret=the-client-secret",
            "--from-literal=hmac=the-hmac-key",
        ]))
        .unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(plane.client.clone(), ns);
    plane
        .rt
        .block_on(slices.create(
            &PostParams::default(),
            &kuard_slice(node_address(&plane), free_port()),
        ))
        .unwrap();
    let port = free_port();
    plane
        .rt
        .block_on(k.ok_with(
            &["apply", "--server-side", "-n", ns, "-f", "-"],
            &manifest("oauth2", port),
        ))
        .unwrap();
    plane.wait_in_sync(ns, "kuard");
    let proxy = plane.proxy(ns, "kuard", AdsMode::StateOfTheWorld);
    let dump = wait(
        "Envoy to hold the listener and the three SDS secrets",
        Duration::from_secs(20),
        || {
            let dump = proxy
                .envoy
                .admin_get("/config_dump?resource=dynamic_active_secrets")
                .ok()?;
            let listeners = proxy
                .envoy
                .admin_get("/config_dump?resource=dynamic_listeners")
                .ok()?;
            (listeners.contains("envoy.filters.http.oauth2")
                && ["\"kuard\"", "\"oauth_client_secret\"", "\"oauth_hmac\""]
                    .iter()
                    .all(|n| dump.contains(n)))
            .then_some(dump)
        },
    );
    // Envoy redacts secret values in dumps; that it holds generic secrets by those names, and
    // the listener using them is active, is what it shows.
    assert!(dump.contains("generic_secret"), "{dump}");
    assert!(
        served_certificate(&plane.rt, port, plane.pki.ca_pem()).is_some(),
        "the TLS listener of the OAuth2 front serves"
    );
}

/// The checked-in CRDs applied again when the test ends, even when it fails.
struct RestoreCrds<'a>(&'a Plane);

impl Drop for RestoreCrds<'_> {
    fn drop(&mut self) {
        let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/crds");
        let crds = crds.to_string_lossy();
        let _ = self
            .0
            .rt
            .block_on(self.0.kubectl().ok(&["apply", "-f", &crds]));
    }
}

#[test]
fn a_manifest_the_old_crd_would_empty_is_refused_then_served_once_the_crd_knows_it() {
    // The CRD is the cluster's: nobody else may use it while it is the old one.
    let plane = Plane::start_alone(&[NS]);
    let ns = plane.ns(NS);
    let k = kubectl(&plane);
    let _restore = RestoreCrds(&plane);
    // The CRD as it was before `spec.resources`: the field is unknown, so it is pruned.
    let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/crds");
    let mut old: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(crds.join("marin3r.3scale.net_envoyconfigs.yaml")).unwrap(),
    )
    .unwrap();
    let fields = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties";
    old.pointer_mut(fields)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .remove("resources");
    // Client-side, as the checked-in one was applied: the field goes.
    plane
        .rt
        .block_on(k.ok_with(&["apply", "-f", "-"], &old.to_string()))
        .unwrap();

    // What the node serves today.
    let port = free_port();
    plane.apply(ns, "kuard", spec("kuard", port, "before"));
    plane.wait_in_sync(ns, "kuard");
    let proxy = plane.proxy(ns, "kuard", AdsMode::StateOfTheWorld);
    proxy.wait_for_body(port, "before");

    // The HEAD-style manifest: `resources` is pruned, and with it `envoyResources` is gone.
    let manifest = format!(
        "apiVersion: marin3r.3scale.net/v1alpha1\nkind: EnvoyConfig\nmetadata:\n  name: kuard\n\
         spec:\n  nodeID: kuard\n  resources:\n    - type: listener\n      value:\n{}",
        listener_yaml(port, "after", false)
            .lines()
            .map(|l| format!("        {l}\n"))
            .collect::<String>()
    );
    let apply = |validate: &str| {
        plane.rt.block_on(k.ok_with(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager",
                "test",
                validate,
                "-n",
                ns,
                "-f",
                "-",
            ],
            &manifest,
        ))
    };
    let replace = |validate: &str| {
        plane
            .rt
            .block_on(k.ok_with(&["replace", validate, "-n", ns, "-f", "-"], &manifest))
    };
    // Server-side apply refuses the undeclared field whatever the validation asked (the API
    // server needs the schema to track who owns it), and kubectl asks for strict field
    // validation of a whole object: the old CRD makes both fail loudly...
    for validate in ["--validate=strict", "--validate=warn"] {
        let err = apply(validate).unwrap_err().to_string();
        assert!(
            err.contains(".spec.resources: field not declared in schema"),
            "{err}"
        );
    }
    let err = replace("--validate=strict").unwrap_err().to_string();
    assert!(err.contains("unknown field \"spec.resources\""), "{err}");
    // ...but a client that does not validate (an older kubectl, a GitOps tool,
    // `--validate=warn`) and writes the whole object gets the field silently pruned, which
    // published an empty config before.
    replace("--validate=warn").unwrap();
    let ec = plane.wait_status(ns, "kuard", "the empty spec to be refused", |ec| {
        condition(ec, "CacheOutOfSync").is_some_and(|c| c.reason == "EmptyConfigRefused")
    });
    assert!(ec.spec.resources.is_empty() && ec.spec.envoy_resources.is_empty());
    let message = &condition(&ec, "CacheOutOfSync").unwrap().message;
    assert!(message.contains("declares no resources"), "{message}");
    assert!(message.contains("CRDs are up to date"), "{message}");
    // Never published: Envoy still serves the last good config.
    assert_eq!(plane.list_revisions(ns).len(), 1);
    std::thread::sleep(Duration::from_millis(500));
    proxy.wait_for_body(port, "before");
    let events = plane
        .rt
        .block_on(k.ok(&["get", "events", "-n", ns, "-o", "yaml"]))
        .unwrap();
    assert!(events.contains("EmptyConfigRefused"), "{events}");

    // The CRD learns `spec.resources`; the same manifest is now kept and served.
    plane.apply_checked_in_crds(&k);
    apply("--validate=strict").unwrap();
    let ec = plane.wait_in_sync(ns, "kuard");
    assert_eq!(ec.spec.resources.len(), 1);
    proxy.wait_for_body(port, "after");
}

#[test]
fn both_fields_and_bad_entries_are_refused_with_their_paths_and_nothing_is_lost() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let port = free_port();
    plane.apply(ns, "edge", spec("edge", port, "good"));
    plane.wait_in_sync(ns, "edge");
    let proxy = plane.proxy(ns, "edge", AdsMode::StateOfTheWorld);
    proxy.wait_for_body(port, "good");

    let mut both = spec("edge", port, "both");
    both["resources"] =
        json!([{"type": "cluster", "value": {"name": "c", "connect_timeout": "1s"}}]);
    plane.apply(ns, "edge", both);
    let ec = plane.wait_status(ns, "edge", "both fields to be refused", |ec| {
        condition(ec, "CacheOutOfSync").is_some_and(|c| {
            c.reason == "InvalidSpec"
                && c.message.contains("spec.envoyResources and spec.resources")
        })
    });
    assert_eq!(
        ec.status.unwrap().cache_state.map(|s| s.as_str()),
        Some("InSync")
    );

    plane.apply(
        ns,
        "edge",
        json!({"nodeID": "edge", "resources": [
            {"type": "cluster", "value": {"name": "c", "connect_timeout": "1s"}},
            {"type": "secret"},
            {"type": "listener", "value": {"name": "l", "adress": {}}},
        ]}),
    );
    let ec = plane.wait_status(ns, "edge", "the bad entries to be refused", |ec| {
        condition(ec, "CacheOutOfSync")
            .is_some_and(|c| c.reason == "InvalidSpec" && c.message.contains("spec.resources[2]"))
    });
    let message = &condition(&ec, "CacheOutOfSync").unwrap().message;
    assert!(
        message.contains(
            "spec.resources[1]: type secret needs generateFromTlsSecret or generateFromOpaqueSecret"
        ),
        "{message}"
    );
    assert!(
        message.contains("spec.resources[2].value: unknown field \"adress\""),
        "{message}"
    );
    assert_eq!(plane.list_revisions(ns).len(), 1);
    proxy.wait_for_body(port, "good");

    // A bad `type` never gets past the API server: the CRD's enum refuses it.
    let api = plane.configs(ns);
    let err = plane
        .rt
        .block_on(api.patch(
            "edge",
            &PatchParams::apply("test").force(),
            &Patch::Apply(json!({
                "apiVersion": "marin3r.3scale.net/v1alpha1",
                "kind": "EnvoyConfig",
                "metadata": {"name": "edge", "namespace": ns},
                "spec": {"nodeID": "edge", "resources": [{"type": "listner", "value": {}}]},
            })),
        ))
        .unwrap_err();
    assert!(err.to_string().contains("spec.resources[0].type"), "{err}");
    proxy.wait_for_body(port, "good");
}
