//! The few counters the health analysis reads, out of Envoy's stats in Prometheus' text
//! format (`GET /stats/prometheus`). The text comes from a tenant's pod: anything may be in
//! it, so a line that is not what Envoy writes is skipped, never trusted further, and the
//! sums saturate.

use marin3r_api::proxy_sync::Traffic;

/// The query that asks Envoy for these counters alone (stats used since start only): the
/// regular expression is matched on Envoy's own stat names, before their tags become labels.
/// Percent-encoded:
/// `^(http\.[^ ]*\.downstream_rq_(total|5xx)|cluster\.[^ ]*\.upstream_(rq_total|cx_connect_fail|rq_rx_reset|rq_timeout))$`.
pub const QUERY: &str = "usedonly&filter=%5E%28http%5C.%5B%5E%20%5D%2A%5C.downstream_rq_%28total%7C5xx%29%7Ccluster%5C.%5B%5E%20%5D%2A%5C.upstream_%28rq_total%7Ccx_connect_fail%7Crq_rx_reset%7Crq_timeout%29%29%24";

/// HTTP connection managers that are not the tenant's traffic: Envoy's admin, and marin3r's
/// readiness and stats listener (kubelet's probes, Prometheus' and our own scrapes).
fn own_manager(prefix: &str) -> bool {
    prefix == "admin" || prefix.starts_with("marin3r_sidecar")
}

/// Clusters that are not the tenant's upstreams: the discovery service's and the admin's.
fn own_cluster(name: &str) -> bool {
    name == marin3r_webhook::bootstrap::XDS_CLUSTER
        || name == marin3r_webhook::readiness::ADMIN_CLUSTER
}

/// One proxy's counters, as Envoy reports them (totals since it started).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    pub requests: u64,
    pub errors_5xx: u64,
    pub upstream_requests: u64,
    pub connect_failures: u64,
    pub resets: u64,
    pub timeouts: u64,
}

impl Counters {
    fn fields(self) -> [u64; 6] {
        [
            self.requests,
            self.errors_5xx,
            self.upstream_requests,
            self.connect_failures,
            self.resets,
            self.timeouts,
        ]
    }

    /// The growth since `base`; None when a counter went down (the proxy restarted, so
    /// `self` counts from zero).
    pub fn since(self, base: Self) -> Option<Self> {
        if self.fields().iter().zip(base.fields()).any(|(a, b)| *a < b) {
            return None;
        }
        Some(Self {
            requests: self.requests - base.requests,
            errors_5xx: self.errors_5xx - base.errors_5xx,
            upstream_requests: self.upstream_requests - base.upstream_requests,
            connect_failures: self.connect_failures - base.connect_failures,
            resets: self.resets - base.resets,
            timeouts: self.timeouts - base.timeouts,
        })
    }

    /// As the analysis counts one proxy.
    pub fn traffic(self) -> Traffic {
        let attempts = self.upstream_requests.saturating_add(self.connect_failures);
        let failures = self
            .connect_failures
            .saturating_add(self.resets)
            .saturating_add(self.timeouts);
        Traffic {
            proxies: 1,
            // A 5xx is a request: a proxy that says otherwise is held to its own words.
            requests: self.requests.max(self.errors_5xx),
            errors_5xx: self.errors_5xx,
            upstream_attempts: attempts.max(failures),
            upstream_failures: failures,
        }
    }
}

/// The counters in `text`.
pub fn read(text: &str) -> Counters {
    let mut c = Counters::default();
    for line in text.lines() {
        let Some(sample) = Sample::parse(line) else {
            continue;
        };
        let label = |key: &str| sample.label(key);
        let slot = match sample.name {
            "envoy_http_downstream_rq_total" => manager(&label).map(|()| &mut c.requests),
            "envoy_http_downstream_rq_xx" => manager(&label)
                .filter(|()| label("envoy_response_code_class").as_deref() == Some("5"))
                .map(|()| &mut c.errors_5xx),
            "envoy_cluster_upstream_rq_total" => cluster(&label).map(|()| &mut c.upstream_requests),
            "envoy_cluster_upstream_cx_connect_fail" => {
                cluster(&label).map(|()| &mut c.connect_failures)
            }
            "envoy_cluster_upstream_rq_rx_reset" => cluster(&label).map(|()| &mut c.resets),
            "envoy_cluster_upstream_rq_timeout" => cluster(&label).map(|()| &mut c.timeouts),
            _ => None,
        };
        if let Some(slot) = slot {
            *slot = slot.saturating_add(sample.value);
        }
    }
    c
}

/// `Some` when the sample is of a tenant's HTTP connection manager.
fn manager(label: &dyn Fn(&str) -> Option<String>) -> Option<()> {
    let prefix = label("envoy_http_conn_manager_prefix")?;
    (!own_manager(&prefix)).then_some(())
}

