//! `marin3r validate`, run as a user runs it: the built binary on manifest files on disk.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

const GOOD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/testdata/envoyconfig-good.yaml"
);
const BAD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/testdata/envoyconfig-bad.yaml"
);

fn marin3r(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(args)
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
             listeners 1, secrets 1)"
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
                 clusters 1, routes 1, listeners 1, secrets 1)"
            ),
            format!(
                "{oauth2}: EnvoyConfig kuard: OK (node kuard, 8 resources: endpoints 1, \
                 clusters 2, routes 1, listeners 1, secrets 3)"
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
