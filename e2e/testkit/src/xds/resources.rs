//! Envoy resources for xDS tests and benchmarks, built with envoy-types' protobuf structs and
//! encoded once, as the cache holds them: a listener with an HTTP connection manager whose
//! routes come by RDS, a direct-response route, an EDS cluster and its endpoints, a runtime.

use bytes::Bytes;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, EdsClusterConfig,
};
use envoy_types::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, DataSource, SocketAddress, address,
    config_source, data_source, socket_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route,
    route_action, route_match,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager, http_filter,
};
use envoy_types::pb::envoy::service::runtime::v3::Runtime;
use envoy_types::pb::google::protobuf::{Any, Struct, Value, value};
use marin3r_xds::resource::{Resource, ResourceType};
use prost::{Message, Name};

fn any<M: Message + Name>(m: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: m.encode_to_vec(),
    }
}

fn resource<M: Message>(kind: ResourceType, name: &str, m: &M) -> Resource {
    Resource {
        kind,
        name: name.to_owned(),
        body: Bytes::from(m.encode_to_vec()),
    }
}

fn ads() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        ..Default::default()
    }
}

fn socket(ip: &str, port: u32) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.to_owned(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

fn router_filter(name: &str) -> HttpFilter {
    HttpFilter {
        name: name.to_owned(),
        config_type: Some(http_filter::ConfigType::TypedConfig(
            any(&Router::default()),
        )),
        ..Default::default()
    }
}

/// How a listener is broken, for NACK tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerFlaw {
    None,
    /// A port above 65535: a protoc-gen-validate failure, Envoy rejects the whole response.
    PortOutOfRange,
    /// The router filter followed by another filter: a semantic failure of this listener.
    RouterNotLast,
}

