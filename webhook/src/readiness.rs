//! The sidecar's one listener on every pod address, built into its `--config-yaml` overlay:
//! `GET /ready` (kubelet's probes) and `GET /stats/prometheus` (Envoy's stats, for
//! Prometheus), each proxied to the admin interface, which stays on loopback. Anything else,
//! another admin path or method included, gets 404: the admin API can stop Envoy and dump its
//! config, keys included. Every Envoy marin3r runs gets this listener from here.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::json;

/// The admin path both probes use.
pub const READY_PATH: &str = "/ready";
/// The admin path of Envoy's stats in Prometheus' text format: the only other one served.
pub const STATS_PATH: &str = "/stats/prometheus";
/// The name of the sidecar's container port for this listener, which PodMonitors select. Not
/// `envoy-metrics`: the original MARIN3R's examples give that name to the admin port in
/// `marin3r.3scale.net/ports`, and a container's port names must be unique.
pub const STATS_PORT_NAME: &str = "envoy-stats";
/// The static listener and cluster the overlay adds (names an EnvoyConfig must not reuse).
pub const READINESS_LISTENER: &str = "marin3r_sidecar_readiness";
pub const ADMIN_CLUSTER: &str = "marin3r_sidecar_admin";

/// Scrapes one pod's Envoy may take: a burst, then one a second. Rendering every stat costs
/// Envoy CPU and any pod can reach the listener; Prometheus scrapes every 15 to 60 seconds
/// per replica, far below this. Beyond it the listener answers 429 without asking the admin.
pub const STATS_BURST: u32 = 5;
/// How long one scrape may take before the listener gives up on the admin (Prometheus'
/// default scrape timeout).
const STATS_TIMEOUT: &str = "10s";

/// The conventional pod annotations that point annotation-driven Prometheus configurations
/// (`kubernetes_sd_configs` with the usual relabeling) at this listener's stats.
pub const PROMETHEUS_SCRAPE: &str = "prometheus.io/scrape";
pub const PROMETHEUS_PORT: &str = "prometheus.io/port";
pub const PROMETHEUS_PATH: &str = "prometheus.io/path";

