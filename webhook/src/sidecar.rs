//! The Envoy sidecar a [`SidecarSpec`] describes: its container (command line, downward-API
//! environment, ports, resources, probes, mounts) and the two volumes it mounts.
//!
//! How the admin settings reach Envoy: the bootstrap ConfigMap is shared by every pod of a
//! namespace, so per-pod settings cannot live in it. The sidecar passes one `--config-yaml`
//! that Envoy merges over the bootstrap file: `node.metadata` (`pod_name`, `pod_namespace`,
//! from the downward API through Kubernetes' `$(VAR)` expansion) and `admin` (address from
//! `admin.bind-address`/`admin.port`, plus a file access log when `admin.access-log-path` is
//! set). The bootstrap renderer should therefore leave `admin` out (or expect it overridden).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, Probe, ResourceRequirements, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

use crate::annotations::SidecarSpec;
use crate::config::{
    BOOTSTRAP_FILE, BOOTSTRAP_MOUNT_PATH, CLIENT_CERT_MOUNT_PATH, InjectionConfig,
};

/// The downward-API variables the sidecar gets, named in its `--config-yaml` node metadata.
pub const POD_NAME_ENV: &str = "POD_NAME";
pub const POD_NAMESPACE_ENV: &str = "POD_NAMESPACE";
/// The node-metadata keys the xDS server reads to name the pod behind a proxy.
pub const METADATA_POD_NAME: &str = "pod_name";
pub const METADATA_POD_NAMESPACE: &str = "pod_namespace";
/// The admin path both probes use.
pub const READY_PATH: &str = "/ready";

/// The sidecar's args exactly as they go into the container spec: `$(POD_NAME)` and
/// `$(POD_NAMESPACE)` are still unexpanded (kubelet expands them; see [`expand_env`]).
pub fn sidecar_args(spec: &SidecarSpec) -> Vec<String> {
    let mut args = vec![
        "-c".to_owned(),
        format!("{BOOTSTRAP_MOUNT_PATH}/{BOOTSTRAP_FILE}"),
        "--service-node".to_owned(),
        spec.node_id.clone(),
        "--service-cluster".to_owned(),
        spec.cluster_id.clone(),
        "--config-yaml".to_owned(),
        config_yaml(spec),
    ];
    args.extend(spec.extra_args.iter().cloned());
    args
}

/// The `--config-yaml` overlay: node metadata and the admin interface (JSON is YAML).
fn config_yaml(spec: &SidecarSpec) -> String {
    let mut admin = json!({
        "address": {
            "socket_address": {
                "address": spec.admin.bind_address.to_string(),
                "port_value": spec.admin.port,
            }
        }
    });
    if let Some(path) = &spec.admin.access_log_path {
        admin["access_log"] = json!([{
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                // `$$` keeps kubelet from expanding a `$(...)` the user meant literally.
                "path": path.replace('$', "$$"),
            }
        }]);
    }
    json!({
        "node": {
            "metadata": {
                METADATA_POD_NAME: format!("$({POD_NAME_ENV})"),
                METADATA_POD_NAMESPACE: format!("$({POD_NAMESPACE_ENV})"),
            }
        },
        "admin": admin,
    })
    .to_string()
}

/// Expands `$(VAR)` references in args the way kubelet does (`$$` is a literal `$`, unknown
/// variables stay as written), so a test can run the exact command line a pod would.
pub fn expand_env(args: &[String], env: &BTreeMap<String, String>) -> Vec<String> {
    args.iter().map(|arg| expand_one(arg, env)).collect()
}

fn expand_one(arg: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match env.get(name) {
                Some(value) => out.push_str(value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The sidecar container.
pub fn container(spec: &SidecarSpec) -> Container {
    let field_env = |name: &str, path: &str| EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".into()),
                field_path: path.to_owned(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let probe = |initial_delay: i32, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(READY_PATH.into()),
            port: IntOrString::Int(i32::from(spec.admin.port)),
            scheme: Some("HTTP".into()),
            ..Default::default()
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(period),
        timeout_seconds: Some(1),
        success_threshold: Some(1),
        failure_threshold: Some(failures),
        ..Default::default()
    };
    let ports: Vec<ContainerPort> = spec
        .ports
        .iter()
        .map(|p| ContainerPort {
            name: Some(p.name.clone()),
            container_port: i32::from(p.port),
            host_port: p.host_port.map(i32::from),
            protocol: Some(p.protocol.as_str().into()),
            ..Default::default()
        })
        .collect();
    Container {
        name: spec.container_name.clone(),
        image: Some(spec.envoy_image.clone()),
        command: Some(vec!["envoy".into()]),
        args: Some(sidecar_args(spec)),
        env: Some(vec![
            field_env(POD_NAME_ENV, "metadata.name"),
            field_env(POD_NAMESPACE_ENV, "metadata.namespace"),
        ]),
        ports: (!ports.is_empty()).then_some(ports),
        resources: resources(spec),
        // Ready once Envoy has its first configuration; a proxy that stays unready for
        // minutes (not merely waiting for xDS) is restarted.
        readiness_probe: Some(probe(0, 5, 3)),
        liveness_probe: Some(probe(30, 10, 10)),
        volume_mounts: Some(vec![
            VolumeMount {
                name: spec.config_volume.clone(),
                mount_path: BOOTSTRAP_MOUNT_PATH.into(),
                read_only: Some(true),
                ..Default::default()
            },
            VolumeMount {
                name: spec.tls_volume.clone(),
                mount_path: CLIENT_CERT_MOUNT_PATH.into(),
                read_only: Some(true),
                ..Default::default()
            },
        ]),
        ..Default::default()
    }
}

fn resources(spec: &SidecarSpec) -> Option<ResourceRequirements> {
    let r = &spec.resources;
    if r.is_empty() {
        return None;
    }
    let map = |cpu: &Option<String>, memory: &Option<String>| {
        let mut m = BTreeMap::new();
        if let Some(cpu) = cpu {
            m.insert("cpu".to_owned(), Quantity(cpu.clone()));
        }
        if let Some(memory) = memory {
            m.insert("memory".to_owned(), Quantity(memory.clone()));
        }
        (!m.is_empty()).then_some(m)
    };
    Some(ResourceRequirements {
        requests: map(&r.requests_cpu, &r.requests_memory),
        limits: map(&r.limits_cpu, &r.limits_memory),
        ..Default::default()
    })
}

/// The bootstrap ConfigMap volume and the client certificate Secret volume.
pub fn volumes(spec: &SidecarSpec, config: &InjectionConfig) -> Vec<Volume> {
    vec![
        Volume {
            name: spec.config_volume.clone(),
            config_map: Some(ConfigMapVolumeSource {
                name: config.bootstrap_config_map.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: spec.tls_volume.clone(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(spec.client_certificate.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("POD_NAME".to_owned(), "web-7d4b9".to_owned()),
            ("POD_NAMESPACE".to_owned(), "shop".to_owned()),
        ])
    }

    #[test]
    fn expansion_follows_kubelet_rules() {
        let cases = [
            ("$(POD_NAME)", "web-7d4b9"),
            ("a-$(POD_NAMESPACE)-b", "a-shop-b"),
            ("$$(POD_NAME)", "$(POD_NAME)"),
            ("$(UNKNOWN)", "$(UNKNOWN)"),
            ("$", "$"),
            ("$(", "$("),
            ("cost: $5", "cost: $5"),
            ("$$$(POD_NAME)", "$web-7d4b9"),
        ];
        for (input, want) in cases {
            assert_eq!(expand_one(input, &env()), want, "{input}");
        }
    }
}