/// A listener on 127.0.0.1:`port` whose HTTP connection manager takes route `route_name`
/// by RDS.
pub fn listener(name: &str, port: u32, route_name: &str, flaw: ListenerFlaw) -> Resource {
    let mut http_filters = vec![router_filter("envoy.filters.http.router")];
    if flaw == ListenerFlaw::RouterNotLast {
        http_filters.push(router_filter("second_router"));
    }
    let hcm = HttpConnectionManager {
        stat_prefix: name.to_owned(),
        route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
            config_source: Some(ads()),
            route_config_name: route_name.to_owned(),
        })),
        http_filters,
        ..Default::default()
    };
    let port = if flaw == ListenerFlaw::PortOutOfRange {
        70_000
    } else {
        port
    };
    let l = Listener {
        name: name.to_owned(),
        address: Some(socket("127.0.0.1", port)),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(filter::ConfigType::TypedConfig(any(&hcm))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    resource(ResourceType::Listener, name, &l)
}

/// A route configuration answering every request with `200` and `body`.
pub fn direct_response_route(name: &str, body: &str) -> Resource {
    let rc = RouteConfiguration {
        name: name.to_owned(),
        virtual_hosts: vec![VirtualHost {
            name: "all".into(),
            domains: vec!["*".into()],
            routes: vec![Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                    ..Default::default()
                }),
                action: Some(route::Action::DirectResponse(DirectResponseAction {
                    status: 200,
                    body: Some(DataSource {
                        specifier: Some(data_source::Specifier::InlineString(body.to_owned())),
                        ..Default::default()
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    resource(ResourceType::Route, name, &rc)
}

/// A route configuration with `n` virtual hosts of a few routes each, forwarding to
/// `clusters` in turn: the bulk of a realistic configuration.
pub fn forwarding_route(name: &str, n: usize, clusters: &[String]) -> Resource {
    let virtual_hosts = (0..n)
        .map(|i| VirtualHost {
            name: format!("vhost-{i}"),
            domains: vec![
                format!("service-{i}.example.com"),
                format!("service-{i}.internal"),
            ],
            routes: ["/api/v1/", "/api/v2/", "/static/", "/"]
                .iter()
                .enumerate()
                .map(|(j, prefix)| Route {
                    name: format!("route-{i}-{j}"),
                    r#match: Some(RouteMatch {
                        path_specifier: Some(route_match::PathSpecifier::Prefix(
                            (*prefix).to_owned(),
                        )),
                        ..Default::default()
                    }),
                    action: Some(route::Action::Route(RouteAction {
                        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                            clusters[(i + j) % clusters.len().max(1)].clone(),
                        )),
                        ..Default::default()
                    })),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    let rc = RouteConfiguration {
        name: name.to_owned(),
        virtual_hosts,
        ..Default::default()
    };
    resource(ResourceType::Route, name, &rc)
}

/// A cluster whose endpoints come by EDS.
pub fn eds_cluster(name: &str) -> Resource {
    eds_cluster_with_timeout(name, 1)
}

/// A cluster whose endpoints come by EDS, with a connect timeout (to change a cluster).
pub fn eds_cluster_with_timeout(name: &str, connect_timeout_seconds: i64) -> Resource {
    let c = Cluster {
        name: name.to_owned(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: Some(ads()),
            service_name: String::new(),
        }),
        connect_timeout: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: connect_timeout_seconds,
            nanos: 0,
        }),
        ..Default::default()
    };
    resource(ResourceType::Cluster, name, &c)
}

/// The endpoints of a cluster: 127.0.0.1 at each of `ports`.
pub fn endpoints(cluster: &str, ports: &[u32]) -> Resource {
    let cla = ClusterLoadAssignment {
        cluster_name: cluster.to_owned(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: ports
                .iter()
                .map(|p| LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: Some(socket("127.0.0.1", *p)),
                        ..Default::default()
                    })),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    };
    resource(ResourceType::Endpoint, cluster, &cla)
}

/// A runtime layer (the bootstrap subscribes to one named `runtime`).
pub fn runtime(name: &str, key: &str, value: &str) -> Resource {
    let layer = Struct {
        fields: [(
            key.to_owned(),
            Value {
                kind: Some(value::Kind::StringValue(value.to_owned())),
            },
        )]
        .into(),
    };
    let r = Runtime {
        name: name.to_owned(),
        layer: Some(layer),
    };
    resource(ResourceType::Runtime, name, &r)
}

/// A whole small configuration: listener `http` on `port` answering `body`, its route, an
/// EDS cluster `backend` with endpoints, and the runtime layer.
pub fn direct_response_config(port: u32, body: &str, flaw: ListenerFlaw) -> Vec<Resource> {
    vec![
        listener("http", port, "local_route", flaw),
        direct_response_route("local_route", body),
        eds_cluster("backend"),
        endpoints("backend", &[port]),
        runtime("runtime", "marin3r.test", "1"),
    ]
}

/// A realistic configuration of about 100 KB encoded: 50 listeners, 50 EDS clusters with
/// endpoints, 50 route configurations, and the runtime layer. `generation` changes every
/// route (as a user edit would) so that two generations differ.
pub fn realistic_config(generation: u64) -> Vec<Resource> {
    let clusters: Vec<String> = (0..50).map(|i| format!("cluster-{i}")).collect();
    let mut out = Vec::new();
    for (i, c) in clusters.iter().enumerate() {
        out.push(eds_cluster(c));
        let ports: Vec<u32> = (0..4).map(|p| 20_000 + (i * 4 + p) as u32).collect();
        out.push(endpoints(c, &ports));
        let route = format!("route-{i}-g{generation}");
        out.push(listener(
            &format!("listener-{i}"),
            10_000 + i as u32,
            &format!("route-{i}"),
            ListenerFlaw::None,
        ));
        let mut r = forwarding_route(&format!("route-{i}"), 7, &clusters);
        // Name stays stable; content carries the generation.
        let mut rc = RouteConfiguration::decode(r.body.as_ref()).unwrap_or_default();
        if let Some(vh) = rc.virtual_hosts.first_mut() {
            vh.domains.push(format!("{route}.example.com"));
        }
        r.body = Bytes::from(rc.encode_to_vec());
        out.push(r);
    }
    out.push(runtime(
        "runtime",
        "marin3r.generation",
        &generation.to_string(),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn realistic_config_is_about_100_kb_and_generations_differ() {
        let a = realistic_config(1);
        let b = realistic_config(2);
        let size: usize = a.iter().map(|r| r.body.len()).sum();
        assert!((60_000..200_000).contains(&size), "{size} bytes");
        assert_eq!(a.len(), b.len());
        assert_ne!(a, b);
    }

    #[test]
    fn flawed_listener_decodes_with_the_bad_port() {
        let l = listener("l", 8080, "r", ListenerFlaw::PortOutOfRange);
        let decoded = Listener::decode(l.body.as_ref()).unwrap();
        let Some(address::Address::SocketAddress(sa)) = decoded.address.unwrap().address else {
            panic!("no socket address");
        };
        assert_eq!(
            sa.port_specifier,
            Some(socket_address::PortSpecifier::PortValue(70_000))
        );
    }
}
