//! The blast-radius guard (`spec.rollout.blastRadius`): what a new version takes away from
//! what the node is served. For the listeners, the clusters and the route configurations,
//! how many of the served version's names the new version no longer has (a rename counts as a
//! removal: templating and pruning accidents look exactly like that); and which listeners
//! that routed traffic in both versions route nothing in the new one.
//!
//! Both versions are read as the discovery service serves them (converted resources), so the
//! way a value is written (JSON or YAML, either field name) changes nothing. Where the guard
//! cannot tell whether a listener routes traffic (a filter it does not know, ECDS, scoped
//! routes, VHDS, a value that does not decode) it counts as routing: the guard holds only
//! what it can show.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use envoy_types::pb::envoy::config::listener::v3::{Filter, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    TcpProxy, tcp_proxy::ClusterSpecifier,
};
use prost::Message;

use marin3r_api::rollout::BlastRadius;
use marin3r_xds::resource::{Resource, ResourceType};

/// The types whose removals are counted.
pub const GUARDED: [ResourceType; 3] = [
    ResourceType::Listener,
    ResourceType::Cluster,
    ResourceType::Route,
];
/// The most names a message lists per type.
const NAMES_SHOWN: usize = 10;
/// The longest name a message shows whole.
const NAME_SHOWN_LEN: usize = 64;

const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.\
                        http_connection_manager.v3.HttpConnectionManager";
const TCP_PROXY_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";

/// What one version takes away from another.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Findings {
    /// Per guarded type (listeners, clusters, routes, in that order): how many the served
    /// version has, and the names the new one no longer has, sorted.
    pub removed: Vec<Removed>,
    /// Listeners in both versions that route traffic in the served one and nothing in the
    /// new one, sorted.
    pub emptied: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    pub kind: ResourceType,
    /// How many of this type the served version has.
    pub of: usize,
    pub names: Vec<String>,
}

impl Removed {
    /// Whether more than `max_percent` of the served ones are removed.
    fn over(&self, max_percent: u8) -> bool {
        self.of > 0 && 100 * self.names.len() > usize::from(max_percent) * self.of
    }
}

/// Compares the resources of the served version with those of the new one.
pub fn compare(served: &[Resource], next: &[Resource]) -> Findings {
    let removed = GUARDED
        .iter()
        .map(|&kind| {
            let names = |list: &[Resource]| -> BTreeSet<String> {
                list.iter()
                    .filter(|r| r.kind == kind)
                    .map(|r| r.name.clone())
                    .collect()
            };
            let (before, after) = (names(served), names(next));
            Removed {
                kind,
                of: before.len(),
                names: before.difference(&after).cloned().collect(),
            }
        })
        .collect();
    let (before, after) = (Routing::of(served), Routing::of(next));
    let mut emptied: Vec<String> = before
        .listeners
        .iter()
        .filter(|(_, listener)| before.routes_traffic(listener))
        .filter_map(|(name, _)| {
            let listener = after.listeners.get(name)?;
            (!after.routes_traffic(listener)).then(|| name.clone())
        })
        .collect();
    emptied.sort();
    Findings { removed, emptied }
}

