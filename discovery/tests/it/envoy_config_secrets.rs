//! Secrets served to Envoy by SDS from `spec.envoyResources.secrets`: Envoy presents the
//! Secret's certificate, a changed Secret reaches Envoy with no EnvoyConfig change, a
//! cross-namespace reference is refused, and a missing or non-TLS Secret is reported on the
//! revision until it is fixed (that one without `ref`: the Secret named like the entry), and
//! an update naming a missing Secret never takes the last good config from the node.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use marin3r_certs::{CertificateRequest, Usage};
use marin3r_webhook::bootstrap::AdsMode;
use marin3r_xds::resource::ResourceType;
use serde_json::json;
use support::free_port;
use support::plane::*;

#[test]
fn secrets_are_served_by_sds_and_a_changed_secret_reaches_envoy() {
    let plane = Plane::start(&[NS, "elsewhere"]);
    let ns = plane.ns(NS);
    let port = free_port();
    let issue = |cn: &str| {
        plane
            .pki
            .ca
            .issue(
                &CertificateRequest::new(cn, Usage::Server, Duration::from_secs(86_400))
                    .with_hosts(["localhost"]),
            )
            .unwrap()
    };
    let (first, second) = (issue("first"), issue("second"));
    let secrets: Api<Secret> = Api::namespaced(plane.client.clone(), ns);
    plane
        .rt
        .block_on(secrets.create(&PostParams::default(), &tls_secret("web-cert", &first)))
        .unwrap();

    plane.apply(
        ns,
        "tls",
        https_spec("tls", port, json!({"name": "web-cert", "namespace": ns})),
    );
    let ec = plane.wait_in_sync(ns, "tls");
    let version = ec.spec.version();
    let _proxy = plane.proxy(ns, "tls", AdsMode::StateOfTheWorld);
    let want = pem_der(&first.cert_pem);
    wait(
        "Envoy to serve the first certificate",
        Duration::from_secs(20),
        || {
            (served_certificate(&plane.rt, port, plane.pki.ca_pem()).as_ref() == Some(&want))
                .then_some(())
        },
    );

    // The Secret changes, the EnvoyConfig does not: Envoy serves the new certificate.
    plane
        .rt
        .block_on(secrets.replace("web-cert", &PostParams::default(), &{
            let mut s = tls_secret("web-cert", &second);
            s.metadata.resource_version = plane
                .rt
                .block_on(secrets.get("web-cert"))
                .unwrap()
                .metadata
                .resource_version;
            s
        }))
        .unwrap();
    let want = pem_der(&second.cert_pem);
    wait(
        "Envoy to serve the second certificate",
        Duration::from_secs(20),
        || {
            (served_certificate(&plane.rt, port, plane.pki.ca_pem()).as_ref() == Some(&want))
                .then_some(())
        },
    );
    let ec = plane.get(ns, "tls");
    assert_eq!(
        ec.status.as_ref().unwrap().published_version,
        Some(version.clone())
    );
    assert_eq!(plane.list_revisions(ns).len(), 1);

    // The Secret watcher marked the revision out of sync (an Event says why it reloaded)...
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(plane.client.clone(), ns);
    wait("the SecretChanged event", Duration::from_secs(10), || {
        let list = plane.rt.block_on(events.list(&Default::default())).unwrap();
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("SecretChanged")
                    && e.note.as_deref().is_some_and(|n| n.contains("web-cert"))
            })
            .then_some(())
    });
    // ...and Envoy's SDS version is `<revision version>-<hash of the loaded secrets>`.
    let dump: serde_json::Value = serde_json::from_str(
        &_proxy
            .envoy
            .admin_get("/config_dump?resource=dynamic_active_secrets")
            .unwrap(),
    )
    .unwrap();
    // The bootstrap's own file-based secrets are listed too; pick the one from xDS.
    let sds_version = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "my-certificate")
        .and_then(|c| c["version_info"].as_str())
        .unwrap_or_default();
    assert!(
        sds_version.starts_with(&format!("{version}-")) && sds_version.len() > version.len() + 1,
        "SDS version {sds_version:?} is not <revision>-<secrets hash>: {dump}"
    );

    // A reference to another namespace's Secret is refused, naming the field.
    plane.apply(
        ns,
        "tls",
        https_spec(
            "tls",
            port,
            json!({"name": "web-cert", "namespace": plane.ns("elsewhere")}),
        ),
    );
    let ec = plane.wait_status(ns, "tls", "the cross-namespace refusal", |ec| {
        condition(ec, "CacheOutOfSync").is_some_and(|c| c.reason == "InvalidSpec")
    });
    let message = &condition(&ec, "CacheOutOfSync").unwrap().message;
    assert!(
        message.contains("spec.envoyResources.secrets[0].ref.namespace"),
        "{message}"
    );
    assert_eq!(plane.list_revisions(ns).len(), 1);

    // All of that through Secret watches of the served namespaces only: the API server never
    // saw a cluster-wide Secret request (what the per-namespace Roles allow).
    let requests = plane.requests();
    let secrets: Vec<&String> = requests.iter().filter(|r| r.contains("secrets")).collect();
    assert!(
        secrets.iter().all(|r| r.contains("/namespaces/")),
        "a cluster-wide Secret request: {secrets:#?}"
    );
    for ns in [ns, plane.ns("elsewhere")] {
        let watch = format!("GET /api/v1/namespaces/{ns}/secrets?");
        assert!(
            secrets
                .iter()
                .any(|r| r.starts_with(&watch) && r.contains("watch=true")),
            "no Secret watch in {ns}: {secrets:#?}"
        );
    }
}

