//! `DiscoveryService.spec.sidecar`: the cluster's defaults for the sidecars its webhook
//! injects (Envoy image, resources, image pull Secrets, layout, Prometheus annotations), so
//! an air-gapped cluster or a team's standard needs no annotation on every pod. A pod's
//! annotations still win.

use k8s_openapi::api::core::v1::{LocalObjectReference, ResourceRequirements};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use marin3r_certs::names::is_dns_subdomain;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarDefaults {
    /// The Envoy image of injected sidecars (default `envoyproxy/envoy:v1.40.0`); a pod's
    /// `marin3r.3scale.net/envoy-image` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Envoy's requests and limits (`cpu` and `memory`); each of a pod's
    /// `marin3r.3scale.net/resources.*` annotations wins for its own quantity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Added to every injected pod's `imagePullSecrets`. Kubernetes reads them from the pod's
    /// namespace: each enabled namespace needs the Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// `true`: Envoy as a native sidecar (an init container with `restartPolicy: Always`,
    /// Kubernetes 1.29+), so Jobs finish and applications start after Envoy is ready;
    /// `false`: appended to the pod's containers. Unset: native when the API server is 1.29
    /// or newer. A pod's `marin3r.3scale.net/native-sidecar` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_sidecars: Option<bool>,
    /// In the classic layout, start a pod's applications only once Envoy is ready (default
    /// false). A pod's `marin3r.3scale.net/hold-application-until-proxy-starts` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_application_until_proxy_starts: Option<bool>,
    /// How injected Envoys speak ADS: `sotw` (state of the world, the default) or `delta`
    /// (incremental: only changed resources are sent). A pod's
    /// `marin3r.3scale.net/xds-protocol` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xds_protocol: Option<XdsProtocol>,
    /// Annotate injected pods `prometheus.io/scrape`, `prometheus.io/port` and
    /// `prometheus.io/path` for Envoy's stats (`/stats/prometheus` on the sidecar's readiness
    /// port, named `envoy-stats`), so an annotation-driven Prometheus scrapes every sidecar
    /// (default true; never over a pod's own `prometheus.io/*`). A pod's
    /// `marin3r.3scale.net/prometheus-annotations` wins. Also the default for the pods of
    /// the EnvoyDeployments naming this discovery service, where the EnvoyDeployment's own
    /// `marin3r.3scale.net/prometheus-annotations` annotation wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus_annotations: Option<bool>,
}

/// How injected Envoys speak ADS: `sotw` (state of the world, the default) or `delta`
/// (incremental). A pod's `marin3r.3scale.net/xds-protocol` wins.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum XdsProtocol {
    /// State of the world: every resource of a type in each response.
    Sotw,
    /// Incremental: only the resources that changed, and the names of those removed.
    Delta,
}

/// The two resources a sidecar default may set, as the webhook's annotations do.
const RESOURCE_NAMES: [&str; 2] = ["cpu", "memory"];

impl SidecarDefaults {
    /// The discovery pod's flags for these defaults (`marin3r discovery-service`), after
    /// checking every field; the error names the field.
    pub fn args(&self) -> Result<Vec<String>, String> {
        let mut args = Vec::new();
        if let Some(image) = &self.image {
            if image.is_empty() || image.contains(char::is_whitespace) {
                return Err(format!(
                    "spec.sidecar.image: {image:?} is not an image reference"
                ));
            }
            args.push(format!("--sidecar-envoy-image={image}"));
        }
        args.extend(self.resource_args()?);
        for (i, secret) in self.image_pull_secrets.iter().flatten().enumerate() {
            if !is_dns_subdomain(&secret.name) {
                return Err(format!(
                    "spec.sidecar.imagePullSecrets[{i}].name: {:?} is not a Secret name",
                    secret.name
                ));
            }
            args.push(format!("--sidecar-image-pull-secret={}", secret.name));
        }
        if let Some(native) = self.native_sidecars {
            args.push(format!("--native-sidecars={native}"));
        }
        if self.hold_application_until_proxy_starts == Some(true) {
            args.push("--hold-application-until-proxy-starts".into());
        }
        match self.xds_protocol {
            Some(XdsProtocol::Delta) => args.push("--sidecar-xds-protocol=delta".into()),
            Some(XdsProtocol::Sotw) => args.push("--sidecar-xds-protocol=sotw".into()),
            None => {}
        }
        if let Some(annotate) = self.prometheus_annotations {
            args.push(format!("--sidecar-prometheus-annotations={annotate}"));
        }
        Ok(args)
    }

