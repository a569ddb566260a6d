//! `marin3r validate`, run as a user runs it: the built binary on manifest files on disk.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use crate::support::{BAD_CONFIG as BAD, GOOD_CONFIG as GOOD};

/// Runs the built `marin3r` with the Envoy `hack/install-tools` installs first on PATH, as
/// `hack/test` has it, so Envoy's verdict is part of every run.
fn marin3r(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(args)
        .env("PATH", crate::support::path_with_envoy())
        .output()
        .expect("run marin3r")
}

fn lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_valid_config_prints_one_ok_line_and_exits_zero() {
    let out = marin3r(&["validate", "-f", GOOD]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        lines(&out.stdout),
        [format!(
            "{GOOD}: EnvoyConfig default/test: OK (node my-proxy, 3 resources: clusters 1, \
             listeners 1, secrets 1; accepted by Envoy 1.40.0)"
        )]
    );
    // The Secret in the same file is not an EnvoyConfig: said, but not an error.
    assert_eq!(
        lines(&out.stderr),
        [format!("{GOOD}: Secret other: skipped, not an EnvoyConfig")]
    );
}

#[test]
fn every_error_of_every_file_is_printed_and_the_exit_is_non_zero() {
    let missing = "/nonexistent/marin3r-validate.yaml";
    let out = marin3r(&["validate", "-f", GOOD, BAD, missing]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(lines(&out.stdout).len(), 1, "only the good config is OK");
    let stderr = lines(&out.stderr);
    let bad: Vec<_> = stderr.iter().filter(|l| l.starts_with(BAD)).collect();
    assert_eq!(
        bad,
        [
            &format!(
                "{BAD}: EnvoyConfig default/bad: spec.envoyAPI: Envoy's v2 API is not \
                 supported; use v3"
            ),
            // Errors inside `value: |` blocks point at the file's line and column.
            &format!(
                "{BAD}:21:17: EnvoyConfig default/bad: spec.envoyResources.clusters[0].value: \
                 type: unknown enum value \"STRICTDNS\""
            ),
            &format!(
                "{BAD}:36:19: EnvoyConfig default/bad: spec.envoyResources.listeners[0].value: \
                 filter_chains[0].filters[0].typed_config: Envoy's v2 API is not supported; use \
                 v3 (\"@type\" names \
                 envoy.config.filter.network.http_connection_manager.v2.HttpConnectionManager)"
            ),
            // The same value's next problem too, not only its first (found on the value
            // once the first is taken out, so without a line).
            &format!(
                "{BAD}: EnvoyConfig default/bad: spec.envoyResources.listeners[0].value: \
                 filter_chains[0].transport_socket.typed_config: Envoy's v2 API is not \
                 supported; use v3 (\"@type\" names envoy.api.v2.auth.DownstreamTlsContext)"
            ),
        ]
    );
    assert!(
        stderr
            .iter()
            .any(|l| l.starts_with(&format!("{missing}: cannot read: "))),
        "{stderr:?}"
    );
}

#[test]
fn standard_input_and_files_without_envoyconfigs() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(["validate", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"apiVersion: v1\nkind: ConfigMap\nmetadata: { name: cm }\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        lines(&out.stderr),
        [
            "<stdin>: no EnvoyConfig (marin3r.3scale.net/v1alpha1) found",
            "<stdin>: ConfigMap cm: skipped, not an EnvoyConfig",
        ]
    );

    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, "kind: EnvoyConfig\nspec: [unclosed\n").unwrap();
    let broken = broken.to_str().unwrap();
    let out = marin3r(&["validate", "-f", broken]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = lines(&out.stderr);
    assert_eq!(
        stderr,
        [format!(
            "{broken}: YAML: unclosed bracket '[' at line 2, column 7"
        )]
    );
    // clap requires at least one file.
    assert_eq!(marin3r(&["validate"]).status.code(), Some(2));
}

const RESOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/testdata/resources");
const RESOURCES_BAD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/testdata/envoyconfig-resources-bad.yaml"
);

