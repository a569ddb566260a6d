//! The `DiscoveryService` resource (`operator.marin3r.3scale.net/v1alpha1`): one discovery
//! service deployment, its PKI and the namespaces whose pods it injects and configures.
//! Field names are the original MARIN3R's (including its `pkiConfg` misspelling).

use std::time::Duration;

use k8s_openapi::api::apps::v1::DeploymentStatus;
use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_derive::CustomResource;
use marin3r_certs::names::{is_dns_label, is_dns_subdomain};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::duration::parse_go_duration;
use super::sidecar_defaults::SidecarDefaults;

pub const DEFAULT_XDS_PORT: u16 = 18000;
pub const DEFAULT_METRICS_PORT: u16 = 8383;
/// The discovery pod's health probes (`/healthz`, `/readyz`), the original's `probePort`.
pub const DEFAULT_PROBE_PORT: u16 = 8384;
/// The discovery pod's admin port (`/sync-status`), on the pod's loopback only: reached with
/// a pod port-forward (`marin3r proxy-status`), never through the Service. Not 8384, which
/// is the original's (and our) default `probePort`; no discovery service port may use it.
pub const DEFAULT_ADMIN_PORT: u16 = 8385;
pub const DEFAULT_WEBHOOK_PORT: u16 = 8443;
pub const DEFAULT_CA_DURATION: &str = "26280h";
pub const DEFAULT_SERVER_CERT_DURATION: &str = "2160h";
pub const DEFAULT_CLIENT_CERT_DURATION: &str = "168h";
/// The label a user puts on a namespace to enable it for a discovery service.
pub const DISCOVERY_SERVICE_LABEL: &str = "marin3r.3scale.net/discovery-service";
pub const STATUS_LABEL: &str = "marin3r.3scale.net/status";
/// The pod template label that rolls the discovery pod when its certificate changes.
pub const SERVER_CERT_HASH_LABEL: &str = "marin3r.3scale.net/server-certificate-hash";

/// A marin3r discovery service: the xDS server and injection webhook pod, its certificates,
/// and the namespaces it serves.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "operator.marin3r.3scale.net",
    version = "v1alpha1",
    kind = "DiscoveryService",
    namespaced,
    // `ds` is the DaemonSet's short name; `mds` (marin3r discovery service) is free.
    shortname = "mds",
    category = "marin3r",
    doc = "A marin3r discovery service: the operator runs its pod (xDS server over mutual TLS and the sidecar injection webhook), issues its CA, server and client certificates, and enables the namespaces it serves.",
    status = "DiscoveryServiceStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Deployment","type":"string","jsonPath":".status.deployment"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryServiceSpec {
    /// The marin3r image of the discovery pod (default: this operator's version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// How many discovery pods (default 1, at least 1). Every pod serves every namespace from
    /// the published revisions; one of them, elected on a Lease, runs the EnvoyConfig
    /// controller and writes taints from the NACK reports of all (see docs/install.md,
    /// "Availability").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Debug logging in the discovery pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debug: Option<bool>,
    /// Resources of the discovery pod's container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// The PKI: CA, server certificate and client certificate lifetimes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pki_config: Option<PkiConfig>,
    /// The original MARIN3R's spelling of `pkiConfig`; `pkiConfig` wins when both are set.
    #[serde(default, rename = "pkiConfg", skip_serializing_if = "Option::is_none")]
    pub pki_confg: Option<PkiConfig>,
    /// Port of the xDS server (gRPC over mutual TLS); default 18000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xds_server_port: Option<u16>,
    /// Port of the metrics endpoint (`/metrics`, also `/healthz` and `/readyz`); default 8383.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_port: Option<u16>,
    /// Port of the health endpoints `/healthz` and `/readyz` (plain HTTP), which the
    /// discovery pod's liveness and readiness probes use; default 8384.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_port: Option<u16>,
    /// Port of the webhook (HTTPS): sidecar injection and EnvoyConfig validation; default 8443.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_port: Option<u16>,
    /// Namespaces enabled for injection besides those labelled
    /// `marin3r.3scale.net/discovery-service=<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled_namespaces: Option<Vec<String>>,
    /// The Service in front of the discovery pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_config: Option<ServiceConfig>,
    /// The PriorityClass of the discovery pod (it must exist: the API server refuses pods
    /// naming a missing one). A high class keeps the discovery pod scheduled when a node is
    /// short of resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_priority_class: Option<String>,
    /// Defaults for the sidecars this discovery service's webhook injects (Envoy image,
    /// resources, image pull Secrets, native or classic layout); pod annotations win.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecar: Option<SidecarDefaults>,
    /// The discovery pods' affinity (the original's v0.13.3 field), used as given. Unset:
    /// a required node affinity to Linux nodes (`kubernetes.io/os In [linux]`), since the
    /// image is a Linux binary. The pods also spread over nodes and zones when the scheduler
    /// can (a preference, which never leaves a pod unscheduled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// How many proxies of one namespace may hold a connection and an ADS stream to each
    /// discovery pod at once (default 4096, at least 1): the pod's
    /// `--xds-max-connections-per-namespace` and `--xds-max-streams-per-namespace`. Raise it
    /// for a namespace of more sidecars and gateway pods than that; the next one is refused
    /// and retries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_proxies_per_namespace: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PkiConfig {
    /// The CA that signs the server and client certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_certificate_authority: Option<CertificateOptions>,
    /// The discovery pod's certificate (xDS and webhook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_certificate: Option<CertificateOptions>,
    /// Lifetime of the sidecars' client certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<ClientCertificateOptions>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificateOptions {
    /// The Secret the certificate is written to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// A Go duration such as `2160h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ClientCertificateOptions {
    /// A Go duration such as `168h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ServiceConfig {
    /// The Service's name (default `marin3r-<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `ClusterIP` (default), `LoadBalancer` or `Headless`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["ClusterIP", "LoadBalancer", "Headless"]))]
    pub type_: Option<String>,
}

