//! YAML/JSON-to-protobuf conversion rate: what the EnvoyConfig controller pays to validate
//! and encode a spec before publishing it.

use std::time::{Duration, Instant};

use marin3r_api::{EnvoyResource, EnvoyResources, Serialization};
use marin3r_envoyconfig::convert::{descriptor_pool, envoy_resources};

use super::{Row, Stats, human};

/// An HTTP connection manager listener with an inline route table, as users write them.
pub(super) fn listener(i: usize) -> String {
    format!(
        r#"name: listener-{i}
address: {{ socket_address: {{ address: 0.0.0.0, port_value: {port} }} }}
filter_chains:
  - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress_{i}
          codec_type: AUTO
          route_config:
            name: local_route_{i}
            virtual_hosts:
              - name: service-{i}
                domains: ["service-{i}.example.com", "*.service-{i}.example.com"]
                routes:
                  - match: {{ prefix: "/api" }}
                    route: {{ cluster: cluster-{i}, timeout: 5s }}
                  - match: {{ path: "/healthz" }}
                    direct_response: {{ status: 200, body: {{ inline_string: ok }} }}
          http_filters:
            - name: envoy.filters.http.router
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#,
        port = 10_000 + i
    )
}

pub(super) fn cluster(i: usize) -> String {
    format!(
        r#"name: cluster-{i}
connect_timeout: 0.5s
type: STRICT_DNS
lb_policy: ROUND_ROBIN
load_assignment:
  cluster_name: cluster-{i}
  endpoints:
    - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: backend-{i}.default.svc, port_value: 8080 }} }} }}
        - endpoint: {{ address: {{ socket_address: {{ address: backend-{i}-b.default.svc, port_value: 8080 }} }} }}
"#
    )
}

pub(super) fn route(i: usize) -> String {
    format!(
        r#"name: route-{i}
virtual_hosts:
  - name: vhost-{i}
    domains: ["app-{i}.example.com"]
    routes:
      - match: {{ prefix: "/v1" }}
        route: {{ cluster: cluster-{i}, timeout: 2s }}
      - match: {{ prefix: "/" }}
        route: {{ cluster: cluster-{i} }}
"#
    )
}

fn entries(n: usize, make: fn(usize) -> String) -> Vec<EnvoyResource> {
    (0..n)
        .map(|i| EnvoyResource {
            name: None,
            value: make(i),
        })
        .collect()
}

/// The same resources written as canonical JSON, for the JSON rows.
fn as_json(resources: &EnvoyResources) -> anyhow::Result<EnvoyResources> {
    let convert = |list: &[EnvoyResource]| -> anyhow::Result<Vec<EnvoyResource>> {
        list.iter()
            .map(|e| {
                let value: serde_json::Value = serde_saphyr::from_str(&e.value)?;
                Ok(EnvoyResource {
                    name: None,
                    value: serde_json::to_string(&value)?,
                })
            })
            .collect()
    };
    Ok(EnvoyResources {
        listeners: convert(&resources.listeners)?,
        clusters: convert(&resources.clusters)?,
        routes: convert(&resources.routes)?,
        ..Default::default()
    })
}

fn input_bytes(resources: &EnvoyResources) -> usize {
    [&resources.listeners, &resources.clusters, &resources.routes]
        .iter()
        .flat_map(|l| l.iter())
        .map(|e| e.value.len())
        .sum()
}

/// Converts each case `samples` times and reports resources/s and input MB/s at the median.
pub fn conversion(scale: f64) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    // The descriptor pool is decoded once per process, on first use.
    let start = Instant::now();
    descriptor_pool()?;
    rows.push(Row {
        benchmark: "Envoy descriptor pool decode (once per process)".into(),
        case: "envoy-types descriptor set".into(),
        samples: 1,
        result: human(start.elapsed()),
    });

    let hcm_1000 = EnvoyResources {
        listeners: entries(1_000, listener),
        ..Default::default()
    };
    let clusters_1000 = EnvoyResources {
        clusters: entries(1_000, cluster),
        ..Default::default()
    };
    let routes_1000 = EnvoyResources {
        routes: entries(1_000, route),
        ..Default::default()
    };
    let realistic = EnvoyResources {
        listeners: entries(50, listener),
        clusters: entries(50, cluster),
        routes: entries(50, route),
        ..Default::default()
    };
    let cases = [
        (
            "1,000 HCM listeners, yaml",
            hcm_1000.clone(),
            Serialization::Yaml,
            10,
        ),
        (
            "1,000 HCM listeners, json",
            as_json(&hcm_1000)?,
            Serialization::Json,
            10,
        ),
        // Each shape alone, so a regression in one does not hide behind the others.
        (
            "1,000 clusters, yaml",
            clusters_1000.clone(),
            Serialization::Yaml,
            10,
        ),
        (
            "1,000 clusters, json",
            as_json(&clusters_1000)?,
            Serialization::Json,
            10,
        ),
        (
            "1,000 routes, yaml",
            routes_1000.clone(),
            Serialization::Yaml,
            10,
        ),
        (
            "1,000 routes, json",
            as_json(&routes_1000)?,
            Serialization::Json,
            10,
        ),
        (
            "50 listeners + 50 clusters + 50 routes, yaml",
            realistic.clone(),
            Serialization::Yaml,
            100,
        ),
        (
            "50 listeners + 50 clusters + 50 routes, json",
            as_json(&realistic)?,
            Serialization::Json,
            100,
        ),
    ];
    for (case, resources, serialization, default_samples) in cases {
        let samples = ((default_samples as f64 * scale).round() as usize).max(1);
        let count = resources.len();
        let bytes = input_bytes(&resources);
        let mut timings = Vec::with_capacity(samples);
        let mut encoded = 0;
        for _ in 0..samples {
            let start = Instant::now();
            let out = envoy_resources(&resources, serialization)
                .map_err(|errors| anyhow::anyhow!("benchmark input is invalid: {}", errors[0]))?;
            timings.push(start.elapsed());
            encoded = out.iter().map(|r| r.body.len()).sum();
            std::hint::black_box(out);
        }
        if let Some(s) = Stats::of(&timings) {
            let secs = s
                .p50
                .as_secs_f64()
                .max(Duration::from_nanos(1).as_secs_f64());
            rows.push(Row {
                benchmark: "YAML/JSON to protobuf conversion".into(),
                case: format!(
                    "{case} ({:.0} KB in, {:.0} KB encoded)",
                    bytes as f64 / 1e3,
                    encoded as f64 / 1e3
                ),
                samples,
                result: format!(
                    "median {} ({:.0} resources/s, {:.1} MB/s), p99 {}",
                    human(s.p50),
                    count as f64 / secs,
                    bytes as f64 / 1e6 / secs,
                    human(s.p99)
                ),
            });
        }
    }
    Ok(rows)
}
