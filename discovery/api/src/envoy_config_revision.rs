//! The `EnvoyConfigRevision` resource (`marin3r.3scale.net/v1alpha1`): one version of an
//! `EnvoyConfig`'s resources, owned by it and named `<nodeID>-<version>`. Which revision is
//! published is decided by the `EnvoyConfig` controller and recorded in this status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_derive::CustomResource;
use marin3r_controller::set_condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::envoy_config::{EnvoyApi, EnvoyConfigSpec, EnvoyResources, Serialization};
use super::resources::Resource;

/// The label holding a revision's node id.
pub const NODE_ID_LABEL: &str = "marin3r.3scale.net/node-id";
/// The label holding a revision's version.
pub const VERSION_LABEL: &str = "marin3r.3scale.net/config-version";
/// The label holding a revision's Envoy API version (`v3`), as the original MARIN3R sets it.
pub const ENVOY_API_LABEL: &str = "marin3r.3scale.net/envoy-api";

/// Condition: the revision is the one served to its node.
pub const REVISION_PUBLISHED: &str = "RevisionPublished";
/// Condition: Envoy rejected this revision; it is never published again while another can be.
pub const REVISION_TAINTED: &str = "RevisionTainted";
/// Condition: the revision's resources could not be (re)loaded into the xDS cache (the
/// original v0.6 name; kept, beside its opposite below, for tooling written for v0.6).
pub const RESOURCES_OUT_OF_SYNC: &str = "ResourcesOutOfSync";
/// Condition: the published revision's resources are in the xDS cache (the original HEAD
/// name, the opposite of [`RESOURCES_OUT_OF_SYNC`] with the same reason and message). Only a
/// published revision carries it, as in HEAD.
pub const RESOURCES_IN_SYNC: &str = "ResourcesInSync";

marin3r_controller::reasons! {
    /// The reasons of a revision's conditions and Events. Three writers share them: the
    /// `EnvoyConfig` controller (published or not), the revision loader and the NACK consumer.
    pub enum RevisionReason {
        Published,
        Unpublished,
        ResourcesLoaded,
        /// Its resources no longer convert, or cannot be served together.
        InvalidResources,
        /// It references a Secret of another namespace, which its discovery service refuses.
        SecretForbidden,
        SecretNotFound,
        /// A referenced Secret's type or data cannot make the SDS secret asked of it.
        SecretInvalid,
        /// The EndpointSlices of a `generateFromEndpointSlices` resource cannot make its
        /// endpoints.
        EndpointsInvalid,
        SecretChanged,
        RejectedByEnvoy,
        /// Its canaries did worse than the stable proxies during a rollout step
        /// (`spec.rollout.analysis`).
        FailedAnalysis,
        RevisionTainted,
    }
}

/// Whether `reason`, of `ResourcesOutOfSync=True`, says the revision cannot be loaded (and
/// so is not served). `LoadFailed` is the one reason earlier builds wrote for every such
/// failure, still on a revision not reloaded since.
pub fn is_load_failure(reason: &str) -> bool {
    use RevisionReason as R;
    [
        R::InvalidResources,
        R::SecretForbidden,
        R::SecretNotFound,
        R::SecretInvalid,
        R::EndpointsInvalid,
    ]
    .iter()
    .any(|r| r.to_string() == reason)
        || reason == "LoadFailed"
}

