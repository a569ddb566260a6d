//! Which resources the server serves: the built-in kinds marin3r uses and every version of
//! every CustomResourceDefinition, with what discovery and table output need to know of them.

use std::collections::BTreeMap;

use serde_json::Value;

/// A printer column (`additionalPrinterColumns` of a CRD, or a built-in default).
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub json_path: String,
    pub priority: i64,
}

/// One served resource at one version.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceInfo {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Whether `/status` is a separate subresource (writes to one ignore the other).
    pub status: bool,
    pub columns: Vec<PrinterColumn>,
    /// The version's `openAPIV3Schema` (custom resources only): what the server prunes,
    /// defaults and validates objects with.
    pub schema: Option<std::sync::Arc<Value>>,
}

impl ResourceInfo {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group` as error messages name a resource (`pods` for the core group).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `Kind.group` as Invalid errors name a kind (`Pod` for the core group).
    pub fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    /// The storage key of the resource: every version of a group/resource shares objects,
    /// and events.k8s.io Events are core Events (see `events`).
    pub fn group_resource(&self) -> (String, String) {
        if super::events::is_events_v1(self) {
            return (String::new(), "events".into());
        }
        (self.group.clone(), self.plural.clone())
    }
}

fn builtin(
    group: &str,
    version: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    status: bool,
    short_names: &[&str],
) -> ResourceInfo {
    ResourceInfo {
        group: group.into(),
        version: version.into(),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        kind: kind.into(),
        namespaced,
        short_names: short_names.iter().map(|s| (*s).to_owned()).collect(),
        categories: Vec::new(),
        status,
        columns: Vec::new(),
        schema: None,
    }
}

fn column(name: &str, type_: &str, json_path: &str) -> PrinterColumn {
    PrinterColumn {
        name: name.into(),
        type_: type_.into(),
        format: String::new(),
        description: String::new(),
        json_path: json_path.into(),
        priority: 0,
    }
}

/// The built-in resources, in discovery order.
pub fn builtins() -> Vec<ResourceInfo> {
    let mut pods = builtin("", "v1", "pods", "Pod", true, true, &["po"]);
    // `#...` paths are computed cells (see `table::computed`), as kubectl's own printers do.
    let mut ip = column("IP", "string", ".status.podIP");
    ip.priority = 1;
    pods.columns = vec![
        column("Ready", "string", "#podReady"),
        column("Status", "string", "#podStatus"),
        column("Restarts", "integer", "#podRestarts"),
        ip,
    ];
    let mut deployments = builtin(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        true,
        true,
        &["deploy"],
    );
    deployments.columns = vec![
        column("Ready", "string", "#deploymentReady"),
        column("Up-to-date", "integer", ".status.updatedReplicas"),
        column("Available", "integer", ".status.availableReplicas"),
    ];
    let mut namespaces = builtin("", "v1", "namespaces", "Namespace", false, true, &["ns"]);
    namespaces.columns = vec![column("Status", "string", ".status.phase")];
    for r in [&mut pods, &mut deployments] {
        r.categories = vec!["all".into()];
    }
    let mut services = builtin("", "v1", "services", "Service", true, true, &["svc"]);
    services.categories = vec!["all".into()];
    let rbac = "rbac.authorization.k8s.io";
    vec![
        namespaces,
        pods,
        builtin("", "v1", "secrets", "Secret", true, false, &[]),
        builtin("", "v1", "configmaps", "ConfigMap", true, false, &["cm"]),
        services,
        builtin(
            "",
            "v1",
            "serviceaccounts",
            "ServiceAccount",
            true,
            false,
            &["sa"],
        ),
        builtin("", "v1", "events", "Event", true, false, &["ev"]),
        builtin(
            "events.k8s.io",
            "v1",
            "events",
            "Event",
            true,
            false,
            &["ev"],
        ),
        deployments,
        builtin(rbac, "v1", "roles", "Role", true, false, &[]),
        builtin(rbac, "v1", "rolebindings", "RoleBinding", true, false, &[]),
        builtin(rbac, "v1", "clusterroles", "ClusterRole", false, false, &[]),
        builtin(
            rbac,
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
            false,
            &[],
        ),
        builtin(
            "autoscaling",
            "v2",
            "horizontalpodautoscalers",
            "HorizontalPodAutoscaler",
            true,
            true,
            &["hpa"],
        ),
        builtin(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            true,
            true,
            &["pdb"],
        ),
        builtin(
            "discovery.k8s.io",
            "v1",
            "endpointslices",
            "EndpointSlice",
            true,
            false,
            &[],
        ),
        builtin(
            "scheduling.k8s.io",
            "v1",
            "priorityclasses",
            "PriorityClass",
            false,
            false,
            &["pc"],
        ),
        builtin(
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            true,
            false,
            &[],
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            false,
            false,
            &[],
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            false,
            false,
            &[],
        ),
        builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            true,
            &["crd", "crds"],
        ),
    ]
}

