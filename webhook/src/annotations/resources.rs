//! The sidecar's resources (each annotation, else the cluster's default) and its layout
//! (native or classic, holding the applications or not) and whether the pod is annotated for
//! Prometheus: the parts of [`Reader`] that fall back on the cluster's defaults for the pod
//! as a whole.

use super::grammar::parse_bool;
use super::names::*;
use super::{Layout, Reader};
use crate::config::Resources;
use crate::quantity::parse_quantity;

impl Reader<'_> {
    /// The sidecar's requests and limits, each from its annotation or else the cluster's
    /// default; a request may not exceed its limit.
    pub(super) fn resources(&mut self) -> Resources {
        let defaults = &self.config.resources;
        let mut quantity = |name: &'static str, default: &Option<String>| match self.get(name) {
            Some(_) => self.value(name, |v| parse_quantity(v).map(|q| (v.to_owned(), q))),
            None => default
                .as_ref()
                .and_then(|d| parse_quantity(d).ok().map(|q| (d.clone(), q))),
        };
        let requests_cpu = quantity(REQUESTS_CPU, &defaults.requests_cpu);
        let requests_memory = quantity(REQUESTS_MEMORY, &defaults.requests_memory);
        let limits_cpu = quantity(LIMITS_CPU, &defaults.limits_cpu);
        let limits_memory = quantity(LIMITS_MEMORY, &defaults.limits_memory);
        for (request_name, request, limit, limit_name) in [
            (REQUESTS_CPU, &requests_cpu, &limits_cpu, LIMITS_CPU),
            (
                REQUESTS_MEMORY,
                &requests_memory,
                &limits_memory,
                LIMITS_MEMORY,
            ),
        ] {
            if let (Some((r, rq)), Some((l, lq))) = (request, limit)
                && rq > lq
            {
                self.reject_request_over_limit((request_name, r), (limit_name, l));
            }
        }
        let text = |q: Option<(String, f64)>| q.map(|(v, _)| v);
        let (requests_cpu, requests_memory) = (text(requests_cpu), text(requests_memory));
        let (limits_cpu, limits_memory) = (text(limits_cpu), text(limits_memory));
        Resources {
            requests_cpu,
            requests_memory,
            limits_cpu,
            limits_memory,
        }
    }

    /// A request over its limit, blamed on the annotation when one of the two is the
    /// cluster's default (a DiscoveryService's `spec.sidecar.resources`).
    fn reject_request_over_limit(
        &mut self,
        request: (&'static str, &str),
        limit: (&'static str, &str),
    ) {
        let (request_name, request_value) = request;
        let (limit_name, limit_value) = limit;
        if self.get(request_name).is_some() {
            let default = if self.get(limit_name).is_some() {
                ""
            } else {
                " (the cluster default)"
            };
            let reason = format!(
                "the request is greater than the limit {limit_name}={limit_value:?}{default}"
            );
            self.reject(request_name, request_value, reason);
        } else {
            let reason = format!(
                "the limit is less than the request {request_name}={request_value:?} (the cluster default)"
            );
            self.reject(limit_name, limit_value, reason);
        }
    }

    /// Native or classic, and in the classic layout whether the applications wait for Envoy.
    pub(super) fn layout(&mut self) -> Layout {
        let config = self.config;
        let native = self.value(NATIVE_SIDECAR, parse_bool);
        let hold = self.value(HOLD_APPLICATION, parse_bool);
        if native.unwrap_or(config.native_sidecars) {
            if hold == Some(false) {
                self.warnings.push(format!(
                    "{HOLD_APPLICATION}=\"false\" has no effect on a native sidecar: Kubernetes \
                     starts the applications once Envoy's startup probe passes"
                ));
            }
            return Layout::Native;
        }
        Layout::Classic {
            hold: hold.unwrap_or(config.hold_application),
        }
    }

    /// Whether the webhook annotates the pod for Prometheus (`prometheus.io/*`).
    pub(super) fn prometheus_annotations(&mut self) -> bool {
        let config = self.config;
        self.value(PROMETHEUS_ANNOTATIONS, parse_bool)
            .unwrap_or(config.prometheus_annotations)
    }
}