/// `spec.resources`: EnvoyConfigs in the original MARIN3R's form are valid, with what they generate
/// from Secrets and EndpointSlices counted; both fields at once, a bad `type` and a bad
/// `value` are refused as the controller refuses them, each with its field path.
#[test]
fn spec_resources_are_validated_as_the_controller_does() {
    let deployment = format!("{RESOURCES}/tls-endpoints.yaml");
    let oauth2 = format!("{RESOURCES}/oauth2.yaml");
    let out = marin3r(&["validate", "-f", &deployment, &oauth2]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        lines(&out.stdout),
        [
            format!(
                "{deployment}: EnvoyConfig kuard: OK (node kuard, 5 resources: endpoints 1, \
                 clusters 1, routes 1, listeners 1, secrets 1; accepted by Envoy 1.40.0)"
            ),
            format!(
                "{oauth2}: EnvoyConfig kuard: OK (node kuard, 8 resources: endpoints 1, \
                 clusters 2, routes 1, listeners 1, secrets 3; accepted by Envoy 1.40.0)"
            ),
        ]
    );

    let out = marin3r(&["validate", "-f", RESOURCES_BAD]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert_eq!(
        lines(&out.stderr),
        [
            format!(
                "{RESOURCES_BAD}: EnvoyConfig default/both: spec: spec.envoyResources and \
                 spec.resources are both set; use only one (spec.resources replaces the \
                 deprecated spec.envoyResources)"
            ),
            format!(
                "{RESOURCES_BAD}: EnvoyConfig default/bad-type: spec.resources[0].type: unknown \
                 variant `listner`, expected one of `listener`, `route`, `scopedRoute`, \
                 `cluster`, `endpoint`, `secret`, `runtime`, `extensionConfig`"
            ),
            format!(
                "{RESOURCES_BAD}: EnvoyConfig default/bad-value: spec.resources[2].value: \
                 unknown field \"adress\""
            ),
        ]
    );
}

const ORIGINAL_EXTRAS: &str = r#"
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryService
metadata: {name: instance, namespace: shop}
spec: {}
---
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryService
metadata: {name: internal, namespace: shop}
spec: {}
---
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: shop
  labels: {marin3r.3scale.net/status: enabled}
  annotations:
    marin3r.3scale.net/node-id: web
    marin3r.3scale.net/discovery-service.name: internal
spec: {containers: [{name: app, image: app}]}
---
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryServiceCertificate
metadata: {name: cert, namespace: shop}
spec:
  commonName: cert
  secretRef: {name: cert}
  signer: {selfSigned: {}}
  certificateRenewalNotification: {enabled: false}
"#;

/// Manifests written for the original MARIN3R: an EnvoyConfig beside what marin3r treats
/// differently on purpose (two DiscoveryServices in one namespace, a pod choosing one, the
/// v0.6 renewal switch). The config is judged; the rest is noted, not refused.
#[test]
fn deliberate_differences_from_the_original_are_noted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("original.yaml");
    let good = std::fs::read_to_string(GOOD).unwrap();
    let original = format!("{good}\n---\n{ORIGINAL_EXTRAS}");
    std::fs::write(&path, original).unwrap();
    let file = path.to_str().unwrap();
    let out = marin3r(&["validate", "-f", file]);
    assert!(out.status.success(), "{out:?}");
    let notes: Vec<String> = lines(&out.stderr)
        .into_iter()
        .filter(|l| l.contains(": note: "))
        .collect();
    let about = |object: &str, words: &str| {
        notes
            .iter()
            .any(|l| l.starts_with(&format!("{file}: {object}: note: ")) && l.contains(words))
    };
    assert!(
        about("DiscoveryService shop/internal", "NamespaceAlreadyServed"),
        "{notes:?}"
    );
    assert!(
        !about("DiscoveryService shop/instance", "NamespaceAlreadyServed"),
        "{notes:?}"
    );
    assert!(
        about("DiscoveryService shop/instance", "amd64 or arm64"),
        "{notes:?}"
    );
    assert!(about("Pod shop/web", "native sidecar"), "{notes:?}");
    assert!(
        about("Pod shop/web", "a namespace has one DiscoveryService"),
        "{notes:?}"
    );
    assert!(
        about("DiscoveryServiceCertificate shop/cert", "still reissues"),
        "{notes:?}"
    );
}

/// A route whose per-filter config is an empty `Any` straight in the map: it parses, and
/// only Envoy knows it cannot find a filter for an empty type. `marin3r validate` says so,
/// on the resource, in Envoy's words; with `--no-envoy` our checks alone pass it.
#[test]
fn envoy_judges_what_passes_our_checks() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("route.yaml");
    std::fs::write(
        &file,
        r#"apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata: {name: routes, namespace: shop}
spec:
  nodeID: shop
  resources:
    - type: cluster
      value: {name: app, connect_timeout: 1s, type: STRICT_DNS, load_assignment: {cluster_name: app, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: app, port_value: 80}}}}]}]}}
    - type: route
      value:
        name: local
        virtual_hosts:
          - name: all
            domains: ["*"]
            routes:
              - match: {prefix: "/"}
                route: {cluster: app}
                typed_per_filter_config:
                  envoy.filters.http.buffer: {}
"#,
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let out = marin3r(&["validate", "-f", file]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("spec.resources[1].value: Envoy: Didn't find a registered implementation for 'envoy.filters.http.buffer' with type URL: ''"),
        "{err}"
    );
    let out = marin3r(&["validate", "--no-envoy", "-f", file]);
    assert!(out.status.success(), "{out:?}");
    let out = marin3r(&["validate", "--envoy", "/nonexistent/envoy", "-f", file]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not run as Envoy"),
        "{out:?}"
    );
}

