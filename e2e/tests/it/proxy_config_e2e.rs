//! `marin3r proxy-config` (the built binary) against an injected sidecar on the real cluster
//! (`hack/cluster`), marin3r installed from `manifests/`, through the API server's pod
//! port-forward. The sidecar's EnvoyConfig serves a TLS listener whose certificate comes over
//! SDS from a `kubernetes.io/tls` Secret with a real private key: `secrets` and `all`, as a
//! table, JSON and YAML, never print the key (its PEM body, its base64, `PRIVATE KEY`), JSON
//! and YAML parse, and the proxy is in sync (exit 0); the client certificate the bootstrap
//! reads from files is not compared. Without its `node-id` annotation the node is the one the
//! Envoy runs as (its `--service-node`). Then the config is recreated with its listener on an
//! address no pod has: the real Envoy container fails to bind it, rejects the change and keeps
//! the old listener, nothing earlier is left to roll back to, so what is served and what the
//! proxy holds differ: a unified diff, exit 1.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::PostParams;
use marin3r_api::EnvoyConfig;
use marin3r_api::envoy_config::CacheState;
use marin3r_e2e::real;
use marin3r_e2e::rejected::NO_POD_ADDRESS;
use marin3r_testkit::wait::until;
use serde_json::json;

/// base64 of `-----BEGIN PRIVATE KEY-----`: the key PEM as SDS `inline_bytes` would print it.
const KEY_PEM_BASE64: &str = "LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0t";

/// An HTTP listener on `address` and a TLS one whose certificate is the SDS secret `web-cert`,
/// from the Secret of that name.
fn envoy_config(address: &str) -> String {
    let hcm = |prefix: &str| {
        format!(
            r#"- name: envoy.filters.network.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                  stat_prefix: {prefix}
                  route_config:
                    name: {prefix}
                    virtual_hosts:
                      - name: web
                        domains: ["*"]
                        routes:
                          - match: {{prefix: "/"}}
                            direct_response: {{status: 200, body: {{inline_string: "hello"}}}}
                  http_filters:
                    - name: envoy.filters.http.router
                      typed_config:
                        "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"#
        )
    };
    format!(
        r#"
apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata: {{name: web}}
spec:
  nodeID: web
  resources:
    - type: secret
      generateFromTlsSecret: web-cert
    - type: listener
      value:
        name: http
        address: {{socket_address: {{address: {address}, port_value: 8080}}}}
        filter_chains:
          - filters:
              {http}
    - type: listener
      value:
        name: https
        address: {{socket_address: {{address: 0.0.0.0, port_value: 8443}}}}
        filter_chains:
          - filters:
              {https}
            transport_socket:
              name: envoy.transport_sockets.tls
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
                common_tls_context:
                  tls_certificate_sds_secret_configs:
                    - name: web-cert
                      sds_config: {{ads: {{}}, resource_api_version: V3}}
"#,
        http = hcm("http"),
        https = hcm("https"),
    )
}

/// `marin3r proxy-config -n NS web ARGS...`: exit status, stdout, stderr.
async fn proxy_config(kubeconfig: &Path, ns: &str, args: &[&str]) -> (bool, String, String) {
    let marin3r = marin3r_testkit::image::marin3r_bin().expect("the built marin3r binary");
    let out = tokio::process::Command::new(marin3r)
        .args(["proxy-config", "-n", ns, "web"])
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    // What people read (the table, and the comparison on stderr) shows no Rust Debug
    // formatting; a JSON or YAML document carries the proxy's own strings.
    let people = if args.contains(&"-o") {
        vec![&stderr]
    } else {
        vec![&stdout, &stderr]
    };
    for text in people {
        let line = marin3r_testkit::readable::debug_line(text);
        assert_eq!(
            line, None,
            "proxy-config {args:?} printed Debug formatting:\n{text}"
        );
    }
    (out.status.success(), stdout, stderr)
}

