//! The OLM bundle in `manifests/olm/`: a ClusterServiceVersion, the CRDs and the bundle's
//! annotations, rendered from what the kustomize install is made of (the CRDs generated from
//! the Rust types, `manifests/operator/`'s Deployment and RBAC, `kustomization.yaml`'s image,
//! `manifests/examples/`), so the two installs cannot tell different stories.
//! `marin3r crds --olm-bundle manifests/olm` (`hack/render-olm`) writes it; a test fails when
//! the checked-in copy is stale, and another runs the operator-framework's validators on it.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

use crate::crds;
use marin3r_api::EnvoyConfigSpec;
use marin3r_api::envoy_config_revision::EnvoyConfigRevisionSpec;

/// The OLM package, its one channel and the CSV's file inside the bundle.
pub const PACKAGE: &str = "marin3r";
/// OLM's recommended name for a channel of pre-releases.
pub const CHANNEL: &str = "candidate";
pub const CSV_FILE: &str = "manifests/marin3r.clusterserviceversion.yaml";
/// The oldest Kubernetes the bundle admits: the native sidecar layout needs 1.29 (the tests
/// run on 1.36).
pub const MIN_KUBE_VERSION: &str = "1.29.0";
/// Created by the discovery service only: OLM's console hides them from "create" forms.
const INTERNAL_CRDS: &[&str] = &["envoyconfigrevisions.marin3r.3scale.net"];

/// The files the bundle is rendered from, as read from `manifests/`.
#[derive(Debug, Clone)]
pub struct Sources {
    /// `manifests/kustomization.yaml`: its `images:` name the operator's image.
    pub kustomization: String,
    /// `manifests/operator/deployment.yaml`.
    pub deployment: String,
    /// `manifests/operator/rbac.yaml`: a ServiceAccount, ClusterRoles and their bindings.
    pub rbac: String,
    /// `manifests/operator/user-roles.yaml`: the ClusterRoles aggregated into `view`, `edit`
    /// and `admin`, shipped as plain manifests of the bundle (OLM installs them as they are).
    pub user_roles: String,
    /// Each file of `manifests/examples/`, in name order, then the gateway guide's
    /// EnvoyDeployment (`docs/examples/gateway/envoydeployment.yaml`); the documents of
    /// marin3r's own kinds become the CSV's `alm-examples`, and each EnvoyConfig's revision
    /// (as the discovery service would create it) the example of that internal kind.
    pub examples: Vec<(String, String)>,
}

