//! A container's `/etc/hosts`: its own name, and every Service's DNS names, since the local
//! cluster has no DNS server. A Service with a virtual IP (see `service_proxy`) resolves to
//! it, as a ClusterIP does; one without (headless, or pods run without a kubelet) resolves
//! to a pod that serves it. [`endpoint`] is the pod a virtual IP's connection goes to.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{Pod, Service};

/// The pod a connection of client pod `client` to `service`'s virtual IP goes to, as
/// kube-proxy picks one: a running pod matching its selector with an IP that is ready and not
/// terminating; when none is, a ready terminating one (kube-proxy's fallback, so a Service
/// being rolled keeps serving); never a pod that is not ready. Among those, the one with the
/// highest rendezvous hash of (client, pod name), so the clients of a Service spread over its
/// pods and a pod that goes away moves only its own clients.
pub fn endpoint<'a>(service: &Service, pods: &'a [Pod], client: &str) -> Option<&'a Pod> {
    candidates(service, pods)
        .filter(|(_, ready)| *ready)
        .max_by_key(|(p, _)| {
            let serving = p.metadata.deletion_timestamp.is_none();
            (serving, rendezvous(client, name_of(p)))
        })
        .map(|(p, _)| p)
}

/// The IP a Service's names resolve to for the client pod `client` when the Service has no
/// virtual IP (headless): a pod it selects that is not terminating, ready ones first, chosen
/// among equals as [`endpoint`] chooses.
pub fn service_ip(service: &Service, pods: &[Pod], client: &str) -> Option<String> {
    candidates(service, pods)
        .filter(|(p, _)| p.metadata.deletion_timestamp.is_none())
        .max_by_key(|(p, ready)| (*ready, rendezvous(client, name_of(p))))
        .and_then(|(p, _)| p.status.as_ref()?.pod_ip.clone())
}

/// The pods `service` selects that have an IP, each with whether it is ready.
fn candidates<'a>(service: &Service, pods: &'a [Pod]) -> impl Iterator<Item = (&'a Pod, bool)> {
    let namespace = service
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let selector: BTreeMap<String, String> = service
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .unwrap_or_default();
    pods.iter().filter_map(move |p| {
        if selector.is_empty() || p.metadata.namespace.as_deref().unwrap_or("default") != namespace
        {
            return None;
        }
        let labels = p.metadata.labels.as_ref();
        if !selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        {
            return None;
        }
        let status = p.status.as_ref()?;
        status.pod_ip.as_deref().filter(|ip| !ip.is_empty())?;
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        Some((p, ready))
    })
}

fn name_of(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or("")
}