impl Findings {
    /// Why the new version is held under `limits`, or None when it is not.
    pub fn hold(&self, limits: &BlastRadius) -> Option<String> {
        let max = limits.max_removed_percent();
        let mut parts: Vec<String> = self
            .removed
            .iter()
            .filter(|r| r.over(max))
            .map(|r| {
                format!(
                    "removes {} of {} {} ({}% > {max}%): {}",
                    r.names.len(),
                    r.of,
                    plural(r.kind),
                    100 * r.names.len() / r.of,
                    shown(&r.names)
                )
            })
            .collect();
        if limits.hold_emptied_listeners() && !self.emptied.is_empty() {
            let word = if self.emptied.len() == 1 {
                "listener"
            } else {
                "listeners"
            };
            parts.push(format!(
                "empties {word} {} (routes no traffic)",
                shown(&self.emptied)
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// The numbers, whether or not they hold anything: `removes 1 of 5 clusters (20%)` per
    /// type with removals, and the emptied listeners; empty when nothing is taken away.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        for r in self.removed.iter().filter(|r| !r.names.is_empty()) {
            let sep = if out.is_empty() { "" } else { "; " };
            let _ = write!(
                out,
                "{sep}removes {} of {} {} ({}%): {}",
                r.names.len(),
                r.of,
                plural(r.kind),
                100 * r.names.len() / r.of,
                shown(&r.names)
            );
        }
        if !self.emptied.is_empty() {
            let sep = if out.is_empty() { "" } else { "; " };
            let _ = write!(out, "{sep}empties {}", shown(&self.emptied));
        }
        out
    }
}

fn plural(kind: ResourceType) -> &'static str {
    match kind {
        ResourceType::Listener => "listeners",
        ResourceType::Cluster => "clusters",
        ResourceType::Route => "route configurations",
        other => other.spec_field(),
    }
}

/// Up to [`NAMES_SHOWN`] names, each cut to [`NAME_SHOWN_LEN`] characters.
fn shown(names: &[String]) -> String {
    let mut out: Vec<String> = names
        .iter()
        .take(NAMES_SHOWN)
        .map(|n| {
            if n.chars().count() > NAME_SHOWN_LEN {
                let cut: String = n.chars().take(NAME_SHOWN_LEN).collect();
                format!("{cut}...")
            } else {
                n.clone()
            }
        })
        .collect();
    if names.len() > NAMES_SHOWN {
        out.push(format!("and {} more", names.len() - NAMES_SHOWN));
    }
    out.join(", ")
}

/// One version's listeners and route configurations, decoded.
struct Routing {
    listeners: HashMap<String, Listener>,
    /// Whether each route configuration has a route (or VHDS, which the guard does not
    /// follow).
    routes: HashMap<String, bool>,
}

impl Routing {
    fn of(resources: &[Resource]) -> Self {
        let mut listeners = HashMap::new();
        let mut routes = HashMap::new();
        for r in resources {
            match r.kind {
                // A listener that does not decode is left out: it can be neither emptied
                // nor counted as routing, and the conversion has refused it already.
                ResourceType::Listener => {
                    if let Ok(l) = Listener::decode(r.body.clone()) {
                        listeners.insert(r.name.clone(), l);
                    }
                }
                ResourceType::Route => {
                    let routes_some = RouteConfiguration::decode(r.body.clone())
                        .map_or(true, |rc| has_route(&rc));
                    routes.insert(r.name.clone(), routes_some);
                }
                _ => {}
            }
        }
        Self { listeners, routes }
    }

    fn routes_traffic(&self, listener: &Listener) -> bool {
        if listener.api_listener.is_some() {
            return true;
        }
        let mut chains = listener
            .filter_chains
            .iter()
            .chain(listener.default_filter_chain.iter())
            .peekable();
        if chains.peek().is_none() {
            // A UDP listener (or one only its listener filters serve) has no chains.
            return !listener.listener_filters.is_empty() || listener.udp_listener_config.is_some();
        }
        chains.any(|chain| chain.filters.iter().any(|f| self.filter_routes(f)))
    }

    fn filter_routes(&self, f: &Filter) -> bool {
        let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
            return true;
        };
        match any.type_url.as_str() {
            HCM_TYPE => match HttpConnectionManager::decode(any.value.as_slice()) {
                Ok(hcm) => match hcm.route_specifier {
                    Some(RouteSpecifier::RouteConfig(rc)) => has_route(&rc),
                    // A name the version does not define routes nothing.
                    Some(RouteSpecifier::Rds(rds)) => self
                        .routes
                        .get(&rds.route_config_name)
                        .copied()
                        .unwrap_or(false),
                    Some(RouteSpecifier::ScopedRoutes(_)) | None => true,
                },
                Err(_) => true,
            },
            TCP_PROXY_TYPE => match TcpProxy::decode(any.value.as_slice()) {
                Ok(tcp) => match tcp.cluster_specifier {
                    Some(ClusterSpecifier::Cluster(name)) => !name.is_empty(),
                    Some(ClusterSpecifier::WeightedClusters(w)) => !w.clusters.is_empty(),
                    None => tcp.on_demand.is_some(),
                },
                Err(_) => true,
            },
            _ => true,
        }
    }
}

fn has_route(rc: &RouteConfiguration) -> bool {
    rc.vhds.is_some() || rc.virtual_hosts.iter().any(|vh| !vh.routes.is_empty())
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
