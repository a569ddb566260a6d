//! The Helm chart (`manifests/chart`) with the real helm of `hack/install-tools`, no cluster:
//! it lints; with its default values it renders what `kubectl kustomize manifests/` renders
//! (and with `monitoring.enabled`, what the monitoring component adds), less what helm's
//! conventions add, so the chart and the kustomize install cannot drift apart; each value
//! does what `values.yaml` says; bad values are refused naming the value.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The chart, relative to the repository's root.
const CHART: &str = "manifests/chart";

/// The namespace the kustomize install uses, given to helm as the release's.
const NAMESPACE: &str = "marin3r-system";

/// The labels every object of the chart carries beside those of `manifests/`.
const CHART_LABELS: &[&str] = &[
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];

fn repo() -> PathBuf {
    marin3r_testkit::tools::repo_root()
}

/// The real helm (`.tools/bin/helm`, or `MARIN3R_HELM`).
pub fn helm() -> PathBuf {
    marin3r_testkit::tools::find_tool("helm", "MARIN3R_HELM").unwrap()
}

/// `program args` from the repository's root: its stdout, or its stderr as the error.
fn run(program: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{} {} failed ({}):\n{}",
            program.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `helm template marin3r manifests/chart -n marin3r-system` with `args` (the test hook
/// pod left out: it is helm's, not the install's).
fn template(args: &[&str]) -> Result<String, String> {
    let mut all = vec!["template", "marin3r", CHART, "--namespace", NAMESPACE];
    all.extend(args);
    run(&helm(), &all)
}

/// `v` with every whole float written as an integer: the CRDs say `minimum: 0.0`, which
/// kustomize writes as `0` and helm as it is.
fn whole_numbers(v: Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => {
                #[allow(clippy::cast_possible_truncation)]
                let i = f as i64;
                Value::from(i)
            }
            _ => Value::Number(n),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(whole_numbers).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, whole_numbers(v)))
                .collect(),
        ),
        other => other,
    }
}

/// The objects of a YAML stream by "Kind namespace/name".
pub fn objects(yaml: &str) -> BTreeMap<String, Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).unwrap();
    let mut out = BTreeMap::new();
    for doc in docs.into_iter().filter(|d| !d.is_null()).map(whole_numbers) {
        let field = |f: &str| doc["metadata"][f].as_str().unwrap_or_default().to_owned();
        let key = format!(
            "{} {}/{}",
            doc["kind"].as_str().unwrap_or_default(),
            field("namespace"),
            field("name")
        );
        assert!(out.insert(key.clone(), doc).is_none(), "{key} twice");
    }
    out
}

/// What the chart adds to an object of `manifests/`, taken away: helm's labels, and the
/// operator's `imagePullPolicy: IfNotPresent` (what the API server sets for a tagged image
/// when the kustomize install says nothing).
fn without_chart_additions(mut obj: Value) -> Value {
    if let Some(labels) = obj["metadata"]["labels"].as_object_mut() {
        for label in CHART_LABELS {
            assert!(labels.remove(*label).is_some(), "no {label} on {obj:?}");
        }
    }
    if let Some(containers) = obj
        .pointer_mut("/spec/template/spec/containers")
        .and_then(Value::as_array_mut)
    {
        for c in containers {
            if c["imagePullPolicy"] == "IfNotPresent"
                && let Some(c) = c.as_object_mut()
            {
                c.remove("imagePullPolicy");
            }
        }
    }
    obj
}

/// The chart's rendering with `args`, with what helm adds taken away; the CRDs included.
fn chart_objects(args: &[&str]) -> BTreeMap<String, Value> {
    let mut all = vec!["--include-crds", "--no-hooks"];
    all.extend(args);
    let rendered = template(&all).unwrap();
    objects(&rendered)
        .into_iter()
        .map(|(k, v)| {
            let v = if k.starts_with("CustomResourceDefinition ") {
                v
            } else {
                without_chart_additions(v)
            };
            (k, v)
        })
        .collect()
}

