//! `generateFromEndpointSlices`: one `ClusterLoadAssignment` from the EndpointSlices a
//! selector matches, as the original MARIN3R builds it: each endpoint's first address at the
//! slice's port named `targetPort`, with its health from the endpoint's conditions
//! (terminating is draining; else serving, else ready, decides healthy or not).

use std::collections::BTreeSet;
use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::{
    Address, HealthStatus, SocketAddress, address, socket_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointSlice};
use prost::Message as _;

use super::EndpointSource;
use marin3r_xds::resource::{Resource, ResourceType};

/// Why the EndpointSlices a selector matched cannot become a `ClusterLoadAssignment`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointsError {
    #[error(
        "EndpointSlice {slice} has address type {address_type}; only IPv4 and IPv6 are supported"
    )]
    AddressType { slice: String, address_type: String },
    #[error("no EndpointSlice matching the selector has a port named {0:?}")]
    NoPort(String),
}

/// The `ClusterLoadAssignment` of `source` from the slices its selector matched, or why it
/// cannot be built. No slice at all is an empty assignment (a Service scaled to zero has no
/// endpoints, and that is what Envoy must be told).
pub fn endpoints_from_slices(
    source: &EndpointSource,
    slices: &[EndpointSlice],
) -> Result<Resource, EndpointsError> {
    let mut slices: Vec<&EndpointSlice> = slices.iter().collect();
    // The API server lists by name; sorted anyway, so the same slices give the same bytes.
    slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut hosts: Vec<(IpAddr, u32, HealthStatus)> = Vec::new();
    let mut seen: BTreeSet<(IpAddr, u32)> = BTreeSet::new();
    let mut port_found = false;
    for slice in &slices {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            return Err(EndpointsError::AddressType {
                slice: name.to_owned(),
                address_type: slice.address_type.clone(),
            });
        }
        let port = slice.ports.iter().flatten().find_map(|p| {
            (p.name.as_deref().unwrap_or_default() == source.target_port)
                .then_some(p.port)
                .flatten()
        });
        let Some(port) = port.and_then(|p| u32::try_from(p).ok()) else {
            continue;
        };
        port_found = true;
        for endpoint in slice.endpoints.iter().flatten() {
            // The first address only: the others of an endpoint are the same pod's (as the
            // original MARIN3R, see kubernetes/kubernetes#106267).
            let Some(ip) = endpoint.addresses.first().and_then(|a| a.parse().ok()) else {
                continue;
            };
            if seen.insert((ip, port)) {
                hosts.push((ip, port, health(endpoint.conditions.as_ref())));
            }
        }
    }
    let has_endpoints = slices
        .iter()
        .any(|s| s.endpoints.as_ref().is_some_and(|e| !e.is_empty()));
    if has_endpoints && !port_found {
        return Err(EndpointsError::NoPort(source.target_port.clone()));
    }
    hosts.sort_by_key(|(ip, port, _)| (*ip, *port));
    let assignment = ClusterLoadAssignment {
        cluster_name: source.cluster_name.clone(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: hosts
                .into_iter()
                .map(|(ip, port, health)| LbEndpoint {
                    health_status: health as i32,
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: Some(Address {
                            address: Some(address::Address::SocketAddress(SocketAddress {
                                address: ip.to_string(),
                                port_specifier: Some(socket_address::PortSpecifier::PortValue(
                                    port,
                                )),
                                ..Default::default()
                            })),
                        }),
                        ..Default::default()
                    })),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    };
    Ok(Resource {
        kind: ResourceType::Endpoint,
        name: source.cluster_name.clone(),
        body: assignment.encode_to_vec().into(),
    })
}