/// One version of an `EnvoyConfig`'s resources.
#[derive(
    CustomResource, Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "marin3r.3scale.net",
    version = "v1alpha1",
    kind = "EnvoyConfigRevision",
    namespaced,
    shortname = "ecr",
    category = "marin3r",
    doc = "One version of an EnvoyConfig's resources, owned by it and named <nodeID>-<version>. The EnvoyConfig controller decides which revision is published; the published one is served to the proxies of its node.",
    status = "EnvoyConfigRevisionStatus",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Node ID","type":"string","jsonPath":".spec.nodeID"}"#,
    printcolumn = r#"{"name":"Envoy API","type":"string","jsonPath":".spec.envoyAPI"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version"}"#,
    printcolumn = r#"{"name":"Published","type":"boolean","jsonPath":".status.published"}"#,
    printcolumn = r#"{"name":"Created At","type":"string","format":"date-time","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Last Published At","type":"string","format":"date-time","jsonPath":".status.lastPublishedAt"}"#,
    printcolumn = r#"{"name":"Tainted","type":"boolean","jsonPath":".status.tainted"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyConfigRevisionSpec {
    /// The node id of the proxies this revision is for (their `node.id`).
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// The hash of the owning `EnvoyConfig`'s resources.
    pub version: String,
    #[serde(default, rename = "envoyAPI", skip_serializing_if = "Option::is_none")]
    pub envoy_api: Option<EnvoyApi>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serialization: Option<Serialization>,
    #[serde(default, skip_serializing_if = "EnvoyResources::is_empty")]
    pub envoy_resources: EnvoyResources,
    /// The owning `EnvoyConfig`'s `spec.resources` at this version.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<Resource>,
    /// The owning `EnvoyConfig`'s `spec.nackThreshold` at this version (part of it): how many
    /// times one proxy rejects this revision's resources before it counts as rejecting them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10))]
    pub nack_threshold: Option<u8>,
}

impl EnvoyConfigRevisionSpec {
    /// The revision of a config at `version`.
    pub fn of(config: &EnvoyConfigSpec, version: &str) -> Self {
        Self {
            node_id: config.node_id.clone(),
            version: version.to_owned(),
            envoy_api: Some(config.envoy_api),
            serialization: Some(config.serialization),
            envoy_resources: config.envoy_resources.clone(),
            resources: config.resources.clone(),
            nack_threshold: config.nack_threshold,
        }
    }

    /// How many resources it lists (`envoyResources` and `resources` together).
    pub fn entries(&self) -> usize {
        self.envoy_resources.len() + self.resources.len()
    }

    /// The config this revision holds, for conversion (a copy: where only the resources are
    /// read, borrow them instead).
    pub fn config(&self) -> EnvoyConfigSpec {
        EnvoyConfigSpec {
            node_id: self.node_id.clone(),
            serialization: self.serialization.unwrap_or_default(),
            envoy_api: self.envoy_api.unwrap_or_default(),
            envoy_resources: self.envoy_resources.clone(),
            resources: self.resources.clone(),
            nack_threshold: self.nack_threshold,
            rollout: None,
        }
    }
}

/// `status` of an `EnvoyConfigRevision`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyConfigRevisionStatus {
    /// This revision is the one served to its node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<bool>,
    /// When it was last published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_published_at: Option<Time>,
    /// Envoy rejected it (NACK): it is not published again while an untainted revision
    /// exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tainted: Option<bool>,
    /// The version of each resource type this revision serves, as Envoy sees it in
    /// `version_info`; set when it is loaded into the xDS cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provides_versions: Option<VersionTracker>,
    /// `RevisionPublished`, `RevisionTainted`, `ResourcesInSync` (while published) and its
    /// opposite `ResourcesOutOfSync`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// What each discovery replica saw of the NACKs of this revision, one entry per
    /// replica (keyed by `replica`). Each replica writes only its own entry; the leader sums
    /// the entries of live replicas against the taint threshold and taints once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["replica"]))]
    pub nack_reports: Vec<NackReport>,
    /// While the revision is served to some of its node's proxies ahead of the others (a
    /// rollout step), which ones: written by the leader, read by every discovery replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<RevisionCanary>,
}

/// `status.canary` of a revision in a rollout step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionCanary {
    /// The step (from 1).
    pub step: u32,
    /// The proxies whose hash (of this revision's version, their namespace, node id and
    /// address) is at most this, 16 hex digits, get this revision.
    pub cutoff: String,
}

impl RevisionCanary {
    /// The cutoff as a number; None when it is not 16 hex digits.
    pub fn cutoff(&self) -> Option<u64> {
        if self.cutoff.len() != 16 {
            return None;
        }
        u64::from_str_radix(&self.cutoff, 16).ok()
    }

    pub fn new(step: u32, cutoff: u64) -> Self {
        Self {
            step,
            cutoff: format!("{cutoff:016x}"),
        }
    }
}