/// A stable weight of `pod` for `client` (FNV-1a: the same on every run and machine).
fn rendezvous(client: &str, pod: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in client.bytes().chain([0]).chain(pod.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The hosts file of a pod in `namespace` named `hostname` with address `pod_ip`.
pub fn render(
    namespace: &str,
    hostname: &str,
    pod_ip: &str,
    services: &[Service],
    pods: &[Pod],
    virtual_ip: &dyn Fn(&Service) -> Option<Ipv4Addr>,
) -> String {
    let mut out = String::from(
        "# Kubernetes-managed hosts file (the marin3r local cluster).\n\
         127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    );
    out.push_str(&format!("{pod_ip}\t{hostname}\n"));
    let mut sorted: Vec<&Service> = services.iter().collect();
    sorted.sort_by_key(|s| (s.metadata.namespace.clone(), s.metadata.name.clone()));
    for svc in sorted {
        let ip = match virtual_ip(svc) {
            Some(ip) => ip.to_string(),
            None => match service_ip(svc, pods, hostname) {
                Some(ip) => ip,
                None => continue,
            },
        };
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
        let short = if ns == namespace {
            format!("{name} ")
        } else {
            String::new()
        };
        out.push_str(&format!(
            "{ip}\t{short}{name}.{ns} {name}.{ns}.svc {name}.{ns}.svc.cluster.local\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn meta(ns: &str, name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn pod(name: &str, app: &str, ip: &str, ready: bool) -> Pod {
        Pod {
            metadata: meta("ns", name, &[("app", app)]),
            status: Some(PodStatus {
                pod_ip: Some(ip.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn svc(ns: &str, name: &str, app: &str) -> Service {
        Service {
            metadata: meta(ns, name, &[]),
            spec: Some(ServiceSpec {
                selector: Some([("app".to_owned(), app.to_owned())].into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn services_resolve_to_a_ready_pod_with_all_their_names() {
        let pods = [
            pod("a", "web", "10.200.0.2", false),
            pod("b", "web", "10.200.0.3", true),
        ];
        let hosts = render(
            "ns",
            "client",
            "10.200.0.9",
            &[svc("ns", "web", "web")],
            &pods,
            &|_| None,
        );
        assert!(hosts.contains("10.200.0.9\tclient\n"), "{hosts}");
        assert!(
            hosts.contains("10.200.0.3\tweb web.ns web.ns.svc web.ns.svc.cluster.local\n"),
            "{hosts}"
        );
        let other_ns = render(
            "other",
            "client",
            "10.200.0.9",
            &[svc("ns", "web", "web")],
            &pods,
            &|_| None,
        );
        assert!(
            other_ns.contains("10.200.0.3\tweb.ns web.ns.svc"),
            "{other_ns}"
        );
    }

    #[test]
    fn clients_spread_over_the_ready_pods_and_only_a_gone_pods_clients_move() {
        let web = svc("ns", "web", "web");
        let three = [
            pod("a", "web", "10.200.0.2", true),
            pod("b", "web", "10.200.0.3", true),
            pod("c", "web", "10.200.0.4", true),
        ];
        let clients: Vec<String> = (0..60).map(|i| format!("client-{i}")).collect();
        let before: Vec<String> = clients
            .iter()
            .map(|c| service_ip(&web, &three, c).unwrap())
            .collect();
        for ip in ["10.200.0.2", "10.200.0.3", "10.200.0.4"] {
            assert!(before.iter().any(|b| b == ip), "no client on {ip}");
        }
        // Stable for a client.
        assert_eq!(
            service_ip(&web, &three, "client-7"),
            Some(before[7].clone())
        );
        // c goes away: its clients move, the others stay where they were.
        let two = &three[..2];
        for (client, was) in clients.iter().zip(&before) {
            let now = service_ip(&web, two, client).unwrap();
            if was != "10.200.0.4" {
                assert_eq!(&now, was, "{client} moved");
            } else {
                assert_ne!(now, "10.200.0.4");
            }
        }
        // A ready pod always beats a pod that is not.
        let mixed = [
            pod("a", "web", "10.200.0.2", false),
            pod("b", "web", "10.200.0.3", true),
        ];
        for client in &clients {
            assert_eq!(
                service_ip(&web, &mixed, client).as_deref(),
                Some("10.200.0.3")
            );
        }
    }

    #[test]
    fn a_service_with_a_virtual_ip_resolves_to_it_whatever_its_pods() {
        let vip = Ipv4Addr::new(10, 200, 0, 254);
        let hosts = render(
            "ns",
            "client",
            "10.200.0.9",
            &[svc("ns", "web", "web"), svc("ns", "db", "db")],
            &[pod("a", "web", "10.200.0.2", true)],
            &|s| (s.metadata.name.as_deref() == Some("db")).then_some(vip),
        );
        assert!(
            hosts.contains("10.200.0.254\tdb db.ns db.ns.svc db.ns.svc.cluster.local\n"),
            "{hosts}"
        );
        assert!(hosts.contains("10.200.0.2\tweb web.ns"), "{hosts}");
    }

    #[test]
    fn connections_go_to_ready_serving_pods_then_terminating_ones_never_unready_ones() {
        let web = svc("ns", "web", "web");
        let terminating = |mut p: Pod| {
            p.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
            p
        };
        let name = |p: Option<&Pod>| p.and_then(|p| p.metadata.name.clone());
        let pods = [
            terminating(pod("old", "web", "10.200.0.2", true)),
            pod("new", "web", "10.200.0.3", true),
            pod("starting", "web", "10.200.0.4", false),
        ];
        for client in ["a", "b", "c", "d"] {
            assert_eq!(name(endpoint(&web, &pods, client)).as_deref(), Some("new"));
        }
        // Only the terminating pod is ready: it still serves.
        assert_eq!(
            name(endpoint(&web, &[pods[0].clone(), pods[2].clone()], "a")).as_deref(),
            Some("old")
        );
        // Nothing ready: no endpoint (the connection is refused), though a name resolves.
        assert_eq!(endpoint(&web, &pods[2..], "a"), None);
        assert_eq!(
            service_ip(&web, &pods[2..], "a").as_deref(),
            Some("10.200.0.4")
        );
        // A terminating pod's address leaves the hosts file.
        assert_eq!(service_ip(&web, &pods[..1], "a"), None);
    }

    #[test]
    fn services_without_pods_are_left_out() {
        let hosts = render(
            "ns",
            "c",
            "10.200.0.9",
            &[svc("ns", "db", "db")],
            &[pod("a", "web", "10.200.0.2", true)],
            &|_| None,
        );
        assert!(!hosts.contains("db"), "{hosts}");
    }
}