impl Sources {
    /// Reads them from a checkout's `manifests/` folder.
    pub fn read(manifests: &Path) -> Result<Self, OlmError> {
        let read = |rel: &str| {
            let path = manifests.join(rel);
            std::fs::read_to_string(&path).map_err(|source| OlmError::Read { path, source })
        };
        let dir = manifests.join("examples");
        let entries = std::fs::read_dir(&dir).map_err(|source| OlmError::Read {
            path: dir.clone(),
            source,
        })?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| OlmError::Read {
                path: dir.clone(),
                source,
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".yaml") {
                names.push(name);
            }
        }
        names.sort();
        let mut examples = Vec::new();
        for name in names {
            let text = read(&format!("examples/{name}"))?;
            examples.push((format!("examples/{name}"), text));
        }
        let gateway = "../docs/examples/gateway/envoydeployment.yaml";
        examples.push((gateway.trim_start_matches("../").to_owned(), read(gateway)?));
        Ok(Self {
            kustomization: read("kustomization.yaml")?,
            deployment: read("operator/deployment.yaml")?,
            rbac: read("operator/rbac.yaml")?,
            user_roles: read("operator/user-roles.yaml")?,
            examples,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OlmError {
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: not YAML")]
    Parse {
        file: String,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    #[error("{file}: {what}")]
    Shape { file: String, what: String },
    #[error("cannot write YAML")]
    Serialize(#[from] serde_saphyr::SerializeError),
    #[error("cannot write JSON")]
    Json(#[from] serde_json::Error),
}

fn shape(file: &str, what: impl Into<String>) -> OlmError {
    OlmError::Shape {
        file: file.to_owned(),
        what: what.into(),
    }
}

fn documents(file: &str, text: &str) -> Result<Vec<Value>, OlmError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|source| OlmError::Parse {
        file: file.to_owned(),
        source: Box::new(source),
    })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The bundle's files (path inside the bundle, text), for the binary's `version`.
pub fn render(
    all: &[CustomResourceDefinition],
    sources: &Sources,
    version: &str,
) -> Result<Vec<(String, String)>, OlmError> {
    let csv = cluster_service_version(all, sources, version)?;
    let mut files = vec![(
        CSV_FILE.to_owned(),
        format!(
            "# Rendered by `marin3r crds --olm-bundle` (hack/render-olm) from manifests/: do not edit.\n{}",
            serde_saphyr::to_string(&csv)?
        ),
    )];
    for crd in all {
        files.push((
            format!("manifests/{}", crds::file_name(crd)),
            crds::to_yaml(crd)?,
        ));
    }
    for role in documents("operator/user-roles.yaml", &sources.user_roles)? {
        let name = role["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if role["kind"] != "ClusterRole" || name.is_empty() {
            return Err(shape(
                "operator/user-roles.yaml",
                "holds something other than named ClusterRoles",
            ));
        }
        files.push((
            format!("manifests/{name}.clusterrole.yaml"),
            serde_saphyr::to_string(&role)?,
        ));
    }
    let annotations = json!({"annotations": {
        "operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
        "operators.operatorframework.io.bundle.manifests.v1": "manifests/",
        "operators.operatorframework.io.bundle.metadata.v1": "metadata/",
        "operators.operatorframework.io.bundle.package.v1": PACKAGE,
        "operators.operatorframework.io.bundle.channels.v1": CHANNEL,
        "operators.operatorframework.io.bundle.channel.default.v1": CHANNEL,
    }});
    files.push((
        "metadata/annotations.yaml".to_owned(),
        serde_saphyr::to_string(&annotations)?,
    ));
    Ok(files)
}

fn cluster_service_version(
    all: &[CustomResourceDefinition],
    sources: &Sources,
    version: &str,
) -> Result<Value, OlmError> {
    let image = operator_image(&sources.kustomization)?;
    let deployment = deployment(&sources.deployment, &image)?;
    let permissions = cluster_permissions(&sources.rbac)?;
    let examples = alm_examples(&sources.examples)?;
    let owned: Vec<Value> = all.iter().map(owned_crd).collect();
    Ok(json!({
        "apiVersion": "operators.coreos.com/v1alpha1",
        "kind": "ClusterServiceVersion",
        "metadata": {
            "name": format!("{PACKAGE}.v{version}"),
            "annotations": {
                "alm-examples": serde_json::to_string_pretty(&examples)?,
                "capabilities": "Basic Install",
                "categories": "Networking",
                "containerImage": image,
                "description": "Envoy control plane: xDS over mutual TLS, sidecar injection, versioned configs with rollback on NACK.",
                "operators.operatorframework.io/internal-objects": serde_json::to_string(INTERNAL_CRDS)?,
            },
        },
        "spec": {
            "displayName": "marin3r",
            "description": DESCRIPTION,
            "version": version,
            "maturity": "alpha",
            "minKubeVersion": MIN_KUBE_VERSION,
            "provider": {"name": "marin3r project"},
            "keywords": ["envoy", "xds", "control plane", "sidecar", "proxy"],
            "icon": [{"base64data": base64_encode(ICON_SVG.as_bytes()), "mediatype": "image/svg+xml"}],
            "customresourcedefinitions": {"owned": owned},
            "relatedImages": [{"name": "marin3r", "image": image}],
            // The operator's controllers watch every namespace (it has no namespace flag) and
            // its discovery services serve the namespaces listed or labelled for them, so it
            // can only be installed for all namespaces.
            "installModes": [
                {"type": "OwnNamespace", "supported": false},
                {"type": "SingleNamespace", "supported": false},
                {"type": "MultiNamespace", "supported": false},
                {"type": "AllNamespaces", "supported": true},
            ],
            "install": {
                "strategy": "deployment",
                "spec": {
                    "clusterPermissions": permissions,
                    "deployments": [deployment],
                },
            },
        },
    }))
}

const DESCRIPTION: &str = "marin3r runs Envoy proxies' configuration as Kubernetes resources.

* A `DiscoveryService` runs the xDS server (state of the world and delta ADS over mutual TLS) and the \
admission webhook that injects an Envoy sidecar into pods labelled `marin3r.3scale.net/status=enabled` \
in the namespaces it serves, with a per-namespace client certificate that the operator renews.
* An `EnvoyConfig` declares one node id's listeners, clusters, routes, scoped routes, secrets and \
extension configs; every version is judged before it is published, kept as an `EnvoyConfigRevision`, \
and rolled back when the proxies reject it.
* An `EnvoyDeployment` runs Envoy as a gateway of its own, configured the same way.

The operator is installed for all namespaces: its own namespace is the trusted one, where a \
DiscoveryService may serve other namespaces; a DiscoveryService anywhere else serves its own \
namespace only.
";

/// A small icon of our own: an envoy's envelope on a round badge.
const ICON_SVG: &str = r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64"><circle cx="32" cy="32" r="30" fill="#1f5f8b"/><rect x="14" y="20" width="36" height="24" rx="3" fill="#fff"/><path d="M14 22 L32 35 L50 22" fill="none" stroke="#1f5f8b" stroke-width="3"/></svg>"##;

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `DiscoveryServiceCertificate` -> `Discovery Service Certificate`.
fn display_name(kind: &str) -> String {
    let mut out = String::new();
    for (i, c) in kind.chars().enumerate() {
        if i > 0 && c.is_ascii_uppercase() {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

fn owned_crd(crd: &CustomResourceDefinition) -> Value {
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .or(crd.spec.versions.first());
    let description = version
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.description.clone())
        .unwrap_or_else(|| crd.spec.names.kind.clone());
    json!({
        "name": crd.metadata.name,
        "version": version.map(|v| v.name.clone()),
        "kind": crd.spec.names.kind,
        "displayName": display_name(&crd.spec.names.kind),
        "description": description,
    })
}

/// The image `kustomization.yaml` gives the container image named `marin3r`.
fn operator_image(kustomization: &str) -> Result<String, OlmError> {
    const FILE: &str = "kustomization.yaml";
    let doc = documents(FILE, kustomization)?
        .into_iter()
        .next()
        .ok_or_else(|| shape(FILE, "empty"))?;
    let entry = doc["images"]
        .as_array()
        .and_then(|images| images.iter().find(|i| i["name"] == "marin3r"))
        .ok_or_else(|| shape(FILE, "no `images:` entry named marin3r"))?;
    match (entry["newName"].as_str(), entry["newTag"].as_str()) {
        (Some(name), Some(tag)) => Ok(format!("{name}:{tag}")),
        _ => Err(shape(FILE, "the marin3r image needs newName and newTag")),
    }
}

/// The operator Deployment as a CSV `deployments` entry, with the image set as kustomize sets
/// it (`images:` on the container, `replacements:` on `MARIN3R_IMAGE`).
fn deployment(text: &str, image: &str) -> Result<Value, OlmError> {
    const FILE: &str = "operator/deployment.yaml";
    let doc = documents(FILE, text)?
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .ok_or_else(|| shape(FILE, "no Deployment"))?;
    let name = doc["metadata"]["name"]
        .as_str()
        .ok_or_else(|| shape(FILE, "the Deployment has no name"))?
        .to_owned();
    let mut spec = doc["spec"].clone();
    let containers = spec["template"]["spec"]["containers"]
        .as_array_mut()
        .ok_or_else(|| shape(FILE, "the Deployment has no containers"))?;
    for container in containers {
        if container["image"] == "marin3r" {
            container["image"] = json!(image);
        }
        for env in container["env"].as_array_mut().into_iter().flatten() {
            if env["name"] == "MARIN3R_IMAGE" {
                env["value"] = json!(image);
            }
        }
    }
    Ok(json!({"name": name, "label": doc["metadata"]["labels"], "spec": spec}))
}

/// Every ClusterRole of `rbac.yaml` bound to a ServiceAccount, as CSV `clusterPermissions`.
/// OLM creates the ServiceAccount, the roles and their bindings itself.
fn cluster_permissions(text: &str) -> Result<Vec<Value>, OlmError> {
    const FILE: &str = "operator/rbac.yaml";
    let docs = documents(FILE, text)?;
    let mut out = Vec::new();
    for doc in &docs {
        match doc["kind"].as_str() {
            Some("ServiceAccount" | "ClusterRole") => {}
            Some("ClusterRoleBinding") => {
                let role = &doc["roleRef"]["name"];
                let rules = docs
                    .iter()
                    .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == *role)
                    .map(|d| d["rules"].clone())
                    .ok_or_else(|| shape(FILE, format!("no ClusterRole {role}")))?;
                for subject in doc["subjects"].as_array().into_iter().flatten() {
                    if subject["kind"] != "ServiceAccount" {
                        return Err(shape(FILE, "a binding's subject is not a ServiceAccount"));
                    }
                    out.push(json!({"serviceAccountName": subject["name"], "rules": rules}));
                }
            }
            other => {
                return Err(shape(
                    FILE,
                    format!("{other:?} has no place in a CSV's clusterPermissions"),
                ));
            }
        }
    }
    if out.is_empty() {
        return Err(shape(FILE, "no ClusterRoleBinding"));
    }
    Ok(out)
}

/// The examples' documents of marin3r's own API groups, without their namespaces (the
/// console creates them where the user is).
fn alm_examples(files: &[(String, String)]) -> Result<Vec<Value>, OlmError> {
    let mut out = Vec::new();
    for (file, text) in files {
        for mut doc in documents(file, text)? {
            let group = doc["apiVersion"]
                .as_str()
                .and_then(|v| v.split_once('/'))
                .map(|(group, _)| group);
            if !group.is_some_and(|g| g.ends_with("marin3r.3scale.net")) {
                continue;
            }
            if let Some(meta) = doc["metadata"].as_object_mut() {
                meta.remove("namespace");
            }
            let revision = match doc["kind"].as_str() {
                Some("EnvoyConfig") => Some(revision_example(file, &doc)?),
                _ => None,
            };
            out.push(doc);
            out.extend(revision);
        }
    }
    Ok(out)
}

/// The revision the discovery service makes of an example EnvoyConfig at its version.
fn revision_example(file: &str, config: &Value) -> Result<Value, OlmError> {
    let spec: EnvoyConfigSpec = serde_json::from_value(config["spec"].clone()).map_err(|e| {
        shape(
            file,
            format!("an EnvoyConfig whose spec does not parse: {e}"),
        )
    })?;
    let version = spec.version();
    Ok(json!({
        "apiVersion": config["apiVersion"],
        "kind": "EnvoyConfigRevision",
        "metadata": {"name": format!("{}-{version}", spec.node_id)},
        "spec": EnvoyConfigRevisionSpec::of(&spec, &version),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_sources() -> Sources {
        Sources {
            kustomization: "images:\n  - name: marin3r\n    newName: reg/marin3r\n    newTag: v9.9.9\n".into(),
            deployment: "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: op, labels: {a: b}}\nspec:\n  template:\n    spec:\n      containers:\n        - name: operator\n          image: marin3r\n          env: [{name: MARIN3R_IMAGE, value: marin3r}]\n".into(),
            rbac: "kind: ServiceAccount\nmetadata: {name: op}\n---\nkind: ClusterRole\nmetadata: {name: r}\nrules: [{apiGroups: [''], resources: [pods], verbs: [get]}]\n---\nkind: ClusterRoleBinding\nmetadata: {name: r}\nroleRef: {name: r}\nsubjects: [{kind: ServiceAccount, name: op, namespace: x}]\n".into(),
            user_roles: "kind: ClusterRole\nmetadata: {name: v}\nrules: []\n".into(),
            examples: vec![(
                "a.yaml".into(),
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n---\napiVersion: marin3r.3scale.net/v1alpha1\nkind: EnvoyConfig\nmetadata: {name: e, namespace: demo}\nspec: {nodeID: node-e}\n".into(),
            )],
        }
    }

    #[test]
    fn the_csv_takes_image_rbac_and_examples_from_the_sources() {
        let csv = cluster_service_version(&crds::all(), &mk_sources(), "9.9.9").unwrap();
        assert_eq!(csv["metadata"]["name"], "marin3r.v9.9.9");
        let install = &csv["spec"]["install"]["spec"];
        let container = &install["deployments"][0]["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"], "reg/marin3r:v9.9.9");
        assert_eq!(container["env"][0]["value"], "reg/marin3r:v9.9.9");
        assert_eq!(install["clusterPermissions"][0]["serviceAccountName"], "op");
        assert_eq!(
            install["clusterPermissions"][0]["rules"][0]["verbs"][0],
            "get"
        );
        let examples: Vec<Value> = serde_json::from_str(
            csv["metadata"]["annotations"]["alm-examples"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(examples.len(), 2, "only marin3r's kinds: {examples:?}");
        assert_eq!(examples[0]["metadata"], json!({"name": "e"}));
        assert_eq!(examples[1]["kind"], "EnvoyConfigRevision");
        assert_eq!(examples[1]["spec"]["nodeID"], "node-e");
        let owned = csv["spec"]["customresourcedefinitions"]["owned"]
            .as_array()
            .unwrap();
        assert_eq!(owned.len(), crds::all().len());
        assert!(
            owned
                .iter()
                .any(|o| o["displayName"] == "Envoy Config Revision")
        );
    }

    #[test]
    fn bad_sources_are_named_in_the_error() {
        let mut s = mk_sources();
        s.kustomization = "images: []\n".into();
        let err = render(&crds::all(), &s, "1.0.0").unwrap_err().to_string();
        assert!(err.contains("kustomization.yaml"), "{err}");

        let mut s = mk_sources();
        s.rbac.push_str("---\nkind: Role\nmetadata: {name: x}\n");
        let err = render(&crds::all(), &s, "1.0.0").unwrap_err().to_string();
        assert!(err.contains("rbac.yaml") && err.contains("Role"), "{err}");

        let mut s = mk_sources();
        s.deployment = "kind: Deployment\nmetadata: {name: [\n".into();
        let err = render(&crds::all(), &s, "1.0.0").unwrap_err().to_string();
        assert!(err.contains("deployment.yaml"), "{err}");
    }
}
