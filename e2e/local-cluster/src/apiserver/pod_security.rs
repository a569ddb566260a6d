//! Pod Security admission, as a real API server enforces it on Pod CREATE: a namespace
//! labelled `pod-security.kubernetes.io/enforce: baseline|restricted` refuses pods that
//! violate the level, with Kubernetes' own message listing every violation. Only pods are
//! checked (a real server merely warns about Deployments' templates, and this one does not
//! warn). The checks are those of the Pod Security Standards (`latest`); an unknown level
//! value counts as `restricted`, as the real plugin fails closed.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, SecurityContext};
use serde_json::Value;

use super::ServerState;
use super::error::ApiError;
use super::meta;

pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    fn from_label(value: &str) -> Self {
        match value {
            "privileged" => Self::Privileged,
            "baseline" => Self::Baseline,
            _ => Self::Restricted,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Privileged => "privileged",
            Self::Baseline => "baseline",
            Self::Restricted => "restricted",
        }
    }
}

/// Refuses `obj` (a Pod about to be created in `ns`, after mutating admission) when it
/// violates the namespace's enforced level.
pub fn check(state: &Arc<ServerState>, ns: &str, obj: &Value) -> Result<(), ApiError> {
    let registry = state.store.registry();
    let level = registry
        .find("", "v1", "namespaces")
        .and_then(|info| state.store.get(info, "", ns).ok())
        .and_then(|n| {
            meta::labels(&n)?
                .get(ENFORCE_LABEL)?
                .as_str()
                .map(Level::from_label)
        });
    let Some(level) = level else {
        return Ok(());
    };
    // A pod that does not even parse is the store's to refuse, with its own message.
    let Ok(pod) = serde_json::from_value::<Pod>(obj.clone()) else {
        return Ok(());
    };
    let found = violations(&pod, level);
    if found.is_empty() {
        return Ok(());
    }
    let name = pod
        .metadata
        .name
        .clone()
        .or(pod.metadata.generate_name.clone())
        .unwrap_or_default();
    Err(ApiError::forbidden(format!(
        "pods {name:?} is forbidden: violates PodSecurity \"{}:latest\": {}",
        level.as_str(),
        found.join(", ")
    )))
}

/// `"a"` or `"a", "b"`, as the real messages quote names.
fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `container "a"` / `containers "a", "b"`.
fn containers_phrase(names: &[&str]) -> String {
    let noun = if names.len() == 1 {
        "container"
    } else {
        "containers"
    };
    format!("{noun} {}", quoted(names))
}

