//! The validating webhook with real Envoy as the last judge, on the real cluster
//! (`hack/cluster`) through kubectl: the discovery pod runs this build's marin3r image, which
//! carries Envoy 1.40 as the `Dockerfile` builds it, under the restricted Pod Security level
//! and a read-only root, so an EnvoyConfig that passes marin3r's own checks and that Envoy
//! refuses is refused at `kubectl apply`, in Envoy's words and on the resource: the classic
//! bad config (a second router filter) and an empty `Any`; the way Envoy takes is admitted,
//! with a warning for the route to a cluster the config does not define.

use std::time::{Duration, Instant};

use kube::Api;
use marin3r_api::EnvoyConfig;
use marin3r_e2e::product::example_in;
use marin3r_e2e::real;

fn envoy_config(per_filter: &str) -> String {
    format!(
        r#"
apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata: {{name: routes}}
spec:
  nodeID: routes
  resources:
    - type: route
      value:
        name: local
        virtual_hosts:
          - name: all
            domains: ["*"]
            routes:
              - match: {{prefix: "/"}}
                route: {{cluster: app}}
                typed_per_filter_config:
                  envoy.filters.http.buffer: {per_filter}
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_apply_is_refused_in_envoys_words_for_what_only_envoy_refuses() {
    let start = Instant::now();
    let step = |what: &str| println!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
    let scenario = real::Scenario::start("judged", &[]).await.unwrap();
    let ns = scenario.ns.clone();
    let apply = |manifest: String| {
        let kubectl = &scenario.kubectl;
        let ns = ns.clone();
        async move {
            kubectl
                .run_with(&["apply", "--server-side", "-n", &ns, "-f", "-"], &manifest)
                .await
                .unwrap()
        }
    };
    step("namespace created");
    scenario.apply(real::DISCOVERY_SERVICE).await.unwrap();
    scenario
        .discovery_service_ready("instance", Duration::from_secs(120))
        .await
        .unwrap();
    step("DiscoveryService Ready");

    // The router followed by another filter: Envoy's own rule, which our checks leave to it.
    let second_router = example_in("envoyconfig.yaml", &ns).unwrap().replace(
        "                        \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n",
        "                        \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n                    - name: second-router\n                      typed_config:\n                        \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n",
    );
    assert!(second_router.contains("second-router"));
    let refused = apply(second_router).await;
    assert!(!refused.success, "{refused:?}");
    assert!(
        refused.stderr.contains("spec.envoyResources.listeners[0].value: Envoy: Error: terminal filter named envoy.filters.http.router of type envoy.filters.http.router must be the last filter in a http filter chain."),
        "{}",
        refused.stderr
    );
    let configs: Api<EnvoyConfig> = Api::namespaced(scenario.client.clone(), &ns);
    assert!(configs.get_opt("demo-proxy").await.unwrap().is_none());

    step("second router refused");
    // An empty Any straight in the map: Envoy finds no filter for an empty type.
    let refused = apply(envoy_config("{}")).await;
    assert!(!refused.success, "{refused:?}");
    let err = &refused.stderr;
    assert!(
        err.contains("spec.resources[0].value: Envoy: Didn't find a registered implementation for 'envoy.filters.http.buffer' with type URL: ''"),
        "{err}"
    );
    assert!(configs.get_opt("routes").await.unwrap().is_none());

    step("empty Any refused");
    // Enabling the filter the way Envoy takes it: admitted, with a warning for the cluster.
    let admitted = apply(envoy_config(
        r#"{"@type": type.googleapis.com/envoy.config.route.v3.FilterConfig, config: {}}"#,
    ))
    .await;
    let err = &admitted.stderr;
    assert!(admitted.success, "{admitted:?}");
    assert!(
        err.contains("Warning: spec.resources[0].value: virtual_hosts[0].routes[0].route.cluster: no cluster named \"app\""),
        "{err}"
    );
    assert!(configs.get_opt("routes").await.unwrap().is_some());
    step("admitted with a warning");
}