#[test]
fn a_missing_or_wrong_secret_is_reported_on_the_revision_until_it_is_fixed() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let port = free_port();
    plane.apply(
        ns,
        "late",
        https_spec("late", port, serde_json::Value::Null),
    );
    let ec = plane.wait_in_sync(ns, "late");
    let version = ec.spec.version();
    let name = format!("late-{version}");
    let out_of_sync = |reason: &str| {
        let reason = reason.to_owned();
        wait(
            &format!("ResourcesOutOfSync {reason}"),
            Duration::from_secs(20),
            || {
                let r = plane.rt.block_on(plane.revisions(ns).get(&name)).unwrap();
                r.status?
                    .conditions
                    .into_iter()
                    .find(|c| c.type_ == "ResourcesOutOfSync" && c.reason == reason)
            },
        )
    };
    let c = out_of_sync("SecretNotFound");
    assert_eq!(c.status, "True");
    assert!(
        c.message
            .contains(&format!("Secret {ns}/my-certificate not found")),
        "{}",
        c.message
    );
    // Tooling written for the original's HEAD waits on `ResourcesInSync` instead.
    let k = plane.kubectl();
    let kubectl_wait = |condition: &str| {
        let ecr = format!("ecr/{name}");
        let condition = format!("--for=condition={condition}");
        let args = [
            "wait",
            ecr.as_str(),
            "-n",
            ns,
            condition.as_str(),
            "--timeout=20s",
        ];
        plane.rt.block_on(k.ok(&args)).unwrap();
    };
    kubectl_wait("ResourcesInSync=false");
    assert!(plane.cache.snapshot(ns, "late").is_none());
    // The EnvoyConfig says so too: its published version is not what the proxies get.
    let ec = plane.wait_status(ns, "late", "CacheOutOfSync ResourcesOutOfSync", |ec| {
        condition(ec, "CacheOutOfSync")
            .is_some_and(|c| c.status == "True" && c.reason == "ResourcesOutOfSync")
    });
    let message = &condition(&ec, "CacheOutOfSync").unwrap().message;
    assert!(message.contains("my-certificate not found"), "{message}");

    // An Opaque Secret is not a certificate.
    let secrets: Api<Secret> = Api::namespaced(plane.client.clone(), ns);
    let mut opaque = tls_secret("my-certificate", &plane.pki.server);
    opaque.type_ = Some("Opaque".into());
    plane
        .rt
        .block_on(secrets.create(&PostParams::default(), &opaque))
        .unwrap();
    wait("the type to be refused", Duration::from_secs(20), || {
        let r = plane.rt.block_on(plane.revisions(ns).get(&name)).unwrap();
        r.status?.conditions.into_iter().find(|c| {
            c.type_ == "ResourcesOutOfSync"
                && c.reason == "SecretInvalid"
                && c.message.contains("not kubernetes.io/tls")
        })
    });

    // With a TLS Secret it loads, with no change to the config.
    plane
        .rt
        .block_on(secrets.delete("my-certificate", &DeleteParams::default()))
        .unwrap();
    plane
        .rt
        .block_on(secrets.create(
            &PostParams::default(),
            &tls_secret("my-certificate", &plane.pki.server),
        ))
        .unwrap();
    let c = out_of_sync("ResourcesLoaded");
    assert_eq!(c.status, "False");
    kubectl_wait("ResourcesInSync");
    assert!(
        c.message.contains(&format!("secrets version {version}-")),
        "{}",
        c.message
    );
    assert!(plane.cache.snapshot(ns, "late").is_some());
    plane.wait_status(ns, "late", "CacheOutOfSync InSync", |ec| {
        condition(ec, "CacheOutOfSync").is_some_and(|c| c.status == "False" && c.reason == "InSync")
    });
}