/// One discovery replica's count of the proxies of a revision's node that rejected it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NackReport {
    /// The discovery pod that counted (its name).
    pub replica: String,
    /// The proxies of the node connected to that replica when it counted.
    pub connected_proxies: u32,
    /// How many of them had rejected `version`.
    pub rejecting_proxies: u32,
    /// The resource type rejected (`listeners`, `clusters`, ...).
    pub resource_type: String,
    /// The version Envoy rejected (`version_info`).
    pub version: String,
    /// Envoy's error text, from a rejecting proxy of that replica (empty when none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The pod of a rejecting proxy, from its node metadata, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_pod: Option<String>,
    /// When the replica counted; reports older than the report lifetime are ignored.
    pub reported_at: Time,
}

/// `status.providesVersions`: the version served for each resource type (empty types are
/// left out).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VersionTracker {
    /// The version of the `ClusterLoadAssignment`s served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<String>,
    /// The version of the `Cluster`s served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters: Option<String>,
    /// The version of the `RouteConfiguration`s served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<String>,
    /// The version of the `ScopedRouteConfiguration`s served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scoped_routes: Option<String>,
    /// The version of the `Listener`s served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listeners: Option<String>,
    /// The version of the SDS `Secret`s served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<String>,
    /// The version of the runtime layers served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtimes: Option<String>,
    /// The version of the `TypedExtensionConfig`s served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension_configs: Option<String>,
}

impl EnvoyConfigRevisionStatus {
    /// Sets `ResourcesInSync` and `ResourcesOutOfSync` together, opposite to each other with
    /// the same reason and message; true when `ResourcesOutOfSync` changed status or reason.
    pub fn set_resources_sync(
        &mut self,
        in_sync: bool,
        reason: RevisionReason,
        message: &str,
        generation: Option<i64>,
        now: &Time,
    ) -> bool {
        let conditions = &mut self.conditions;
        set_condition(
            conditions,
            RESOURCES_IN_SYNC,
            in_sync,
            reason,
            message,
            generation,
            now,
        );
        set_condition(
            conditions,
            RESOURCES_OUT_OF_SYNC,
            !in_sync,
            reason,
            message,
            generation,
            now,
        )
    }

    /// Removes `ResourcesInSync`, which only a published revision carries; true when it was
    /// there. `ResourcesOutOfSync` keeps its last value, as v0.6 left it.
    pub fn clear_resources_in_sync(&mut self) -> bool {
        let before = self.conditions.len();
        self.conditions.retain(|c| c.type_ != RESOURCES_IN_SYNC);
        self.conditions.len() != before
    }
}

impl EnvoyConfigRevision {
    pub fn is_published(&self) -> bool {
        self.status.as_ref().and_then(|s| s.published) == Some(true)
    }

    pub fn is_tainted(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.tainted == Some(true)
                || s.conditions
                    .iter()
                    .any(|c| c.type_ == REVISION_TAINTED && c.status == "True")
        })
    }

    /// Why the revision cannot be loaded (the message of `ResourcesOutOfSync=True` with
    /// one of the load failures' reasons), if it cannot.
    pub fn load_failure(&self) -> Option<&str> {
        self.status.as_ref()?.conditions.iter().find_map(|c| {
            (c.type_ == RESOURCES_OUT_OF_SYNC && c.status == "True" && is_load_failure(&c.reason))
                .then_some(c.message.as_str())
        })
    }

    /// Whether its last load into the xDS cache succeeded (`ResourcesOutOfSync=False`, which
    /// stays after it is unpublished): what a running replica still serves until a
    /// successor loads.
    pub fn is_loaded(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == RESOURCES_OUT_OF_SYNC && c.status == "False")
        })
    }

    /// Its canary step and cutoff, while it is served to some of its node's proxies ahead of
    /// the others; never for a tainted or published revision.
    pub fn canary(&self) -> Option<(u32, u64)> {
        if self.is_tainted() || self.is_published() {
            return None;
        }
        let canary = self.status.as_ref()?.canary.as_ref()?;
        Some((canary.step, canary.cutoff()?))
    }

    /// The `RevisionTainted` condition, when tainted: its reason and message.
    pub fn taint_condition(&self) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == REVISION_TAINTED && c.status == "True")
    }

    /// The message of the `RevisionTainted` condition, when tainted.
    pub fn taint_message(&self) -> Option<&str> {
        self.taint_condition().map(|c| c.message.as_str())
    }
}