    fn resource_args(&self) -> Result<Vec<String>, String> {
        let Some(resources) = &self.resources else {
            return Ok(Vec::new());
        };
        if resources.claims.as_ref().is_some_and(|c| !c.is_empty()) {
            return Err("spec.sidecar.resources.claims: not supported for the sidecar".into());
        }
        let mut args = Vec::new();
        let mut values = [[None, None], [None, None]];
        for (kind, list, row) in [
            ("requests", &resources.requests, 0),
            ("limits", &resources.limits, 1),
        ] {
            for (name, quantity) in list.iter().flatten() {
                let field = format!("spec.sidecar.resources.{kind}.{name}");
                let Some(column) = RESOURCE_NAMES.iter().position(|n| n == name) else {
                    return Err(format!("{field}: only cpu and memory can be set"));
                };
                let value = marin3r_webhook::parse_quantity(&quantity.0)
                    .map_err(|e| format!("{field}: {:?}: {e}", quantity.0))?;
                values[row][column] = Some(value);
                args.push(format!("--sidecar-{kind}-{name}={}", quantity.0));
            }
        }
        for (column, name) in RESOURCE_NAMES.iter().enumerate() {
            if let [Some(request), Some(limit)] = [values[0][column], values[1][column]]
                && request > limit
            {
                return Err(format!(
                    "spec.sidecar.resources.requests.{name}: greater than the limit"
                ));
            }
        }
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults(json: serde_json::Value) -> SidecarDefaults {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn every_field_becomes_a_flag() {
        let args = defaults(serde_json::json!({
            "image": "mirror.local/envoy:v1.40.0",
            "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "256Mi"}},
            "imagePullSecrets": [{"name": "mirror"}],
            "nativeSidecars": false,
            "holdApplicationUntilProxyStarts": true,
            "xdsProtocol": "delta",
            "prometheusAnnotations": false,
        }))
        .args()
        .unwrap();
        assert_eq!(
            args,
            [
                "--sidecar-envoy-image=mirror.local/envoy:v1.40.0",
                "--sidecar-requests-cpu=100m",
                "--sidecar-limits-memory=256Mi",
                "--sidecar-image-pull-secret=mirror",
                "--native-sidecars=false",
                "--hold-application-until-proxy-starts",
                "--sidecar-xds-protocol=delta",
                "--sidecar-prometheus-annotations=false",
            ]
        );
        assert!(SidecarDefaults::default().args().unwrap().is_empty());
    }

    #[test]
    fn bad_fields_are_named() {
        let err = |json| defaults(json).args().unwrap_err();
        assert_eq!(
            err(serde_json::json!({"resources": {"limits": {"ephemeral-storage": "1Gi"}}})),
            "spec.sidecar.resources.limits.ephemeral-storage: only cpu and memory can be set"
        );
        assert!(
            err(serde_json::json!({"resources": {"requests": {"cpu": "lots"}}}))
                .starts_with("spec.sidecar.resources.requests.cpu: \"lots\": ")
        );
        assert_eq!(
            err(
                serde_json::json!({"resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "1Mi"}}})
            ),
            "spec.sidecar.resources.requests.memory: greater than the limit"
        );
        assert_eq!(
            err(serde_json::json!({"imagePullSecrets": [{"name": "Bad_Name"}]})),
            "spec.sidecar.imagePullSecrets[0].name: \"Bad_Name\" is not a Secret name"
        );
        assert_eq!(
            err(serde_json::json!({"image": "envoy with spaces"})),
            "spec.sidecar.image: \"envoy with spaces\" is not an image reference"
        );
    }
}