#[test]
fn an_update_that_cannot_load_keeps_the_last_good_config_for_new_proxies() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let (port, tls_port) = (free_port(), free_port());
    plane.apply(ns, "keep", spec("keep", port, "good"));
    plane.wait_in_sync(ns, "keep");
    let good = wait("the good config loaded", Duration::from_secs(20), || {
        plane.cache.snapshot(ns, "keep")
    });

    // The update is valid but names a Secret that does not exist: it is published (nothing
    // rejected it) and cannot load.
    plane.apply(
        ns,
        "keep",
        https_spec("keep", tls_port, json!({"name": "no-such-cert"})),
    );
    let ec = plane.wait_status(ns, "keep", "CacheOutOfSync ResourcesOutOfSync", |ec| {
        condition(ec, "CacheOutOfSync")
            .is_some_and(|c| c.status == "True" && c.reason == "ResourcesOutOfSync")
    });
    assert_eq!(plane.list_revisions(ns).len(), 2, "{:?}", ec.status);
    // Give the unpublished revision's reconcile every chance to clear the node.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(plane.cache.snapshot(ns, "keep"), Some(good.clone()));

    // A proxy that starts now (a new pod of the node) gets the last good config.
    let proxy = plane.proxy(ns, "keep", AdsMode::StateOfTheWorld);
    proxy.wait_for_body(port, "good");

    // So does one on a discovery process that starts now (a restart, a new replica), which
    // never loaded the good revision: it serves the newest earlier revision that loads.
    let replica = plane.replica("restarted", |_| {});
    let late = plane.proxy_on(
        replica.xds_port,
        ns,
        "keep",
        "late-pod",
        AdsMode::StateOfTheWorld,
    );
    late.wait_for_body(port, "good");

    // Once the Secret exists, the published revision replaces the fallback everywhere.
    let cert = plane
        .pki
        .ca
        .issue(
            &CertificateRequest::new("web", Usage::Server, Duration::from_secs(86_400))
                .with_hosts(["localhost"]),
        )
        .unwrap();
    plane
        .rt
        .block_on(
            Api::<Secret>::namespaced(plane.client.clone(), ns)
                .create(&PostParams::default(), &tls_secret("no-such-cert", &cert)),
        )
        .unwrap();
    plane.wait_in_sync(ns, "keep");
    wait(
        "the published revision on both",
        Duration::from_secs(30),
        || {
            let now = plane.cache.snapshot(ns, "keep");
            (now != Some(good.clone()) && replica.cache.snapshot(ns, "keep") == now).then_some(())
        },
    );
}

/// Until the operator's Role and RoleBinding exist in a newly served namespace, its Secrets
/// and EndpointSlices answer 403: the watches retry with a growing delay, not in a loop
/// against the API server, and are back once the access is granted.
#[test]
fn forbidden_secret_and_endpointslice_watches_back_off_then_recover() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let paths = [
        format!("/api/v1/namespaces/{ns}/secrets"),
        format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"),
    ];
    let faults = plane.faults();
    for path in &paths {
        faults.deny(path, 403);
    }
    let from = plane.requests().len();
    faults.drop_watches();
    // A logged request is `METHOD target`.
    let asks = |request: &str, path: &str| {
        request
            .split(' ')
            .nth(1)
            .is_some_and(|uri| uri.starts_with(path))
    };
    let to = |path: &str, requests: &[String]| -> Vec<String> {
        requests.iter().filter(|r| asks(r, path)).cloned().collect()
    };
    // The window opens at the first refused request of each (a busy machine can take a
    // moment to restart the watches), so it counts the retries, not the start. A watch the
    // plane was opening as the watches were dropped (its namespace just served) outlives
    // the drop: they are dropped again, once a second, until both paths are refused.
    let dropped = std::cell::Cell::new(std::time::Instant::now());
    let first = wait("a refused request to each", Duration::from_secs(30), || {
        let requests = plane.requests().split_off(from);
        let firsts = paths
            .iter()
            .map(|path| requests.iter().position(|r| asks(r, path)));
        let firsts = firsts.collect::<Option<Vec<_>>>();
        if firsts.is_none() && dropped.get().elapsed() > Duration::from_secs(1) {
            faults.drop_watches();
            dropped.set(std::time::Instant::now());
        }
        firsts?.into_iter().min()
    });
    std::thread::sleep(Duration::from_secs(4));
    let requests = plane.requests().split_off(from + first);
    for path in &paths {
        let tried = to(path, &requests);
        // Backoff from 0.8 s doubling: 3 or 4 tries in 4 s; in a loop, thousands.
        assert!(
            tried.len() <= 6,
            "{} requests to {path} in 4 s, the first: {:#?}",
            tried.len(),
            &tried[..tried.len().min(8)]
        );
    }
    let allowed = plane.requests().len();
    for path in &paths {
        faults.allow(path);
    }
    wait("both watches to be back", Duration::from_secs(60), || {
        let requests = plane.requests().split_off(allowed);
        paths
            .iter()
            .all(|path| to(path, &requests).iter().any(|r| r.contains("watch=true")))
            .then_some(())
    });
}