/// The resources a CRD serves, one per served version; an error names what is missing.
pub fn from_crd(crd: &Value) -> Result<Vec<ResourceInfo>, String> {
    let spec = crd.get("spec").ok_or("spec: Required value")?;
    let text = |v: Option<&Value>, what: &str| -> Result<String, String> {
        v.and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| format!("{what}: Required value"))
    };
    let group = text(spec.get("group"), "spec.group")?;
    let names = spec.get("names").ok_or("spec.names: Required value")?;
    let plural = text(names.get("plural"), "spec.names.plural")?;
    let kind = text(names.get("kind"), "spec.names.kind")?;
    let singular = names
        .get("singular")
        .and_then(Value::as_str)
        .map_or_else(|| kind.to_lowercase(), str::to_owned);
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let namespaced = match spec.get("scope").and_then(Value::as_str) {
        Some("Namespaced") => true,
        Some("Cluster") => false,
        other => {
            return Err(format!(
                "spec.scope: Unsupported value: {other:?}: supported values: \"Cluster\", \"Namespaced\""
            ));
        }
    };
    let expected_name = format!("{plural}.{group}");
    let name = crd
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if name != expected_name {
        return Err(format!(
            "metadata.name: Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"
        ));
    }
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .filter(|v| !v.is_empty())
        .ok_or(
            "spec.versions: Invalid value: must have exactly one version marked as storage version",
        )?;
    let mut out = Vec::new();
    for v in versions {
        let version = text(v.get("name"), "spec.versions[].name")?;
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let columns = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|cols| {
                cols.iter()
                    .map(|c| PrinterColumn {
                        name: c.get("name").and_then(Value::as_str).unwrap_or("").into(),
                        type_: c
                            .get("type")
                            .and_then(Value::as_str)
                            .unwrap_or("string")
                            .into(),
                        format: c.get("format").and_then(Value::as_str).unwrap_or("").into(),
                        description: c
                            .get("description")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .into(),
                        json_path: c
                            .get("jsonPath")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .into(),
                        priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                    })
                    .collect::<Vec<_>>()
            })
            .filter(|cols| !cols.is_empty())
            // kube-apiserver's default for a version that declares none: Age alone. One
            // that declares some gets those only, so a CRD wanting Age says so.
            .unwrap_or_else(|| {
                vec![PrinterColumn {
                    description: "CreationTimestamp is a timestamp representing the server \
                                  time when this object was created."
                        .into(),
                    ..column("Age", "date", ".metadata.creationTimestamp")
                }]
            });
        out.push(ResourceInfo {
            group: group.clone(),
            version,
            plural: plural.clone(),
            singular: singular.clone(),
            kind: kind.clone(),
            namespaced,
            short_names: strings(names.get("shortNames")),
            categories: strings(names.get("categories")),
            status: v.pointer("/subresources/status").is_some(),
            columns,
            schema: v
                .pointer("/schema/openAPIV3Schema")
                .cloned()
                .map(std::sync::Arc::new),
        });
    }
    Ok(out)
}

/// The served resources: built-ins plus those of established CRDs (keyed by CRD name).
#[derive(Debug, Clone)]
pub struct Registry {
    builtins: Vec<ResourceInfo>,
    crds: BTreeMap<String, Vec<ResourceInfo>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            builtins: builtins(),
            crds: BTreeMap::new(),
        }
    }
}

impl Registry {
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceInfo> {
        self.all()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    pub fn all(&self) -> impl Iterator<Item = &ResourceInfo> {
        self.builtins.iter().chain(self.crds.values().flatten())
    }

    pub fn set_crd(&mut self, name: &str, resources: Vec<ResourceInfo>) {
        self.crds.insert(name.to_owned(), resources);
    }

    pub fn remove_crd(&mut self, name: &str) {
        self.crds.remove(name);
    }

    /// Whether another CRD already serves this group/plural (two CRDs cannot share one).
    pub fn crd_owner(&self, group: &str, plural: &str) -> Option<&str> {
        self.crds
            .iter()
            .find(|(_, rs)| rs.iter().any(|r| r.group == group && r.plural == plural))
            .map(|(name, _)| name.as_str())
    }

    /// Groups in discovery order, each with its versions (preferred first).
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for r in self.all() {
            match groups.iter_mut().find(|(g, _)| *g == r.group) {
                Some((_, versions)) => {
                    if !versions.contains(&r.version) {
                        versions.push(r.version.clone());
                    }
                }
                None => groups.push((r.group.clone(), vec![r.version.clone()])),
            }
        }
        groups
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// kube-apiserver's columns for a custom resource: those its version declares, or Age
    /// alone when it declares none.
    #[test]
    fn a_crd_version_without_printer_columns_gets_age_alone() {
        let crd = |columns: serde_json::Value| {
            json!({
                "metadata": {"name": "gadgets.test.marin3r.io"},
                "spec": {
                    "group": "test.marin3r.io",
                    "scope": "Namespaced",
                    "names": {"plural": "gadgets", "kind": "Gadget"},
                    "versions": [{"name": "v1", "served": true, "storage": true,
                        "additionalPrinterColumns": columns}],
                },
            })
        };
        let names = |c: serde_json::Value| -> Vec<String> {
            super::from_crd(&crd(c)).unwrap()[0]
                .columns
                .iter()
                .map(|c| format!("{} {}", c.name, c.json_path))
                .collect()
        };
        assert_eq!(names(json!([])), ["Age .metadata.creationTimestamp"]);
        assert_eq!(names(json!(null)), ["Age .metadata.creationTimestamp"]);
        assert_eq!(
            names(json!([{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}])),
            ["Size .spec.size"]
        );
    }
}