/// The three `prometheus.io/*` annotations for Envoy's stats on the readiness `port`.
pub fn prometheus_annotations(port: u16) -> [(&'static str, String); 3] {
    [
        (PROMETHEUS_SCRAPE, "true".to_owned()),
        (PROMETHEUS_PORT, port.to_string()),
        (PROMETHEUS_PATH, STATS_PATH.to_owned()),
    ]
}

/// Where the readiness listener and the shutdown manager reach the admin: its own address, or
/// loopback of the same family when it binds every address.
pub fn admin_target(bind: IpAddr) -> IpAddr {
    match bind {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    }
}

/// Whether this process can open an IPv6 socket, asked once. The webhook renders every
/// sidecar from the discovery pod, whose kernel stands for the cluster's nodes.
pub fn ipv6_available() -> bool {
    static IPV6: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *IPV6.get_or_init(|| std::net::TcpListener::bind((Ipv6Addr::UNSPECIFIED, 0)).is_ok())
}

/// Every pod address on `port`, of both IP families: `::` with `ipv4_compat`, so kubelet's
/// probe reaches it on the pod's IPv4 or IPv6 address whatever the cluster's family. Where
/// there is no IPv6 Envoy refuses `::`, so `0.0.0.0` then.
pub fn any_address(port: u16, ipv6: bool) -> serde_json::Value {
    match ipv6 {
        true => {
            json!({"socket_address": {"address": "::", "ipv4_compat": true, "port_value": port}})
        }
        false => json!({"socket_address": {"address": "0.0.0.0", "port_value": port}}),
    }
}

/// The readiness listener on every pod address and `port` (and `also`, the admin's port when
/// the pod declares it while the admin is on loopback), and the admin (at `admin`) as its
/// upstream cluster.
pub fn listener_and_cluster(
    port: u16,
    also: Option<u16>,
    admin: std::net::SocketAddr,
) -> (serde_json::Value, serde_json::Value) {
    let mut listener = listener(port);
    if let Some(also) = also {
        let ipv6 = ipv6_available();
        listener["additional_addresses"] = json!([{"address": any_address(also, ipv6)}]);
    }
    (listener, admin_cluster(admin))
}

/// The admin's socket options when the readiness listener shares its port (see
/// [`listener_and_cluster`]): `SO_REUSEPORT`, which Envoy's listeners set too, lets the two
/// sockets bind the same port, the admin on loopback and the listener on every address, and
/// the kernel hands a connection to the socket bound to its exact address first. So
/// loopback, where `kubectl port-forward` arrives, keeps reaching the admin, and the pod's
/// addresses reach the stats alone.
pub fn admin_sharing_its_port() -> serde_json::Value {
    json!([{
        "description": "SO_REUSEPORT: the readiness listener also binds this port, on every address",
        "level": 1,
        "name": 15,
        "int_value": 1,
        "state": "STATE_PREBIND",
    }])
}

const LOCAL_RATE_LIMIT: &str = "envoy.filters.http.local_ratelimit";

/// `GET` on exactly `path` (a query string may follow; the admin dispatches on the path
/// alone, so it still reaches that one handler).
fn get_route(path: &str, timeout: &str) -> serde_json::Value {
    json!({
        "match": {
            "path": path,
            "headers": [{"name": ":method", "string_match": {"exact": "GET"}}],
        },
        "route": {"cluster": ADMIN_CLUSTER, "timeout": timeout},
    })
}

fn listener(port: u16) -> serde_json::Value {
    let mut stats = get_route(STATS_PATH, STATS_TIMEOUT);
    // The rate limit filter does nothing but on this route.
    stats["typed_per_filter_config"] = json!({LOCAL_RATE_LIMIT: {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
        "stat_prefix": "marin3r_sidecar_stats",
        "token_bucket": {"max_tokens": STATS_BURST, "tokens_per_fill": 1, "fill_interval": "1s"},
        "filter_enabled": {"default_value": {"numerator": 100, "denominator": "HUNDRED"}},
        "filter_enforced": {"default_value": {"numerator": 100, "denominator": "HUNDRED"}},
    }});
    json!({
        "name": READINESS_LISTENER,
        // `listener.marin3r_sidecar_readiness.*`: the shutdown manager leaves kubelet's probe
        // and Prometheus' scrape connections out of the connections it waits for.
        "stat_prefix": READINESS_LISTENER,
        "address": any_address(port, ipv6_available()),
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": READINESS_LISTENER,
                "route_config": {
                    "name": READINESS_LISTENER,
                    "virtual_hosts": [{
                        "name": READINESS_LISTENER,
                        "domains": ["*"],
                        "routes": [
                            get_route(READY_PATH, "1s"),
                            stats,
                            {"match": {"prefix": "/"}, "direct_response": {"status": 404}},
                        ],
                    }],
                },
                "http_filters": [
                    {
                        "name": LOCAL_RATE_LIMIT,
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
                            "stat_prefix": "marin3r_sidecar_readiness",
                        },
                    },
                    {
                        "name": "envoy.filters.http.router",
                        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
                    },
                ],
            },
        }]}],
    })
}

/// The admin interface as an upstream of the readiness listener.
fn admin_cluster(admin: std::net::SocketAddr) -> serde_json::Value {
    json!({
        "name": ADMIN_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": ADMIN_CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                "address": admin.ip().to_string(),
                "port_value": admin.port(),
            }}}}]}],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readiness_listener_takes_both_families_unless_there_is_no_ipv6() {
        assert_eq!(
            any_address(9902, true),
            json!({"socket_address": {"address": "::", "ipv4_compat": true, "port_value": 9902}})
        );
        assert_eq!(
            any_address(9902, false),
            json!({"socket_address": {"address": "0.0.0.0", "port_value": 9902}})
        );
    }

    /// Exactly two admin paths, `GET` only, and a 404 for the rest (what Envoy does with them
    /// is proven against a real one in e2e/tests/it/webhook_sidecar_envoy.rs).
    #[test]
    fn only_ready_and_prometheus_stats_reach_the_admin() {
        let admin = "127.0.0.1:9901".parse().unwrap();
        let (listener, cluster) = listener_and_cluster(9902, None, admin);
        let routes = &listener["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"]
            [0]["routes"];
        let routes = routes.as_array().unwrap();
        assert_eq!(routes.len(), 3);
        for (route, path) in routes.iter().zip([READY_PATH, STATS_PATH]) {
            assert_eq!(route["match"]["path"], path);
            assert_eq!(route["match"]["headers"][0]["string_match"]["exact"], "GET");
            assert_eq!(route["route"]["cluster"], ADMIN_CLUSTER);
        }
        assert_eq!(routes[2]["direct_response"]["status"], 404);
        assert_eq!(
            routes[1]["typed_per_filter_config"][LOCAL_RATE_LIMIT]["token_bucket"]["max_tokens"],
            STATS_BURST
        );
        assert_eq!(
            cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"],
            json!({"socket_address": {"address": "127.0.0.1", "port_value": 9901}})
        );
    }
}
