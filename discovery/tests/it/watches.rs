//! What the discovery service's controllers ask of the API server, read from the local API
//! server's request log: one watch of each kind they read, shared by every consumer
//! (EnvoyConfigs, EnvoyConfigRevisions and Namespaces cluster-wide; Secrets and EndpointSlices
//! once per served namespace), and how many reconciles one EnvoyConfig update costs.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::free_port;
use crate::support::plane::*;

/// The watch requests in `requests` (`METHOD path?query`), counted by path.
fn watches(requests: &[String]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for request in requests {
        let Some((path, query)) = request.strip_prefix("GET ").and_then(|r| r.split_once('?'))
        else {
            continue;
        };
        if query
            .split('&')
            .any(|p| p == "watch=true" || p == "watch=1")
        {
            *out.entry(path.to_owned()).or_default() += 1;
        }
    }
    out
}

/// Every reconcile the controllers have run, by controller.
fn reconciles(plane: &Plane) -> BTreeMap<&'static str, f64> {
    ["envoyconfig", "revision", "taint"]
        .into_iter()
        .map(|c| {
            let sample =
                format!(r#"marin3r_controller_reconciles_total{{controller="{c}",result="ok"}}"#);
            (c, plane.metric(&sample))
        })
        .collect()
}

#[test]
fn the_controllers_open_one_watch_per_kind() {
    let plane = Plane::start(&[NS, "team-b"]);
    let ns = plane.ns(NS);
    let port = free_port();
    plane.apply(ns, "gw", spec("gateway", port, "v1"));
    plane.wait_in_sync(ns, "gw");
    // The revisions' loads and status writes settle.
    std::thread::sleep(Duration::from_secs(2));
    let (before, requests_before) = (reconciles(&plane), plane.requests().len());
    plane.apply(ns, "gw", spec("gateway", port, "v2"));
    plane.wait_in_sync(ns, "gw");
    std::thread::sleep(Duration::from_secs(2));
    let after = reconciles(&plane);
    let per_update: BTreeMap<_, _> = after.iter().map(|(c, n)| (*c, n - before[c])).collect();
    let requests = plane.requests().split_off(requests_before);
    println!("reconciles for one EnvoyConfig update: {per_update:?}");
    println!(
        "API requests for one EnvoyConfig update: {} ({} GETs of a Namespace)",
        requests.len(),
        requests
            .iter()
            .filter(|r| r.starts_with("GET /api/v1/namespaces/") && !r.contains('?'))
            .filter(|r| r.matches('/').count() == 4)
            .count()
    );

    let watches = watches(&plane.requests());
    println!("watches: {watches:#?}");
    let expected: Vec<String> = [
        "/api/v1/namespaces".to_owned(),
        "/apis/marin3r.3scale.net/v1alpha1/envoyconfigrevisions".to_owned(),
        "/apis/marin3r.3scale.net/v1alpha1/envoyconfigs".to_owned(),
    ]
    .into_iter()
    .chain([ns, plane.ns("team-b")].iter().flat_map(|ns| {
        [
            format!("/api/v1/namespaces/{ns}/secrets"),
            format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"),
        ]
    }))
    .collect();
    let mut expected = expected;
    expected.sort();
    assert_eq!(watches.keys().cloned().collect::<Vec<_>>(), expected);
    for (path, n) in &watches {
        assert_eq!(*n, 1, "{path} was watched {n} times: {watches:#?}");
    }
}

/// The Secrets of a served namespace are listed and watched without the types
/// no revision is served from (Helm releases, ServiceAccount tokens): the API server leaves
/// them out, so a namespace full of them costs the discovery pod nothing.
#[test]
fn secret_watches_leave_out_helm_releases_and_service_account_tokens() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{ListParams, PostParams};
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let port = free_port();
    plane.apply(ns, "gw", spec("gateway", port, "v1"));
    plane.wait_in_sync(ns, "gw");
    let decode = |r: &str| {
        r.replace("%21", "!")
            .replace("%3D", "=")
            .replace("%2F", "/")
            .replace("%2C", ",")
    };
    let selector =
        "fieldSelector=type!=helm.sh/release.v1,type!=kubernetes.io/service-account-token";
    let secret_requests: Vec<String> = plane
        .requests()
        .iter()
        .filter(|r| r.starts_with(&format!("GET /api/v1/namespaces/{ns}/secrets?")))
        .map(|r| decode(r))
        .collect();
    assert!(!secret_requests.is_empty());
    for request in &secret_requests {
        assert!(request.contains(selector), "{request}");
    }
    // ...which the local API server applies, as a real one does.
    let secrets: kube::Api<Secret> = kube::Api::namespaced(plane.client.clone(), ns);
    for (name, type_) in [
        ("release", "helm.sh/release.v1"),
        ("token", "kubernetes.io/service-account-token"),
        ("plain", "Opaque"),
    ] {
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations":
                {"kubernetes.io/service-account.name": "default"}},
            "type": type_,
        }))
        .unwrap();
        plane
            .rt
            .block_on(secrets.create(&PostParams::default(), &secret))
            .unwrap();
    }
    let fields = selector.trim_start_matches("fieldSelector=");
    let listed = plane
        .rt
        .block_on(secrets.list(&ListParams::default().fields(fields)))
        .unwrap();
    let names: Vec<String> = listed
        .items
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    assert_eq!(names, ["plain"]);
}
