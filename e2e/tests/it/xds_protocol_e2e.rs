//! Which xDS protocol injected sidecars speak, on the real cluster (`hack/cluster`) with
//! marin3r installed from `manifests/`: a DiscoveryService whose `spec.sidecar.xdsProtocol`
//! is `delta` gets delta ADS streams from its sidecars, a pod annotated
//! `marin3r.3scale.net/xds-protocol: sotw` a state-of-the-world one; `marin3r proxy-status`
//! (the built binary, through the API server) shows what the discovery pod saw of each, both
//! real Envoy containers serve the EnvoyConfig and both follow an update.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use marin3r_e2e::real;
use marin3r_testkit::wait::until;
use serde_json::json;

const DISCOVERY_SERVICE: &str = r#"
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryService
metadata: {name: instance}
spec:
  sidecar:
    xdsProtocol: delta
"#;

fn envoy_config(body: &str) -> String {
    format!(
        r#"
apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata: {{name: web}}
spec:
  nodeID: web
  resources:
    - type: listener
      value:
        name: http
        address: {{socket_address: {{address: 0.0.0.0, port_value: 8080}}}}
        filter_chains:
          - filters:
              - name: envoy.filters.network.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                  stat_prefix: http
                  route_config:
                    name: local
                    virtual_hosts:
                      - name: web
                        domains: ["*"]
                        routes:
                          - match: {{prefix: "/"}}
                            direct_response: {{status: 200, body: {{inline_string: "{body}"}}}}
                  http_filters:
                    - name: envoy.filters.http.router
                      typed_config:
                        "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    )
}

fn pod(name: &str, annotations: &[(&str, &str)]) -> Pod {
    let mut all = serde_json::Map::new();
    all.insert("marin3r.3scale.net/node-id".into(), "web".into());
    for (k, v) in annotations {
        all.insert((*k).into(), (*v).into());
    }
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"marin3r.3scale.net/status": "enabled"},
            "annotations": all,
        },
        "spec": {
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [real::python_container(real::IDLE_PY)],
        },
    }))
    .unwrap()
}

async fn body_of(ip: &str) -> Option<String> {
    marin3r_e2e::demo::get(&format!("http://{ip}:8080/"))
        .await
        .ok()
        .flatten()
}

#[tokio::test(flavor = "multi_thread")]
async fn sidecars_speak_the_protocol_their_discovery_service_or_annotation_chooses() {
    let start = Instant::now();
    let step = |what: &str| println!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
    let scenario = real::Scenario::start("protocols", &["python"])
        .await
        .unwrap();
    let ns = scenario.ns.clone();
    step("namespace created");
    scenario.apply(DISCOVERY_SERVICE).await.unwrap();
    scenario.apply(&envoy_config("first")).await.unwrap();
    scenario
        .discovery_service_ready("instance", Duration::from_secs(120))
        .await
        .unwrap();
    step("DiscoveryService Ready");

    let pods: Api<Pod> = Api::namespaced(scenario.client.clone(), &ns);
    let annotated = [("marin3r.3scale.net/xds-protocol", "sotw")];
    for (name, annotations) in [("by-default", &[][..]), ("annotated", &annotated[..])] {
        pods.create(&PostParams::default(), &pod(name, annotations))
            .await
            .unwrap();
    }
    let mut ips = Vec::new();
    for name in ["by-default", "annotated"] {
        let ip = until("the pod Ready", Duration::from_secs(120), || async {
            marin3r_e2e::demo::ready_ip(&pods.get(name).await.ok()?)
        })
        .await;
        until("the first body", Duration::from_secs(60), || async {
            (body_of(&ip).await? == "first").then_some(())
        })
        .await;
        ips.push(ip);
    }
    step("both pods serve the config");

    // What each Envoy speaks, as the discovery pod saw its stream.
    let marin3r = marin3r_testkit::image::marin3r_bin().expect("the built marin3r binary");
    let protocols = until(
        "both proxies in proxy-status",
        Duration::from_secs(30),
        || async {
            let out = tokio::process::Command::new(&marin3r)
                .args(["proxy-status", "-n", &ns, "-o", "json"])
                .env("KUBECONFIG", scenario.cluster.kubeconfig())
                .output()
                .await
                .ok()?;
            let doc: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            let mut seen: Vec<(String, String)> = doc["proxies"]
                .as_array()?
                .iter()
                .map(|p| {
                    (
                        p["pod"].as_str().unwrap_or_default().to_owned(),
                        p["protocol"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect();
            seen.sort();
            (seen.len() == 2).then_some(seen)
        },
    )
    .await;
    assert_eq!(
        protocols,
        [
            ("annotated".to_owned(), "sotw".to_owned()),
            ("by-default".to_owned(), "delta".to_owned()),
        ]
    );
    step("proxy-status shows delta and sotw");

    // Both follow an update.
    scenario.apply(&envoy_config("second")).await.unwrap();
    for ip in &ips {
        until("the updated body", Duration::from_secs(60), || async {
            (body_of(ip).await? == "second").then_some(())
        })
        .await;
    }
    step("both follow the update");
}