/// Runs proxy-config with `args` until it exits `success` with `wanted` in its output.
async fn proxy_config_until(
    kubeconfig: &Path,
    ns: &str,
    args: &[&str],
    success: bool,
    wanted: &str,
) -> (String, String) {
    let mut last = String::new();
    let found = tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            let (ok, out, err) = proxy_config(kubeconfig, ns, args).await;
            if ok == success && format!("{out}{err}").contains(wanted) {
                return (out, err);
            }
            last = format!("exit ok: {ok}\n{out}{err}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| {
        panic!("proxy-config {args:?} never exited {success} with {wanted:?}; last:\n{last}")
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn proxy_config_shows_no_key_and_diffs_what_the_proxy_rejected() {
    let start = Instant::now();
    let step = |what: &str| println!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
    let scenario = real::Scenario::start("configs", &["python"]).await.unwrap();
    let (client, ns) = (scenario.client.clone(), scenario.ns.clone());
    let kubeconfig = scenario.cluster.kubeconfig().to_owned();
    step("namespace created");
    scenario.apply(real::DISCOVERY_SERVICE).await.unwrap();
    scenario
        .discovery_service_ready("instance", Duration::from_secs(120))
        .await
        .unwrap();
    step("DiscoveryService Ready");

    let pki = marin3r_testkit::pki::Pki::new();
    let key_pem = pki.server.key_pem.clone();
    assert!(key_pem.contains("PRIVATE KEY"), "{key_pem}");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "web-cert"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": pki.server.cert_pem, "tls.key": key_pem},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    scenario.apply(&envoy_config("0.0.0.0")).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.create(
        &PostParams::default(),
        &real::idle_injected_pod("web", "web").unwrap(),
    )
    .await
    .unwrap();
    until("the pod Ready", Duration::from_secs(120), || async {
        marin3r_e2e::demo::ready_ip(&pods.get("web").await.ok()?)
    })
    .await;
    step("pod Ready");

    // In sync, the secret in it, and no key in any form or output.
    let (table, _) = proxy_config_until(&kubeconfig, &ns, &["secrets"], true, "In sync").await;
    let row = |l: &str| -> Vec<String> { l.split_whitespace().take(3).map(String::from).collect() };
    assert!(
        table
            .lines()
            .any(|l| row(l) == ["secrets", "web-cert", "dynamic"]),
        "{table}"
    );
    // The client certificate the bootstrap reads from a file is the proxy's own.
    assert!(
        table
            .lines()
            .any(|l| row(l) == ["secrets", "xds_client_certificate", "file"]),
        "{table}"
    );
    let key_lines: Vec<&str> = key_pem
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .collect();
    assert!(!key_lines.is_empty());
    for section in ["secrets", "all"] {
        for output in ["table", "json", "yaml"] {
            let (ok, out, err) = proxy_config(&kubeconfig, &ns, &[section, "-o", output]).await;
            let all = format!("{out}{err}");
            assert!(ok, "{section} -o {output} not in sync:\n{all}");
            for leak in key_lines
                .iter()
                .copied()
                .chain(["PRIVATE KEY", KEY_PEM_BASE64])
            {
                assert!(
                    !all.contains(leak),
                    "{section} -o {output} printed {leak:?}:\n{all}"
                );
            }
            let doc: serde_json::Value = match output {
                "json" => serde_json::from_str(&out).expect("-o json parses"),
                "yaml" => serde_saphyr::from_str(&out).expect("-o yaml parses"),
                _ => continue,
            };
            let names: Vec<(&str, &str)> = doc["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r["type"].as_str().unwrap(), r["name"].as_str().unwrap()))
                .collect();
            assert!(names.contains(&("secrets", "web-cert")), "{names:?}");
            if section == "all" {
                assert!(names.contains(&("listeners", "https")), "{names:?}");
            }
        }
    }

    // A pod without the node-id annotation (as an EnvoyDeployment gateway's): the node is the
    // one its Envoy runs as.
    step("no key shown in any section or format");
    scenario
        .kubectl
        .ok(&[
            "annotate",
            "pod",
            "web",
            "-n",
            &ns,
            "marin3r.3scale.net/node-id-",
        ])
        .await
        .unwrap();
    proxy_config_until(
        &kubeconfig,
        &ns,
        &["listeners"],
        true,
        "serves node web:\nIn sync",
    )
    .await;

    // The config recreated with its HTTP listener where no pod can bind: Envoy rejects the
    // change and keeps its listener; with no earlier revision nothing is rolled back.
    step("node from the Envoy itself");
    scenario
        .kubectl
        .ok(&["delete", "envoyconfig", "web", "-n", &ns, "--wait=true"])
        .await
        .unwrap();
    scenario
        .kubectl
        .ok(&["delete", "envoyconfigrevisions", "--all", "-n", &ns])
        .await
        .unwrap();
    scenario.apply(&envoy_config(NO_POD_ADDRESS)).await.unwrap();
    let configs: Api<EnvoyConfig> = Api::namespaced(client.clone(), &ns);
    until("RollbackFailed", Duration::from_secs(90), || async {
        let ec = configs.get("web").await.ok()?;
        let state = ec.status?.cache_state?;
        (state == CacheState::RollbackFailed).then_some(())
    })
    .await;
    step("RollbackFailed");
    let (out, _) = proxy_config_until(
        &kubeconfig,
        &ns,
        &["listeners"],
        false,
        "differs: listeners/http",
    )
    .await;
    assert!(out.contains("Not in sync with the control plane"), "{out}");
    assert!(out.contains("--- served listeners/http"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with('-') && l.contains(NO_POD_ADDRESS)),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with('+') && l.contains("0.0.0.0")),
        "{out}"
    );
    // The TLS listener and its secret did not change: alike.
    let (ok, secrets, _) = proxy_config(&kubeconfig, &ns, &["secrets"]).await;
    assert!(ok, "{secrets}");
    step("the rejected listener diffed");
}