/// Capabilities `baseline` lets a container add (the container runtime's defaults).
const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Volume types `restricted` allows.
const RESTRICTED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Every violation of `level`, each `reason (detail)`, in the order of the checks' ids as
/// the real plugin reports them.
pub fn violations(pod: &Pod, level: Level) -> Vec<String> {
    if level == Level::Privileged {
        return Vec::new();
    }
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let default_psc = PodSecurityContext::default();
    let psc = spec.security_context.as_ref().unwrap_or(&default_psc);
    let default_sc = SecurityContext::default();
    let all: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .collect();
    let sc = |c: &Container| -> SecurityContext {
        c.security_context.clone().unwrap_or(default_sc.clone())
    };
    let names_where = |f: &dyn Fn(&Container, &SecurityContext) -> bool| -> Vec<&str> {
        all.iter()
            .filter(|c| f(c, &sc(c)))
            .map(|c| c.name.as_str())
            .collect()
    };
    let restricted = level == Level::Restricted;
    let mut out = Vec::new();

    // allowPrivilegeEscalation (restricted)
    if restricted {
        let bad = names_where(&|_, s| s.allow_privilege_escalation != Some(false));
        if !bad.is_empty() {
            out.push(format!(
                "allowPrivilegeEscalation != false ({} must set securityContext.allowPrivilegeEscalation=false)",
                containers_phrase(&bad)
            ));
        }
    }

    // capabilities_baseline / capabilities_restricted
    let mut details = Vec::new();
    if restricted {
        let no_drop = names_where(&|_, s| {
            !s.capabilities
                .as_ref()
                .and_then(|c| c.drop.as_ref())
                .is_some_and(|d| d.iter().any(|x| x == "ALL"))
        });
        if !no_drop.is_empty() {
            details.push(format!(
                "{} must set securityContext.capabilities.drop=[\"ALL\"]",
                containers_phrase(&no_drop)
            ));
        }
    }
    for c in &all {
        let context = sc(c);
        let added: Vec<&str> = context
            .capabilities
            .as_ref()
            .and_then(|caps| caps.add.as_ref())
            .into_iter()
            .flatten()
            .map(String::as_str)
            .filter(|cap| {
                if restricted {
                    *cap != "NET_BIND_SERVICE"
                } else {
                    !BASELINE_CAPABILITIES.contains(cap)
                }
            })
            .collect();
        if !added.is_empty() {
            details.push(format!(
                "container {:?} must not include {} in securityContext.capabilities.add",
                c.name,
                quoted(&added)
            ));
        }
    }
    if !details.is_empty() {
        let reason = if restricted {
            "unrestricted capabilities"
        } else {
            "non-default capabilities"
        };
        out.push(format!("{reason} ({})", details.join("; ")));
    }

    // hostNamespaces
    let hosts: Vec<&str> = [
        ("hostNetwork=true", spec.host_network),
        ("hostPID=true", spec.host_pid),
        ("hostIPC=true", spec.host_ipc),
    ]
    .into_iter()
    .filter(|(_, on)| *on == Some(true))
    .map(|(what, _)| what)
    .collect();
    if !hosts.is_empty() {
        out.push(format!("host namespaces ({})", hosts.join(", ")));
    }

    // hostPathVolumes (baseline; restricted reports it as a restricted volume type)
    let volumes = spec.volumes.iter().flatten();
    if !restricted {
        let host_path: Vec<&str> = volumes
            .clone()
            .filter(|v| v.host_path.is_some())
            .map(|v| v.name.as_str())
            .collect();
        if !host_path.is_empty() {
            let noun = if host_path.len() == 1 {
                "volume"
            } else {
                "volumes"
            };
            out.push(format!("hostPath volumes ({noun} {})", quoted(&host_path)));
        }
    }

    // hostPorts
    let mut ports = Vec::new();
    for c in &all {
        let used: Vec<String> = c
            .ports
            .iter()
            .flatten()
            .filter_map(|p| p.host_port.filter(|h| *h != 0))
            .map(|h| h.to_string())
            .collect();
        if !used.is_empty() {
            let noun = if used.len() == 1 {
                "hostPort"
            } else {
                "hostPorts"
            };
            ports.push(format!(
                "container {:?} uses {noun} {}",
                c.name,
                used.join(", ")
            ));
        }
    }
    if !ports.is_empty() {
        out.push(format!("hostPort ({})", ports.join("; ")));
    }

    // privileged
    let privileged = names_where(&|_, s| s.privileged == Some(true));
    if !privileged.is_empty() {
        out.push(format!(
            "privileged ({} must not set securityContext.privileged=true)",
            containers_phrase(&privileged)
        ));
    }

    // restrictedVolumes
    if restricted {
        let mut bad = Vec::new();
        for v in volumes {
            let Ok(Value::Object(fields)) = serde_json::to_value(v) else {
                continue;
            };
            if let Some(kind) = fields
                .keys()
                .find(|k| *k != "name" && !RESTRICTED_VOLUMES.contains(&k.as_str()))
            {
                bad.push(format!(
                    "volume {:?} uses restricted volume type {kind:?}",
                    v.name
                ));
            }
        }
        if !bad.is_empty() {
            out.push(format!("restricted volume types ({})", bad.join("; ")));
        }
    }

    // runAsNonRoot (restricted)
    if restricted {
        if psc.run_as_non_root == Some(false) {
            out.push(
                "runAsNonRoot != true (pod must not set securityContext.runAsNonRoot=false)".into(),
            );
        } else {
            let explicit_false = names_where(&|_, s| s.run_as_non_root == Some(false));
            let unset = names_where(&|_, s| s.run_as_non_root.is_none());
            let mut details = Vec::new();
            if !explicit_false.is_empty() {
                details.push(format!(
                    "{} must not set securityContext.runAsNonRoot=false",
                    containers_phrase(&explicit_false)
                ));
            }
            if psc.run_as_non_root.is_none() && !unset.is_empty() {
                details.push(format!(
                    "pod or {} must set securityContext.runAsNonRoot=true",
                    containers_phrase(&unset)
                ));
            }
            if !details.is_empty() {
                out.push(format!("runAsNonRoot != true ({})", details.join("; ")));
            }
        }
    }

    // runAsUser (restricted)
    if restricted {
        let mut details = Vec::new();
        if psc.run_as_user == Some(0) {
            details.push("pod must not set runAsUser=0".to_owned());
        }
        let root = names_where(&|_, s| s.run_as_user == Some(0));
        if !root.is_empty() {
            details.push(format!(
                "{} must not set runAsUser=0",
                containers_phrase(&root)
            ));
        }
        if !details.is_empty() {
            out.push(format!("runAsUser=0 ({})", details.join("; ")));
        }
    }

    // seccompProfile_baseline / seccompProfile_restricted
    let type_of = |p: &Option<k8s_openapi::api::core::v1::SeccompProfile>| {
        p.as_ref().map(|p| p.type_.clone())
    };
    let pod_type = type_of(&psc.seccomp_profile);
    let mut details = Vec::new();
    if pod_type.as_deref() == Some("Unconfined") {
        details.push(
            "pod must not set securityContext.seccompProfile.type to \"Unconfined\"".to_owned(),
        );
    }
    let unconfined =
        names_where(&|_, s| type_of(&s.seccomp_profile).as_deref() == Some("Unconfined"));
    if !unconfined.is_empty() {
        details.push(format!(
            "{} must not set securityContext.seccompProfile.type to \"Unconfined\"",
            containers_phrase(&unconfined)
        ));
    }
    if restricted && pod_type.is_none() {
        let unset = names_where(&|_, s| s.seccomp_profile.is_none());
        if !unset.is_empty() {
            details.push(format!(
                "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
                containers_phrase(&unset)
            ));
        }
    }
    if !details.is_empty() {
        out.push(format!("seccompProfile ({})", details.join("; ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn restricted_sc() -> Value {
        json!({
            "runAsNonRoot": true, "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
        })
    }

    #[test]
    fn a_bare_pod_violates_restricted_with_kubernetes_words() {
        let p = pod(json!({"containers": [{"name": "app", "image": "x"}]}));
        assert_eq!(
            violations(&p, Level::Restricted),
            [
                r#"allowPrivilegeEscalation != false (container "app" must set securityContext.allowPrivilegeEscalation=false)"#,
                r#"unrestricted capabilities (container "app" must set securityContext.capabilities.drop=["ALL"])"#,
                r#"runAsNonRoot != true (pod or container "app" must set securityContext.runAsNonRoot=true)"#,
                r#"seccompProfile (pod or container "app" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")"#,
            ]
        );
        assert!(violations(&p, Level::Baseline).is_empty());
        assert!(violations(&p, Level::Privileged).is_empty());
    }

    #[test]
    fn a_restricted_pod_passes_and_pod_level_settings_count() {
        let p = pod(
            json!({"containers": [{"name": "app", "image": "x", "securityContext": restricted_sc()}]}),
        );
        assert!(violations(&p, Level::Restricted).is_empty());
        let p = pod(json!({
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "app", "image": "x", "securityContext": {
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}],
            "volumes": [{"name": "c", "configMap": {"name": "c"}}, {"name": "s", "secret": {"secretName": "s"}}],
        }));
        assert!(violations(&p, Level::Restricted).is_empty());
    }

    #[test]
    fn every_restricted_and_baseline_check_names_its_container() {
        let mut sc = restricted_sc();
        sc["runAsUser"] = json!(0);
        sc["privileged"] = json!(true);
        sc["capabilities"]["add"] = json!(["SYS_ADMIN"]);
        let p = pod(json!({
            "hostNetwork": true,
            "containers": [
                {"name": "a", "image": "x", "securityContext": sc, "ports": [{"containerPort": 80, "hostPort": 8080}]},
                {"name": "b", "image": "x"},
            ],
            "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
        }));
        let v = violations(&p, Level::Restricted);
        assert_eq!(
            v,
            [
                r#"allowPrivilegeEscalation != false (container "b" must set securityContext.allowPrivilegeEscalation=false)"#,
                r#"unrestricted capabilities (container "b" must set securityContext.capabilities.drop=["ALL"]; container "a" must not include "SYS_ADMIN" in securityContext.capabilities.add)"#,
                "host namespaces (hostNetwork=true)",
                r#"hostPort (container "a" uses hostPort 8080)"#,
                r#"privileged (container "a" must not set securityContext.privileged=true)"#,
                r#"restricted volume types (volume "h" uses restricted volume type "hostPath")"#,
                r#"runAsNonRoot != true (pod or container "b" must set securityContext.runAsNonRoot=true)"#,
                r#"runAsUser=0 (container "a" must not set runAsUser=0)"#,
                r#"seccompProfile (pod or container "b" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")"#,
            ]
        );
        let b = violations(&p, Level::Baseline);
        assert_eq!(
            b,
            [
                r#"non-default capabilities (container "a" must not include "SYS_ADMIN" in securityContext.capabilities.add)"#,
                "host namespaces (hostNetwork=true)",
                r#"hostPath volumes (volume "h")"#,
                r#"hostPort (container "a" uses hostPort 8080)"#,
                r#"privileged (container "a" must not set securityContext.privileged=true)"#,
            ]
        );
    }

    #[test]
    fn sidecars_are_checked_like_every_other_container() {
        let p = pod(json!({
            "initContainers": [{"name": "proxy", "image": "x", "restartPolicy": "Always",
                "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}}}],
            "containers": [{"name": "app", "image": "x", "securityContext": restricted_sc()}],
        }));
        assert_eq!(
            violations(&p, Level::Restricted),
            [
                r#"allowPrivilegeEscalation != false (container "proxy" must set securityContext.allowPrivilegeEscalation=false)"#,
                r#"unrestricted capabilities (container "proxy" must set securityContext.capabilities.drop=["ALL"])"#,
            ]
        );
    }

    #[test]
    fn unknown_levels_fail_closed() {
        assert_eq!(Level::from_label("strict"), Level::Restricted);
        assert_eq!(Level::from_label("baseline"), Level::Baseline);
    }
}