/// `Some` when the sample is of a tenant's cluster.
fn cluster(label: &dyn Fn(&str) -> Option<String>) -> Option<()> {
    let name = label("envoy_cluster_name")?;
    (!own_cluster(&name)).then_some(())
}

/// One line of the text format: `name{labels} value`.
struct Sample<'a> {
    name: &'a str,
    labels: Vec<(&'a str, String)>,
    value: u64,
}

impl<'a> Sample<'a> {
    fn parse(line: &'a str) -> Option<Self> {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let end = line.find(['{', ' '])?;
        let name = &line[..end];
        let mut rest = &line[end..];
        let mut labels = Vec::new();
        if let Some(inner) = rest.strip_prefix('{') {
            let (parsed, after) = parse_labels(inner)?;
            labels = parsed;
            rest = after;
        }
        // A counter: a whole number, possibly written as a float; anything else is skipped.
        let value: f64 = rest.split_whitespace().next()?.parse().ok()?;
        if !value.is_finite() || value < 0.0 {
            return None;
        }
        Some(Self {
            name,
            labels,
            // Saturating: a float conversion to an integer clamps.
            value: value as u64,
        })
    }

    fn label(&self, key: &str) -> Option<String> {
        self.labels
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.clone())
    }
}

/// `key="value",...}` (the `{` already taken): the labels and what follows the `}`.
fn parse_labels(mut s: &str) -> Option<(Vec<(&str, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim();
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((key, value));
        s = &s[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a real Envoy answered (a direct 503 route, a cluster refusing connections), with
    /// the admin's and marin3r's own traffic beside it.
    const ENVOY: &str = r#"# TYPE envoy_cluster_upstream_cx_connect_fail counter
envoy_cluster_upstream_cx_connect_fail{envoy_cluster_name="down"} 3
envoy_cluster_upstream_cx_connect_fail{envoy_cluster_name="xds_cluster"} 7
# TYPE envoy_cluster_upstream_rq_total counter
envoy_cluster_upstream_rq_total{envoy_cluster_name="up"} 40
envoy_cluster_upstream_rq_total{envoy_cluster_name="marin3r_sidecar_admin"} 900
envoy_cluster_upstream_rq_rx_reset{envoy_cluster_name="up"} 2
envoy_cluster_upstream_rq_timeout{envoy_cluster_name="up"} 1
# TYPE envoy_http_downstream_rq_total counter
envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix="admin"} 1
envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix="ingress_http"} 6
envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix="egress"} 40
envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix="marin3r_sidecar_readiness"} 500
# TYPE envoy_http_downstream_rq_xx counter
envoy_http_downstream_rq_xx{envoy_response_code_class="5",envoy_http_conn_manager_prefix="ingress_http"} 6
envoy_http_downstream_rq_xx{envoy_response_code_class="2",envoy_http_conn_manager_prefix="egress"} 40
envoy_http_downstream_rq_xx{envoy_response_code_class="5",envoy_http_conn_manager_prefix="marin3r_sidecar_readiness"} 9
"#;

    #[test]
    fn the_tenants_traffic_is_counted_and_marin3rs_own_is_not() {
        let c = read(ENVOY);
        assert_eq!(
            c,
            Counters {
                requests: 46,
                errors_5xx: 6,
                upstream_requests: 40,
                connect_failures: 3,
                resets: 2,
                timeouts: 1,
            }
        );
        let t = c.traffic();
        assert_eq!((t.upstream_attempts, t.upstream_failures), (43, 6));
    }

    #[test]
    fn hostile_text_is_skipped_not_trusted() {
        let text = concat!(
            "envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=\"a\\\"} b\"} 5\n",
            "envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=\"x\"} -4\n",
            "envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=\"x\"} NaN\n",
            "envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=\"x\"} 1e30\n",
            "envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=\"x\"} 1e30\n",
            "envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=\"x\" 3\n",
            "envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=\"unterminated 3\n",
            "envoy_http_downstream_rq_total 8\n",
            "envoy_http_downstream_rq_xx{envoy_http_conn_manager_prefix=\"x\"} 8\n",
            "garbage\n{}}}\"\"\n",
        );
        let c = read(text);
        // The escaped quote is part of the label; the huge values saturate; the rest (no
        // label, a negative, NaN, a broken line, no class) count nothing.
        assert_eq!(c.requests, u64::MAX);
        assert_eq!(c.errors_5xx, 0);
        assert_eq!(read(""), Counters::default());
    }

    #[test]
    fn growth_is_counted_from_the_base_and_a_restart_starts_again() {
        let base = read(ENVOY);
        let mut later = base;
        later.requests += 10;
        later.errors_5xx += 1;
        let grown = later.since(base).unwrap();
        assert_eq!((grown.requests, grown.errors_5xx, grown.resets), (10, 1, 0));
        let restarted = Counters {
            requests: 3,
            ..Counters::default()
        };
        assert_eq!(restarted.since(base), None);
    }
}