/// What Envoy accepts but will not work is admitted with a warning naming its path: a route
/// to a cluster the config does not define, and an `envoyResources[].name` that differs from
/// the resource's own (the original's tests use such names; it has no effect).
#[test]
fn references_to_undefined_resources_and_differing_names_are_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("warned.yaml");
    std::fs::write(
        &file,
        r#"apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata: {name: warned, namespace: shop}
spec:
  nodeID: shop
  serialization: yaml
  envoyResources:
    clusters:
      - name: not-the-name
        value: "name: app\nconnect_timeout: 1s"
    routes:
      - value: |
          name: local
          virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
                - match: {prefix: "/"}
                  route: {cluster: nowhere}
"#,
    )
    .unwrap();
    let out = marin3r(&["validate", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: spec.envoyResources.clusters[0].name: \"not-the-name\" differs from the resource's own name \"app\""),
        "{err}"
    );
    assert!(
        err.contains("warning: spec.envoyResources.routes[0].value: virtual_hosts[0].routes[0].route.cluster: no cluster named \"nowhere\""),
        "{err}"
    );
}

/// Issue 25's "Done when", through the command a user runs: a listener configuring a filter
/// with `xds.type.v3.TypedStruct` and a route enabling a filter with an empty per-route
/// `Any` are accepted (by our checks and by Envoy), and an HTTP router given by name only is
/// refused with Envoy's reason.
#[test]
fn typed_structs_and_empty_per_route_anys_pass_and_a_name_only_router_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, router: &str| {
        let file = dir.path().join(name);
        let manifest = format!(
            r#"apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata: {{name: edge, namespace: shop}}
spec:
  nodeID: edge
  resources:
    - type: cluster
      value: {{name: app, connect_timeout: 1s, load_assignment: {{cluster_name: app, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 8080}}}}}}}}]}}]}}}}
    - type: listener
      value:
        name: http
        address: {{socket_address: {{address: 0.0.0.0, port_value: 8000}}}}
        filter_chains:
          - filters:
              - name: envoy.filters.network.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                  stat_prefix: http
                  route_config:
                    name: local
                    virtual_hosts:
                      - name: all
                        domains: ["*"]
                        routes:
                          - match: {{prefix: /}}
                            route: {{cluster: app}}
                            typed_per_filter_config:
                              envoy.filters.http.buffer:
                                "@type": type.googleapis.com/envoy.config.route.v3.FilterConfig
                                config: {{}}
                  http_filters:
                    - name: envoy.filters.http.buffer
                      disabled: true
                      typed_config:
                        "@type": type.googleapis.com/xds.type.v3.TypedStruct
                        type_url: type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer
                        value: {{max_request_bytes: 1024}}
{router}
"#
        );
        std::fs::write(&file, manifest).unwrap();
        file.to_str().unwrap().to_owned()
    };
    let good = write(
        "good.yaml",
        r#"                    - name: envoy.filters.http.router
                      typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}"#,
    );
    let out = marin3r(&["validate", "-f", &good]);
    assert!(out.status.success(), "{out:?}");
    let ok = String::from_utf8_lossy(&out.stdout);
    assert!(
        ok.contains(": OK (") && ok.contains("accepted by Envoy 1.40"),
        "{ok}"
    );

    let name_only = write(
        "name-only.yaml",
        "                    - name: envoy.filters.http.router",
    );
    let out = marin3r(&["validate", "-f", &name_only]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("spec.resources[1].value")
            && err.contains(
                "Didn't find a registered implementation for 'envoy.filters.http.router' with type URL: ''"
            ),
        "{err}"
    );
}

/// `-o json|yaml`: the same verdicts as one document on stdout, each problem with its line
/// and column, for CI jobs that read them.
#[test]
fn the_verdicts_are_one_document_for_scripts() {
    let missing = "/nonexistent/marin3r-validate.yaml";
    let out = marin3r(&["validate", "-o", "json", "-f", GOOD, BAD, missing]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["valid"], false);
    let files = doc["files"].as_array().unwrap();
    assert_eq!(files.len(), 3, "{doc}");
    assert_eq!(files[0]["file"], GOOD);
    assert_eq!(
        files[0]["documents"],
        serde_json::json!([
            {"object": "default/test", "result": "valid",
             "summary": "node my-proxy, 3 resources: clusters 1, listeners 1, secrets 1; \
                         accepted by Envoy 1.40.0"},
            {"object": "Secret other", "result": "skipped"},
        ])
    );
    let bad = &files[1]["documents"][0];
    assert_eq!(bad["result"], "invalid", "{bad}");
    assert_eq!(
        bad["problems"][1],
        serde_json::json!({"line": 21, "column": 17,
            "message": "spec.envoyResources.clusters[0].value: type: unknown enum value \"STRICTDNS\""})
    );
    assert!(bad["problems"][0].get("line").is_none(), "{bad}");
    assert!(
        files[2]["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("cannot read: ")),
        "{doc}"
    );

    let out = marin3r(&["validate", "-o", "yaml", "-f", GOOD]);
    assert!(out.status.success(), "{out:?}");
    let yaml: serde_json::Value =
        serde_saphyr::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap();
    assert_eq!(yaml["valid"], true);
    assert_eq!(yaml["files"][0]["documents"], doc["files"][0]["documents"]);
}
