//! What the certificates look like now, read from the controller's cache when Prometheus
//! scrapes: when each expires, when it is due for renewal, and whether it is ready. One series per certificate (its
//! namespace and name), as cert-manager does, since an alert must say which one; they go
//! with the object, so a deleted certificate leaves no stale series.

use std::sync::{Arc, Mutex, PoisonError};

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::api::DiscoveryServiceCertificate;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabels {
    namespace: String,
    name: String,
}

type Gauges = Family<CertificateLabels, Gauge>;

/// The certificate gauges. Cheap to clone; empty until a controller runs with it (on the
/// operator replica that leads).
#[derive(Clone, Default)]
pub struct CertificateMetrics {
    store: Arc<Mutex<Option<Store<DiscoveryServiceCertificate>>>>,
}

impl std::fmt::Debug for CertificateMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateMetrics").finish_non_exhaustive()
    }
}

impl CertificateMetrics {
    /// Adds `marin3r_certificate_expiration_timestamp_seconds{namespace,name}`,
    /// `marin3r_certificate_renewal_timestamp_seconds{namespace,name}` and
    /// `marin3r_certificate_ready{namespace,name}` to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(self.clone()));
    }

    /// Reports the certificates of `store` from now on.
    pub(super) fn watch(&self, store: Store<DiscoveryServiceCertificate>) {
        *self.store.lock().unwrap_or_else(PoisonError::into_inner) = Some(store);
    }

    /// (expiry and renewal as Unix seconds, ready as 0 or 1) per certificate; expiry only
    /// once issued, renewal only while renewal is on.
    fn families(&self) -> (Gauges, Gauges, Gauges) {
        let (expiry, renewal, ready) = (Gauges::default(), Gauges::default(), Gauges::default());
        let store = self
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for dsc in store.iter().flat_map(Store::state) {
            let labels = CertificateLabels {
                namespace: dsc.namespace().unwrap_or_default(),
                name: dsc.name_any(),
            };
            let status = dsc.status.as_ref();
            if let Some(not_after) = status.and_then(|s| s.not_after.as_ref()) {
                expiry.get_or_create(&labels).set(not_after.0.as_second());
            }
            if let Some(due) = status.and_then(|s| s.renewal_time.as_ref()) {
                renewal.get_or_create(&labels).set(due.0.as_second());
            }
            let is_ready = status.and_then(|s| s.ready) == Some(true);
            ready.get_or_create(&labels).set(i64::from(is_ready));
        }
        (expiry, renewal, ready)
    }
}

impl Collector for CertificateMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (expiry, renewal, ready) = self.families();
        expiry.encode(encoder.encode_descriptor(
            "marin3r_certificate_expiration_timestamp_seconds",
            "When the certificate of a DiscoveryServiceCertificate expires (its status.notAfter), as Unix time",
            None,
            expiry.metric_type(),
        )?)?;
        renewal.encode(encoder.encode_descriptor(
            "marin3r_certificate_renewal_timestamp_seconds",
            "When a DiscoveryServiceCertificate is due for renewal (its status.renewalTime), as Unix time; a past value that stays says renewal is stuck",
            None,
            renewal.metric_type(),
        )?)?;
        ready.encode(encoder.encode_descriptor(
            "marin3r_certificate_ready",
            "Whether a DiscoveryServiceCertificate is ready (1: its Secret holds a valid certificate matching the spec) or not (0)",
            None,
            ready.metric_type(),
        )?)?;
        Ok(())
    }
}