/// `kubectl kustomize` of a kustomization of `resources` and `components`, less the
/// Namespace (helm installs into one that exists).
fn kustomize_objects(resources: &[&Path], components: &[&Path]) -> BTreeMap<String, Value> {
    let dir = tempfile::tempdir().unwrap();
    // kustomize takes only relative paths to other kustomizations.
    let up = "../".repeat(dir.path().components().count() - 1);
    let list = |paths: &[&Path]| {
        paths
            .iter()
            .map(|p| {
                let absolute = p.canonicalize().unwrap();
                let from_root = absolute.strip_prefix("/").unwrap();
                format!("  - {up}{}\n", from_root.display())
            })
            .collect::<String>()
    };
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n{}{}",
        list(resources),
        if components.is_empty() {
            String::new()
        } else {
            format!("components:\n{}", list(components))
        }
    );
    std::fs::write(dir.path().join("kustomization.yaml"), kustomization).unwrap();
    let kubectl = marin3r_testkit::tools::kubectl().unwrap();
    let rendered = run(&kubectl, &["kustomize", &dir.path().to_string_lossy()]).unwrap();
    let mut objects = objects(&rendered);
    let namespace = format!("Namespace /{NAMESPACE}");
    assert!(objects.remove(&namespace).is_some(), "no {namespace}");
    objects
}

/// Where `a` and `b` first differ (a JSON pointer), with both sides there.
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let (x, y) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                first_difference(x, y, &format!("{at}/{k}"))
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(x, y, &format!("{at}/{i}"))),
        _ if a == b => None,
        _ => Some(format!("{at}: chart {a}, kustomize {b}")),
    }
}

/// The objects of `a` (the chart's) and `b` (kustomize's) that differ, and where.
fn differences(a: &BTreeMap<String, Value>, b: &BTreeMap<String, Value>) -> Vec<String> {
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter_map(|k| match (a.get(k), b.get(k)) {
            (Some(x), Some(y)) => first_difference(x, y, "").map(|d| format!("{k}: {d}")),
            (Some(_), None) => Some(format!("{k}: only in the chart")),
            (None, Some(_)) => Some(format!("{k}: only in kustomize's")),
            (None, None) => None,
        })
        .collect()
}

#[test]
fn the_chart_lints_with_helm() {
    for args in [&[][..], &["--set", "discoveryService.create=true"][..]] {
        let mut all = vec!["lint", "--strict", CHART, "--namespace", NAMESPACE];
        all.extend(args);
        let out = run(&helm(), &all).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{out}"
        );
    }
}

#[test]
fn the_chart_is_the_workspace_version() {
    let text = std::fs::read_to_string(repo().join(CHART).join("Chart.yaml")).unwrap();
    let chart: Value = serde_saphyr::from_str(&text).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(chart["version"], version, "Chart.yaml version");
    assert_eq!(chart["appVersion"], version, "Chart.yaml appVersion");
}

#[test]
fn default_values_render_what_kustomize_renders() {
    let manifests = repo().join("manifests");
    let chart = chart_objects(&[]);
    let kustomize = kustomize_objects(&[&manifests], &[]);
    let diff = differences(&chart, &kustomize);
    assert!(
        diff.is_empty(),
        "the chart and manifests/ differ:\n{}",
        diff.join("\n")
    );
    // Not an empty comparison: the CRDs, the RBAC and the operator are there.
    let crds = chart
        .keys()
        .filter(|k| k.starts_with("CustomResourceDefinition "));
    assert_eq!(crds.count(), 5, "{:?}", chart.keys());
    for part in [
        "ServiceAccount marin3r-system/marin3r-operator",
        "ClusterRole /marin3r-operator",
        "ClusterRoleBinding /marin3r-operator",
        "Deployment marin3r-system/marin3r-operator",
    ] {
        assert!(chart.contains_key(part), "no {part}: {:?}", chart.keys());
    }
}

#[test]
fn monitoring_renders_what_the_monitoring_component_adds() {
    let manifests = repo().join("manifests");
    let chart = chart_objects(&[
        "--set",
        "monitoring.enabled=true",
        "--api-versions",
        "monitoring.coreos.com/v1",
    ]);
    let kustomize = kustomize_objects(&[&manifests], &[&manifests.join("monitoring")]);
    let diff = differences(&chart, &kustomize);
    assert!(
        diff.is_empty(),
        "the chart and manifests/monitoring differ:\n{}",
        diff.join("\n")
    );
    for part in [
        "PodMonitor marin3r-system/marin3r-operator",
        "PrometheusRule marin3r-system/marin3r",
        "ConfigMap marin3r-system/marin3r-grafana-dashboard",
    ] {
        assert!(chart.contains_key(part), "no {part}: {:?}", chart.keys());
    }
    // Without the prometheus-operator's API the chart says what is missing.
    let err = template(&["--set", "monitoring.enabled=true"]).unwrap_err();
    assert!(err.contains("monitoring.coreos.com/v1"), "{err}");
}