/// The discovery service's readiness, Deployment and enabled namespaces.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryServiceStatus {
    /// `Ready`, with the reason when it is not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Namespaces currently enabled (listed or labelled).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub enabled_namespaces: Vec<String>,
    /// The discovery Deployment's ready and desired replicas, e.g. `1/1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// The name of the discovery Deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_name: Option<String>,
    /// The discovery Deployment's own status, as its controller last wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_status: Option<DeploymentStatus>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A `DiscoveryService` spec with every default applied and every field checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub image: String,
    pub replicas: i32,
    pub debug: bool,
    pub resources: Option<ResourceRequirements>,
    pub ca_secret: String,
    pub ca_duration: Duration,
    pub server_secret: String,
    pub server_duration: Duration,
    pub client_duration: Duration,
    pub xds_port: u16,
    pub metrics_port: u16,
    pub probe_port: u16,
    pub webhook_port: u16,
    pub enabled_namespaces: Vec<String>,
    pub service_name: String,
    pub service_type: String,
    pub pod_priority_class: Option<String>,
    /// The discovery pod's flags for `spec.sidecar`.
    pub sidecar_args: Vec<String>,
    pub affinity: Affinity,
    /// The discovery pod logs JSON (`--log-format json`). Not a spec field: the operator's
    /// own log format, so that one installation logs one way.
    pub json_logs: bool,
    /// `spec.maxProxiesPerNamespace`, when set.
    pub max_proxies_per_namespace: Option<u32>,
}

impl DiscoveryService {
    /// The name shared by the objects this resource owns: `marin3r-<name>`.
    pub fn owned_name(&self) -> String {
        format!(
            "marin3r-{}",
            self.metadata.name.as_deref().unwrap_or_default()
        )
    }

    /// Applies defaults and checks the spec; the error names the field.
    pub fn resolve(&self, default_image: &str) -> Result<Resolved, String> {
        let spec = &self.spec;
        let service = spec.service_config.clone().unwrap_or_default();
        let service_type = service.type_.unwrap_or_else(|| "ClusterIP".into());
        if !["ClusterIP", "LoadBalancer", "Headless"].contains(&service_type.as_str()) {
            return Err(format!(
                "spec.serviceConfig.type: {service_type:?} is not one of ClusterIP, LoadBalancer, Headless"
            ));
        }
        let enabled_namespaces = enabled_namespaces(spec)?;
        let replicas = replicas(spec.replicas)?;
        let pki = self.pki()?;
        let port = |field: &str, value: Option<u16>, default: u16| match value {
            Some(0) => Err(format!("spec.{field} must be between 1 and 65535")),
            other => Ok(other.unwrap_or(default)),
        };
        let resolved = Resolved {
            replicas,
            image: spec
                .image
                .clone()
                .unwrap_or_else(|| default_image.to_owned()),
            debug: spec.debug.unwrap_or(false),
            resources: spec.resources.clone(),
            ca_secret: pki.ca_secret,
            ca_duration: pki.ca_duration,
            server_secret: pki.server_secret,
            server_duration: pki.server_duration,
            client_duration: pki.client_duration,
            xds_port: port("xdsServerPort", spec.xds_server_port, DEFAULT_XDS_PORT)?,
            metrics_port: port("metricsPort", spec.metrics_port, DEFAULT_METRICS_PORT)?,
            probe_port: port("probePort", spec.probe_port, DEFAULT_PROBE_PORT)?,
            webhook_port: port("webhookPort", spec.webhook_port, DEFAULT_WEBHOOK_PORT)?,
            enabled_namespaces,
            service_name: service.name.unwrap_or_else(|| self.owned_name()),
            service_type,
            pod_priority_class: spec.pod_priority_class.clone(),
            sidecar_args: spec.sidecar.clone().unwrap_or_default().args()?,
            affinity: spec.affinity.clone().unwrap_or_else(default_affinity),
            json_logs: false,
            max_proxies_per_namespace: match spec.max_proxies_per_namespace {
                Some(0) => return Err("spec.maxProxiesPerNamespace must be at least 1".into()),
                other => other,
            },
        };
        resolved.check_names()?;
        resolved.check_ports()?;
        Ok(resolved)
    }

