//! How far the proxies of an `EnvoyConfig`'s node got with its published version: each
//! discovery replica counts the proxies connected to it (`status.syncReports`, one entry per
//! replica), and the leader sums the live replicas' counts into `status.proxies` and the
//! `Synced` condition, which GitOps tools and `kubectl wait` read.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The condition that is True when every connected proxy of the node has acknowledged the
/// desired version.
pub const SYNCED: &str = "Synced";

/// One discovery replica's count of the node's proxies connected to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncReport {
    /// The discovery pod that counted (its name).
    pub replica: String,
    /// The revision version this replica serves the node (`spec.version` of the revision).
    pub version: String,
    /// The node's proxies connected to that replica.
    pub connected: u32,
    /// How many of them acknowledged every resource type of `version` they were sent.
    pub acked: u32,
    /// How many rejected a resource type of `version` (their latest answer was a NACK).
    pub nacked: u32,
    /// When the replica counted.
    pub reported_at: Time,
    /// While the config's rollout is in a canary step: the node's proxies on this replica, as
    /// the leader needs them to choose the canaries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryReport>,
}

/// The most hashes one replica reports for a canary step.
pub const MAX_CANARY_HASHES: usize = 32;

/// One replica's proxies of a node, for a rollout of `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryReport {
    /// The version rolled out (the hash's salt).
    pub version: String,
    /// How many distinct proxies (by address) of the node are connected to this replica.
    pub proxies: u32,
    /// The lowest hashes of those proxies under `version`, 16 hex digits each, at most 32,
    /// lowest first.
    #[schemars(length(max = 32))]
    pub lowest: Vec<String>,
    /// The traffic of this replica's proxies during the current step, per track, for the
    /// health analysis; absent until their stats were read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<StepTraffic>,
}

/// What one replica read of its proxies' stats during one step: the counters' growth since
/// the step began (or since the proxy restarted), summed per track.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepTraffic {
    /// The step (from 1) the counts are about.
    pub step: u32,
    /// The proxies on the canary track.
    pub canary: Traffic,
    /// The proxies on the stable track (a sample of them on a large node).
    pub stable: Traffic,
    /// How many proxies' stats could not be read at the last attempt.
    #[serde(default)]
    pub unread: u32,
}

/// Counts of Envoy's stats over some proxies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Traffic {
    /// How many proxies were read.
    pub proxies: u32,
    /// Downstream HTTP requests (`downstream_rq_total`).
    pub requests: u64,
    /// Of them, answered with a 5xx (`downstream_rq_5xx`).
    pub errors_5xx: u64,
    /// Requests sent upstream plus failed connects (`upstream_rq_total`,
    /// `upstream_cx_connect_fail`).
    pub upstream_attempts: u64,
    /// Failed upstream attempts: connect failures, resets by the upstream, timeouts.
    pub upstream_failures: u64,
}

impl Traffic {
    /// The sum of two counts, saturating.
    pub fn plus(self, other: Self) -> Self {
        Self {
            proxies: self.proxies.saturating_add(other.proxies),
            requests: self.requests.saturating_add(other.requests),
            errors_5xx: self.errors_5xx.saturating_add(other.errors_5xx),
            upstream_attempts: self
                .upstream_attempts
                .saturating_add(other.upstream_attempts),
            upstream_failures: self
                .upstream_failures
                .saturating_add(other.upstream_failures),
        }
    }
}

/// `status.proxies`: the sum over the live discovery replicas, for the published version.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxySync {
    /// The published version the counts are about.
    pub version: String,
    /// The node's proxies connected to any discovery replica.
    pub connected: u32,
    /// How many acknowledged the published version.
    pub acked: u32,
    /// How many rejected it.
    pub nacked: u32,
    /// How many have not answered it yet (connected, neither acked nor nacked).
    pub pending: u32,
    /// `acked/connected`, the `SYNCED` column of `kubectl get envoyconfigs`.
    pub synced: String,
}

impl ProxySync {
    /// The sum of `reports` (already restricted to live replicas) for `version`: a replica
    /// still serving another version counts its proxies as pending.
    pub fn sum<'a>(version: &str, reports: impl IntoIterator<Item = &'a SyncReport>) -> Self {
        let mut sum = Self {
            version: version.to_owned(),
            ..Self::default()
        };
        for r in reports {
            sum.connected = sum.connected.saturating_add(r.connected);
            if r.version == version {
                sum.acked = sum.acked.saturating_add(r.acked.min(r.connected));
                let nacked = r.nacked.min(r.connected.saturating_sub(r.acked));
                sum.nacked = sum.nacked.saturating_add(nacked);
            }
        }
        sum.pending = sum.connected - sum.acked - sum.nacked;
        sum.synced = format!("{}/{}", sum.acked, sum.connected);
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(replica: &str, version: &str, connected: u32, acked: u32, nacked: u32) -> SyncReport {
        SyncReport {
            replica: replica.into(),
            version: version.into(),
            connected,
            acked,
            nacked,
            reported_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            canary: None,
        }
    }

    #[test]
    fn replicas_are_summed_and_other_versions_are_pending() {
        let reports = [
            report("a", "v2", 3, 2, 1),
            report("b", "v2", 2, 2, 0),
            // A replica that has not loaded v2 yet: its proxies wait for it.
            report("c", "v1", 4, 4, 0),
        ];
        let sum = ProxySync::sum("v2", &reports);
        assert_eq!(
            (sum.connected, sum.acked, sum.nacked, sum.pending),
            (9, 4, 1, 4)
        );
        assert_eq!(sum.synced, "4/9");
        let none = ProxySync::sum("v2", &[]);
        assert_eq!(
            (none.connected, none.pending, none.synced.as_str()),
            (0, 0, "0/0")
        );
    }

    #[test]
    fn a_report_that_counts_more_than_it_has_cannot_underflow() {
        // Written by hand, or by a broken replica: acked + nacked over connected.
        let sum = ProxySync::sum("v", &[report("a", "v", 2, 5, 7)]);
        assert_eq!(
            (sum.connected, sum.acked, sum.nacked, sum.pending),
            (2, 2, 0, 0)
        );
        let sum = ProxySync::sum(
            "v",
            &[report("a", "v", u32::MAX, 1, 0), report("b", "v", 9, 0, 0)],
        );
        assert_eq!(sum.connected, u32::MAX);
        assert!(sum.acked + sum.nacked + sum.pending == sum.connected);
    }
}