fn health(conditions: Option<&EndpointConditions>) -> HealthStatus {
    let Some(c) = conditions else {
        return HealthStatus::Unknown;
    };
    if c.terminating == Some(true) {
        return HealthStatus::Draining;
    }
    match c.serving.or(c.ready) {
        Some(true) => HealthStatus::Healthy,
        Some(false) => HealthStatus::Unhealthy,
        None => HealthStatus::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mk_source() -> EndpointSource {
        EndpointSource {
            path: "spec.resources[0].generateFromEndpointSlices".into(),
            selector: serde_json::from_value(json!({"matchLabels": {"app": "web"}})).unwrap(),
            cluster_name: "web".into(),
            target_port: "http".into(),
        }
    }

    fn mk_slice(
        name: &str,
        address_type: &str,
        port: i32,
        endpoints: serde_json::Value,
    ) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": "web"}},
            "addressType": address_type,
            "ports": [{"name": "metrics", "port": 9090}, {"name": "http", "port": port}],
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    fn decoded(r: &Resource) -> ClusterLoadAssignment {
        ClusterLoadAssignment::decode(r.body.clone()).unwrap()
    }

    fn hosts(cla: &ClusterLoadAssignment) -> Vec<(String, u32, HealthStatus)> {
        cla.endpoints[0]
            .lb_endpoints
            .iter()
            .map(|e| {
                let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                    panic!("an endpoint expected");
                };
                let Some(address::Address::SocketAddress(sa)) =
                    &ep.address.as_ref().unwrap().address
                else {
                    panic!("a socket address expected");
                };
                let Some(socket_address::PortSpecifier::PortValue(port)) = sa.port_specifier else {
                    panic!("a port expected");
                };
                (sa.address.clone(), port, e.health_status())
            })
            .collect()
    }

    #[test]
    fn slices_become_one_assignment_with_health_from_conditions() {
        let slices = [
            mk_slice(
                "web-b",
                "IPv4",
                8080,
                json!([
                    {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                    {"addresses": ["10.0.0.1", "10.9.9.9"], "conditions": {"ready": true}},
                ]),
            ),
            mk_slice(
                "web-a",
                "IPv4",
                8080,
                json!([
                    {"addresses": ["10.0.0.2"], "conditions": {"ready": true, "serving": false}},
                    {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                    {"addresses": ["10.0.0.4"]},
                ]),
            ),
            mk_slice(
                "web-v6",
                "IPv6",
                8081,
                json!([{"addresses": ["fd00::1"], "conditions": {"ready": true}}]),
            ),
        ];
        let r = endpoints_from_slices(&mk_source(), &slices).unwrap();
        assert_eq!((r.kind, r.name.as_str()), (ResourceType::Endpoint, "web"));
        let cla = decoded(&r);
        assert_eq!(cla.cluster_name, "web");
        assert_eq!(
            hosts(&cla),
            [
                ("10.0.0.1".to_owned(), 8080, HealthStatus::Healthy),
                ("10.0.0.2".to_owned(), 8080, HealthStatus::Unhealthy),
                ("10.0.0.3".to_owned(), 8080, HealthStatus::Draining),
                ("10.0.0.4".to_owned(), 8080, HealthStatus::Unknown),
                ("fd00::1".to_owned(), 8081, HealthStatus::Healthy),
            ]
        );
        // Order of the list does not change the bytes.
        let mut reversed = slices.clone();
        reversed.reverse();
        assert_eq!(endpoints_from_slices(&mk_source(), &reversed).unwrap(), r);
    }

    #[test]
    fn what_cannot_be_built_says_why() {
        let empty = endpoints_from_slices(&mk_source(), &[]).unwrap();
        assert!(hosts(&decoded(&empty)).is_empty());
        let fqdn = mk_slice("web", "FQDN", 80, json!([{"addresses": ["a.example"]}]));
        assert_eq!(
            endpoints_from_slices(&mk_source(), &[fqdn])
                .unwrap_err()
                .to_string(),
            "EndpointSlice web has address type FQDN; only IPv4 and IPv6 are supported"
        );
        let mut source = mk_source();
        source.target_port = "grpc".into();
        let slice = mk_slice("web", "IPv4", 80, json!([{"addresses": ["10.0.0.1"]}]));
        assert_eq!(
            endpoints_from_slices(&source, &[slice])
                .unwrap_err()
                .to_string(),
            "no EndpointSlice matching the selector has a port named \"grpc\""
        );
    }
}
