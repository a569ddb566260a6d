//! The discovery service's Prometheus metrics. Labels are bounded: the resource type (eight
//! values), the protocol and a refusal reason; never a node id, namespace or error text.

use std::fmt::{self, Write};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::limits::Limit;
use crate::resource::ResourceType;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KindLabel(pub ResourceType);

impl EncodeLabelValue for KindLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), fmt::Error> {
        encoder.write_str(self.0.label())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TypeLabels {
    pub resource_type: KindLabel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    Sotw,
    Delta,
}

impl Protocol {
    /// Its label value and its name in `/sync-status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sotw => "sotw",
            Self::Delta => "delta",
        }
    }
}

/// Label values are lowercase snake_case, like `resource_type`'s (Prometheus convention); the
/// derive would print the variant names.
macro_rules! label_value {
    ($($ty:ty),*) => {$(
        impl ::prometheus_client::encoding::EncodeLabelValue for $ty {
            fn encode(
                &self,
                encoder: &mut ::prometheus_client::encoding::LabelValueEncoder<'_>,
            ) -> ::std::fmt::Result {
                ::std::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    )*};
}

label_value!(Protocol, RefusalReason, Limit);

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ProtocolLabels {
    pub protocol: Protocol,
}

/// Why a connection was refused before any xDS request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// The client presented no certificate.
    NoClientCertificate,
    /// The client certificate is not signed by the CA (or expired, or otherwise invalid).
    UntrustedClientCertificate,
    /// The certificate has no `spiffe://<trust domain>/ns/<namespace>` URI SAN.
    NoNamespaceIdentity,
    /// Any other TLS failure (plain text, timeout, protocol error).
    Handshake,
    /// Its namespace already has `--xds-max-connections-per-namespace` connections open.
    ConnectionsPerNamespace,
}

impl RefusalReason {
    /// Every reason, each a series of `marin3r_xds_refused_connections_total` from the start.
    pub const ALL: [Self; 5] = [
        Self::NoClientCertificate,
        Self::UntrustedClientCertificate,
        Self::NoNamespaceIdentity,
        Self::Handshake,
        Self::ConnectionsPerNamespace,
    ];

    /// Its `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoClientCertificate => "no_client_certificate",
            Self::UntrustedClientCertificate => "untrusted_client_certificate",
            Self::NoNamespaceIdentity => "no_namespace_identity",
            Self::Handshake => "handshake",
            Self::ConnectionsPerNamespace => "connections_per_namespace",
        }
    }
}

/// Which limit closed a stream (see [`crate::Limits`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct LimitLabels {
    pub limit: Limit,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RefusalLabels {
    pub reason: RefusalReason,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms to ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every metric the xDS server records.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub connected_proxies: Family<ProtocolLabels, Gauge>,
    pub requests: Family<TypeLabels, Counter>,
    pub responses: Family<TypeLabels, Counter>,
    pub acks: Family<TypeLabels, Counter>,
    pub nacks: Family<TypeLabels, Counter>,
    pub push_latency: HistogramFamily<TypeLabels>,
    pub convergence_latency: HistogramFamily<TypeLabels>,
    pub refused_connections: Family<RefusalLabels, Counter>,
    pub refused_streams: Family<LimitLabels, Counter>,
    pub dropped_nack_events: Counter,
    /// What the streams keep of their own (names, reported versions) in bytes, every
    /// namespace together: what the subscription byte limits bound.
    pub subscription_bytes: Gauge,
    /// The bytes of discovery requests still being received (each charged its declared
    /// length once its length prefix arrived), every namespace together: with
    /// `subscription_bytes`, what the namespace and process byte limits bound.
    pub request_bytes: Gauge,
}