/// The old revision A is re-loaded after its successor B while both are
/// briefly published (here a Secret only A uses changes in that window), then A is
/// unpublished. What the node is served must end up being B, the published revision, not A
/// for good while the status names B. Revisions are written by hand, with no EnvoyConfig,
/// so the window stays open as long as the test needs.
#[test]
fn a_retired_revision_reloaded_after_its_successor_gives_the_node_back() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let (port, node) = (free_port(), "raced");
    let issue = |cn: &str| {
        let request = CertificateRequest::new(cn, Usage::Server, Duration::from_secs(86_400));
        plane
            .pki
            .ca
            .issue(&request.with_hosts(["localhost"]))
            .unwrap()
    };
    let secrets: Api<Secret> = Api::namespaced(plane.client.clone(), ns);
    plane
        .rt
        .block_on(secrets.create(&PostParams::default(), &tls_secret("a-cert", &issue("a"))))
        .unwrap();
    let revision = |name: &str, body: &str, secrets: serde_json::Value| {
        let spec = json!({
            "nodeID": node, "version": name, "serialization": "yaml",
            "envoyResources": {
                "listeners": [{"name": "http", "value": listener_yaml(port, body, false)}],
                "secrets": secrets,
            },
        });
        let r = serde_json::from_value(json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfigRevision",
            "metadata": {"name": name, "namespace": ns}, "spec": spec,
        }))
        .unwrap();
        let api = plane.revisions(ns);
        plane
            .rt
            .block_on(api.create(&PostParams::default(), &r))
            .unwrap();
    };
    let publish = |name: &str, published: bool, at: &str| {
        let status = json!({"status": {"published": published, "lastPublishedAt": at}});
        let (api, patch) = (plane.revisions(ns), Patch::Merge(status));
        retry(|| {
            plane
                .rt
                .block_on(api.patch_status(name, &PatchParams::default(), &patch))
        });
    };
    let listeners = || {
        let snapshot = plane.cache.snapshot(ns, node)?;
        Some(snapshot.version(ResourceType::Listener).to_owned())
    };
    let serves = |what: &str, version: &str| {
        wait(what, Duration::from_secs(20), || {
            (listeners().as_deref() == Some(version)).then_some(())
        })
    };

    revision(
        "a",
        "a",
        json!([{"name": "a-cert", "ref": {"name": "a-cert"}}]),
    );
    publish("a", true, "2026-01-01T00:00:00Z");
    let a = wait("A loaded", Duration::from_secs(20), listeners);
    revision("b", "b", json!([]));
    publish("b", true, "2026-01-01T00:01:00Z");
    let b = wait("B loaded", Duration::from_secs(20), || {
        listeners().filter(|l| *l != a)
    });

    // Both published (A's unpublish not written yet): A's Secret changes, A reloads over B.
    let mut changed = tls_secret("a-cert", &issue("a2"));
    changed.metadata.resource_version = plane
        .rt
        .block_on(secrets.get("a-cert"))
        .unwrap()
        .metadata
        .resource_version;
    plane
        .rt
        .block_on(secrets.replace("a-cert", &PostParams::default(), &changed))
        .unwrap();
    serves("A re-loaded while both are published", &a);

    // A's unpublish lands: the node is given back to B, the published revision.
    publish("a", false, "2026-01-01T00:00:00Z");
    serves("B served again once A is unpublished", &b);
}