    /// The CA and server certificate Secrets and every certificate's lifetime.
    fn pki(&self) -> Result<ResolvedPki, String> {
        let spec = &self.spec;
        let name = self.metadata.name.as_deref().unwrap_or_default();
        let pki = spec
            .pki_config
            .clone()
            .or_else(|| spec.pki_confg.clone())
            .unwrap_or_default();
        let duration = |field: &str, value: Option<&str>, default: &str| {
            let d = parse_go_duration(value.unwrap_or(default))
                .map_err(|e| format!("spec.pkiConfig.{field}.duration: {e}"))?;
            if d < Duration::from_secs(1) {
                return Err(format!(
                    "spec.pkiConfig.{field}.duration must be at least 1s"
                ));
            }
            Ok(d)
        };
        let ca = pki.root_certificate_authority.unwrap_or_default();
        let server = pki.server_certificate.unwrap_or_default();
        let client = pki.client_certificate.unwrap_or_default();
        Ok(ResolvedPki {
            ca_secret: ca
                .secret_name
                .unwrap_or_else(|| format!("marin3r-ca-cert-{name}")),
            ca_duration: duration(
                "rootCertificateAuthority",
                ca.duration.as_deref(),
                DEFAULT_CA_DURATION,
            )?,
            server_secret: server
                .secret_name
                .unwrap_or_else(|| format!("marin3r-server-cert-{name}")),
            server_duration: duration(
                "serverCertificate",
                server.duration.as_deref(),
                DEFAULT_SERVER_CERT_DURATION,
            )?,
            client_duration: duration(
                "clientCertificate",
                client.duration.as_deref(),
                DEFAULT_CLIENT_CERT_DURATION,
            )?,
        })
    }
}

/// The PKI part of [`Resolved`].
struct ResolvedPki {
    ca_secret: String,
    ca_duration: Duration,
    server_secret: String,
    server_duration: Duration,
    client_duration: Duration,
}

/// `spec.enabledNamespaces`, checked, sorted and without duplicates.
fn enabled_namespaces(spec: &DiscoveryServiceSpec) -> Result<Vec<String>, String> {
    let mut enabled = spec.enabled_namespaces.clone().unwrap_or_default();
    for (i, ns) in enabled.iter().enumerate() {
        if !is_dns_label(ns) {
            return Err(format!(
                "spec.enabledNamespaces[{i}]: {ns:?} is not a namespace name"
            ));
        }
    }
    enabled.sort();
    enabled.dedup();
    Ok(enabled)
}

/// The affinity of a discovery service that sets none: Linux nodes only. Unlike the
/// original, no `kubernetes.io/arch` term: the image is built for whatever architectures its
/// builder chose, and a multi-arch image runs on all of them.
fn default_affinity() -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: "kubernetes.io/os".into(),
                        operator: "In".into(),
                        values: Some(vec!["linux".into()]),
                    }]),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn replicas(replicas: Option<i32>) -> Result<i32, String> {
    match replicas {
        None => Ok(1),
        Some(n) if n >= 1 => Ok(n),
        Some(n) => Err(format!(
            "spec.replicas: {n} is not supported: at least one discovery pod serves the \
             proxies and the injection webhook"
        )),
    }
}

impl Resolved {
    /// The names the spec gives other objects are names the API server accepts.
    fn check_names(&self) -> Result<(), String> {
        if let Some(class) = &self.pod_priority_class
            && !is_dns_subdomain(class)
        {
            return Err(format!(
                "spec.podPriorityClass: {class:?} is not a PriorityClass name (lowercase letters, \
                 digits, '-' and '.', at most 253)"
            ));
        }
        for (field, name) in [
            (
                "spec.pkiConfig.rootCertificateAuthority.secretName",
                &self.ca_secret,
            ),
            (
                "spec.pkiConfig.serverCertificate.secretName",
                &self.server_secret,
            ),
        ] {
            if !is_dns_subdomain(name) {
                return Err(format!("{field}: {name:?} is not a valid Secret name"));
            }
        }
        if !is_dns_label(&self.service_name) {
            return Err(format!(
                "spec.serviceConfig.name: {:?} is not a valid Service name",
                self.service_name
            ));
        }
        Ok(())
    }