impl Metrics {
    /// Creates the metrics and registers them (prefixed `marin3r_xds_`) in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            connected_proxies: Family::default(),
            requests: Family::default(),
            responses: Family::default(),
            acks: Family::default(),
            nacks: Family::default(),
            push_latency: Family::new_with_constructor(latency_histogram),
            convergence_latency: Family::new_with_constructor(latency_histogram),
            refused_connections: Family::default(),
            refused_streams: Family::default(),
            dropped_nack_events: Counter::default(),
            subscription_bytes: Gauge::default(),
            request_bytes: Gauge::default(),
        };
        // The NACK and refusal series from the start, at 0: `increase()` sees the first
        // event as one (a series born at 1 shows no increase), so alerts fire on it, and a
        // dashboard shows 0 rather than no data.
        for kind in ResourceType::ALL {
            let _ = m.nacks.get_or_create(&Self::kind(kind));
        }
        for reason in RefusalReason::ALL {
            let _ = m
                .refused_connections
                .get_or_create(&RefusalLabels { reason });
        }
        for limit in Limit::ALL {
            let _ = m.refused_streams.get_or_create(&LimitLabels { limit });
        }
        let r = registry.sub_registry_with_prefix("marin3r_xds");
        r.register(
            "connected_proxies",
            "ADS streams open, by protocol",
            m.connected_proxies.clone(),
        );
        r.register(
            "requests",
            "Discovery requests received, by resource type",
            m.requests.clone(),
        );
        r.register(
            "responses",
            "Discovery responses sent, by resource type",
            m.responses.clone(),
        );
        r.register("acks", "Responses Envoy accepted", m.acks.clone());
        r.register("nacks", "Responses Envoy rejected", m.nacks.clone());
        r.register(
            "push_latency_seconds",
            "Time from a snapshot being set to a response with it being sent",
            m.push_latency.clone(),
        );
        r.register(
            "convergence_latency_seconds",
            "Time from a snapshot being set to Envoy acknowledging it",
            m.convergence_latency.clone(),
        );
        r.register(
            "refused_connections",
            "Connections refused before any request, by reason",
            m.refused_connections.clone(),
        );
        r.register(
            "refused_streams",
            "ADS streams closed for going over a limit, by limit",
            m.refused_streams.clone(),
        );
        r.register(
            "dropped_nack_events",
            "NACK events dropped because their consumer fell behind",
            m.dropped_nack_events.clone(),
        );
        r.register(
            "subscription_bytes",
            "Bytes of resource names and versions the ADS streams keep of their own",
            m.subscription_bytes.clone(),
        );
        r.register(
            "request_bytes",
            "Bytes of discovery requests still being received by the ADS streams",
            m.request_bytes.clone(),
        );
        m
    }

    pub fn kind(kind: ResourceType) -> TypeLabels {
        TypeLabels {
            resource_type: KindLabel(kind),
        }
    }

    pub fn observe(family: &HistogramFamily<TypeLabels>, kind: ResourceType, d: Duration) {
        family
            .get_or_create(&Self::kind(kind))
            .observe(d.as_secs_f64());
    }

    pub fn refused(&self, reason: RefusalReason) {
        self.refused_connections
            .get_or_create(&RefusalLabels { reason })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    #[test]
    fn metrics_encode_with_bounded_labels() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.acks
            .get_or_create(&Metrics::kind(ResourceType::Listener))
            .inc();
        Metrics::observe(
            &m.convergence_latency,
            ResourceType::Cluster,
            Duration::from_millis(3),
        );
        m.refused(RefusalReason::NoNamespaceIdentity);
        m.connected_proxies
            .get_or_create(&ProtocolLabels {
                protocol: Protocol::Delta,
            })
            .inc();
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("marin3r_xds_acks_total{resource_type=\"listeners\"} 1"),
            "{text}"
        );
        // NACK series exist before any NACK, at 0, for every type.
        assert!(
            text.contains("marin3r_xds_nacks_total{resource_type=\"secrets\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("marin3r_xds_refused_connections_total{reason=\"handshake\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("marin3r_xds_refused_streams_total{limit=\"name_size\"} 0"),
            "{text}"
        );
        // Multi-word resource types in snake_case, like every label value.
        for kind in ["scoped_routes", "extension_configs"] {
            let series = format!("marin3r_xds_nacks_total{{resource_type=\"{kind}\"}} 0");
            assert!(text.contains(&series), "{text}");
        }
        assert!(text.contains(
            "marin3r_xds_convergence_latency_seconds_count{resource_type=\"clusters\"} 1"
        ));
        assert!(
            text.contains(
                "marin3r_xds_refused_connections_total{reason=\"no_namespace_identity\"} 1"
            )
        );
        assert!(text.contains("marin3r_xds_connected_proxies{protocol=\"delta\"} 1"));
    }
}
