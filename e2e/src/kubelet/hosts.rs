//! A container's `/etc/hosts`: its own name, and every Service's DNS names pointing at a pod
//! that serves it (ready pods first), since the local cluster has no DNS server or
//! Service IPs. With several ready pods, each client pod is given one of them by rendezvous
//! hashing of (client, pod) names, so the clients of a Service spread over its pods as
//! kube-proxy spreads connections, and a pod that goes away moves only its own clients.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Service};

/// The IP a Service's names resolve to for the client pod `client`: a running pod matching
/// its selector with an IP, ready ones preferred; among those, the one with the highest
/// rendezvous hash of (client, pod name).
pub fn service_ip(service: &Service, pods: &[Pod], client: &str) -> Option<String> {
    let namespace = service.metadata.namespace.as_deref().unwrap_or("default");
    let selector: &BTreeMap<String, String> = service.spec.as_ref()?.selector.as_ref()?;
    if selector.is_empty() {
        return None;
    }
    let candidates: Vec<(bool, u64, &str)> = pods
        .iter()
        .filter(|p| p.metadata.namespace.as_deref().unwrap_or("default") == namespace)
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            let labels = p.metadata.labels.as_ref();
            selector
                .iter()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        })
        .filter_map(|p| {
            let status = p.status.as_ref()?;
            let ip = status.pod_ip.as_deref().filter(|ip| !ip.is_empty())?;
            let ready = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let name = p.metadata.name.as_deref().unwrap_or("");
            Some((ready, rendezvous(client, name), ip))
        })
        .collect();
    candidates
        .into_iter()
        .max_by_key(|(ready, weight, _)| (*ready, *weight))
        .map(|(_, _, ip)| ip.to_owned())
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
) -> String {
    let mut out = String::from(
        "# Kubernetes-managed hosts file (the marin3r local cluster).\n\
         127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    );
    out.push_str(&format!("{pod_ip}\t{hostname}\n"));
    let mut sorted: Vec<&Service> = services.iter().collect();
    sorted.sort_by_key(|s| (s.metadata.namespace.clone(), s.metadata.name.clone()));
    for svc in sorted {
        let Some(ip) = service_ip(svc, pods, hostname) else {
            continue;
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
    fn services_without_pods_are_left_out() {
        let hosts = render(
            "ns",
            "c",
            "10.200.0.9",
            &[svc("ns", "db", "db")],
            &[pod("a", "web", "10.200.0.2", true)],
        );
        assert!(!hosts.contains("db"), "{hosts}");
    }
}