    /// The discovery pod's ports differ from each other and from its admin port.
    fn check_ports(&self) -> Result<(), String> {
        let ports = [
            ("spec.xdsServerPort", self.xds_port),
            ("spec.metricsPort", self.metrics_port),
            ("spec.probePort", self.probe_port),
            ("spec.webhookPort", self.webhook_port),
        ];
        for (i, (field, port)) in ports.iter().enumerate() {
            if let Some((other, _)) = ports[..i].iter().find(|(_, p)| p == port) {
                return Err(format!(
                    "{other} and {field} are both {port}; the discovery pod's ports must differ"
                ));
            }
            if *port == DEFAULT_ADMIN_PORT {
                return Err(format!(
                    "{field}: {port} is the discovery pod's loopback admin port (/sync-status); \
                     choose another"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(spec: serde_json::Value) -> DiscoveryService {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
            "kind": "DiscoveryService",
            "metadata": {"name": "instance", "namespace": "default"},
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn defaults_match_the_original() {
        let r = ds(serde_json::json!({})).resolve("marin3r:test").unwrap();
        assert_eq!(r.image, "marin3r:test");
        assert_eq!(r.ca_secret, "marin3r-ca-cert-instance");
        assert_eq!(r.server_secret, "marin3r-server-cert-instance");
        assert_eq!(r.ca_duration, Duration::from_secs(26280 * 3600));
        assert_eq!(r.server_duration, Duration::from_secs(2160 * 3600));
        assert_eq!(r.client_duration, Duration::from_secs(168 * 3600));
        assert_eq!(
            (r.xds_port, r.metrics_port, r.probe_port, r.webhook_port),
            (18000, 8383, 8384, 8443)
        );
        assert_eq!(r.service_name, "marin3r-instance");
        assert_eq!(r.service_type, "ClusterIP");
        assert!(r.enabled_namespaces.is_empty());
        assert_eq!(r.affinity, default_affinity());
    }

    #[test]
    fn a_given_affinity_replaces_the_default_whole() {
        let affinity = serde_json::json!({"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app": "marin3r"}},
            }],
        }});
        let r = ds(serde_json::json!({"affinity": affinity.clone()}))
            .resolve("i")
            .unwrap();
        assert_eq!(serde_json::to_value(&r.affinity).unwrap(), affinity);
    }

    #[test]
    fn the_original_misspelling_is_accepted_and_the_right_spelling_wins() {
        let pki = |secret: &str| serde_json::json!({"serverCertificate": {"secretName": secret, "duration": "10m"}});
        let r = ds(serde_json::json!({"pkiConfg": pki("old")}))
            .resolve("i")
            .unwrap();
        assert_eq!(r.server_secret, "old");
        assert_eq!(r.server_duration, Duration::from_secs(600));
        let r = ds(serde_json::json!({"pkiConfg": pki("old"), "pkiConfig": pki("new")}))
            .resolve("i")
            .unwrap();
        assert_eq!(r.server_secret, "new");
    }

    #[test]
    fn bad_fields_are_named() {
        for (spec, want) in [
            (
                serde_json::json!({"pkiConfig": {"serverCertificate": {"duration": "3d"}}}),
                "spec.pkiConfig.serverCertificate.duration",
            ),
            (
                serde_json::json!({"pkiConfig": {"clientCertificate": {"duration": "0"}}}),
                "at least 1s",
            ),
            (
                serde_json::json!({"xdsServerPort": 0}),
                "spec.xdsServerPort",
            ),
            (
                serde_json::json!({"metricsPort": 18000}),
                "spec.xdsServerPort and spec.metricsPort are both 18000",
            ),
            (
                serde_json::json!({"probePort": 8443}),
                "spec.probePort and spec.webhookPort are both 8443",
            ),
            (
                serde_json::json!({"metricsPort": 8384}),
                "spec.metricsPort and spec.probePort are both 8384",
            ),
            (
                serde_json::json!({"probePort": 8385}),
                "spec.probePort: 8385 is the discovery pod's loopback admin port",
            ),
            (serde_json::json!({"probePort": 0}), "spec.probePort"),
            (
                serde_json::json!({"enabledNamespaces": ["ok", "Not_OK"]}),
                "spec.enabledNamespaces[1]",
            ),
            (
                serde_json::json!({"serviceConfig": {"type": "NodePort"}}),
                "spec.serviceConfig.type",
            ),
            (
                serde_json::json!({"serviceConfig": {"name": "a.b"}}),
                "spec.serviceConfig.name",
            ),
            (
                serde_json::json!({"pkiConfig": {"rootCertificateAuthority": {"secretName": "UPPER"}}}),
                "secretName",
            ),
        ] {
            let err = ds(spec.clone()).resolve("i").unwrap_err();
            assert!(err.contains(want), "{spec}: {err}");
        }
    }
}
