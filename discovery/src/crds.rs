//! Every CRD marin3r serves, generated from the Rust types. `marin3r crds` prints them;
//! `manifests/crds/` holds the checked-in copies, and a test fails when they drift.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use marin3r_certs::api::DiscoveryServiceCertificate;

use marin3r_api::discovery_service::DiscoveryService;
use marin3r_api::envoy_deployment::EnvoyDeployment;
use marin3r_api::{EnvoyConfig, EnvoyConfigRevision};

/// All CRDs, in a stable order.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        DiscoveryService::crd(),
        DiscoveryServiceCertificate::crd(),
        EnvoyConfig::crd(),
        EnvoyConfigRevision::crd(),
        EnvoyDeployment::crd(),
    ]
}

/// The file name of a CRD in `manifests/crds/`: `<group>_<plural>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// A CRD as a YAML document.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_saphyr::SerializeError> {
    serde_saphyr::to_string(crd)
}