/// The operator's container in a rendering.
fn operator(objects: &BTreeMap<String, Value>, ns: &str) -> Value {
    let key = format!("Deployment {ns}/marin3r-operator");
    let d = objects.get(&key).unwrap_or_else(|| panic!("no {key}"));
    d["spec"]["template"]["spec"]["containers"][0].clone()
}

#[test]
fn values_set_the_image_replicas_namespaces_and_a_discovery_service() {
    let rendered = template(&[
        "--namespace",
        "team-ops",
        "--set",
        "image.repository=registry.example:5000/team/marin3r,image.tag=v9.8.7",
        "--set",
        "image.pullPolicy=Always,replicaCount=2",
        "--set",
        "trustedNamespaces={team-a,team-ops}",
        "--set",
        "resources.limits.memory=256Mi",
        "--set",
        "nodeSelector.pool=infra",
        "--set",
        "discoveryService.create=true,discoveryService.name=edge",
        "--set",
        "discoveryService.enabledNamespaces={shop}",
        "--set",
        "discoveryService.spec.replicas=2",
    ])
    .unwrap();
    let objects = objects(&rendered);
    let c = operator(&objects, "team-ops");
    let image = "registry.example:5000/team/marin3r:v9.8.7";
    assert_eq!(c["image"], image);
    assert_eq!(c["imagePullPolicy"], "Always");
    let env = c["env"].as_array().unwrap();
    assert!(
        env.iter()
            .any(|e| e["name"] == "MARIN3R_IMAGE" && e["value"] == image),
        "{env:?}"
    );
    // The release's namespace is trusted too, once.
    assert_eq!(
        c["args"],
        serde_json::json!([
            "operator",
            "--trusted-namespace=team-ops",
            "--trusted-namespace=team-a"
        ])
    );
    assert_eq!(c["resources"]["limits"]["memory"], "256Mi");
    assert_eq!(c["resources"]["requests"]["cpu"], "50m");
    let d = &objects["Deployment team-ops/marin3r-operator"];
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(
        d["spec"]["template"]["spec"]["nodeSelector"]["pool"],
        "infra"
    );
    let binding = &objects["ClusterRoleBinding /marin3r-operator"];
    assert_eq!(binding["subjects"][0]["namespace"], "team-ops");
    let ds = &objects["DiscoveryService team-ops/edge"];
    assert_eq!(
        ds["spec"],
        serde_json::json!({"enabledNamespaces": ["shop"], "replicas": 2})
    );
    // The test hook runs `marin3r check` on the same image, for the release's namespace.
    let hook = &objects["Pod team-ops/marin3r-check-marin3r"];
    assert_eq!(hook["metadata"]["annotations"]["helm.sh/hook"], "test");
    assert_eq!(hook["spec"]["containers"][0]["image"], image);
    assert_eq!(
        hook["spec"]["containers"][0]["args"],
        serde_json::json!(["check", "--operator-namespace", "team-ops"])
    );
}

#[test]
fn bad_values_are_refused_naming_the_value() {
    let schema = "values don't meet the specifications of the schema";
    for (set, says) in [
        ("replicaCount=-1", "at '/replicaCount': minimum"),
        (
            "replicaCount=two",
            "at '/replicaCount': got string, want integer",
        ),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
        ("image.tag=v1:latest", "at '/image/tag'"),
        ("image.repository=Not An Image", "at '/image/repository'"),
        ("trustedNamespaces={Team_A}", "at '/trustedNamespaces/0'"),
        (
            "discoveryService.create=yes",
            "at '/discoveryService/create'",
        ),
        (
            "monitoring.enable=true",
            "additional properties 'enable' not allowed",
        ),
        ("replicas=2", "additional properties 'replicas' not allowed"),
    ] {
        let err = template(&["--set", set]).expect_err(set);
        assert!(
            err.contains(schema) && err.contains(says),
            "--set {set}: {err}"
        );
    }
    // What a schema cannot say clearly, the templates do.
    let err = template(&["--set", "discoveryService.spec.enabledNamespaces={a}"]).unwrap_err();
    assert!(
        err.contains(
            "set discoveryService.enabledNamespaces, not discoveryService.spec.enabledNamespaces"
        ),
        "{err}"
    );
}
