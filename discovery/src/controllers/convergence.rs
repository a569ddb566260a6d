//! Convergence in `EnvoyConfig` status: whether the published version reached the fleet.
//!
//! Each discovery replica knows only the proxies connected to it, so the count goes through
//! the API, as the NACK reports do: every replica, every [`PERIOD`], counts the proxies of
//! each node it serves against the snapshot it serves them (acknowledged, rejected, not
//! answered yet) and writes its own entry of the config's `status.syncReports` when the count
//! changed; the leader sums the entries of the live replicas into `status.proxies` (the
//! `SYNCED` column) and the `Synced` condition, and drops the entries of replicas that are
//! gone. Writes happen only on change, at most [`WRITES_PER_PERIOD`] per period per replica,
//! each guarded by the resourceVersion read, so concurrent writers never lose an entry.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kube::{Api, ResourceExt};
use marin3r_controller::{patch_status, set_condition};
use tracing::{debug, warn};

use super::{Context, Error};
use marin3r_api::EnvoyConfig;
use marin3r_api::envoy_config::EnvoyConfigStatus;
use marin3r_api::proxy_sync::{CanaryReport, MAX_CANARY_HASHES, ProxySync, SYNCED, SyncReport};
use marin3r_api::rollout::RolloutPhase;
use marin3r_xds::convergence::{self, Convergence};
use marin3r_xds::{NodeKey, proxy_identity, track_hash};

/// How often replicas count and the leader sums.
pub const PERIOD: Duration = Duration::from_secs(2);

/// The most status writes one replica (or the leader) makes per period; the rest wait for
/// the next period, in turn, so a fleet that changes at once is paced, not dropped.
const WRITES_PER_PERIOD: usize = 50;

/// The most reports the leader reads on one config (one per replica; more means someone
/// other than the replicas wrote them).
const MAX_REPORTS: usize = 64;

marin3r_controller::reasons! {
    /// The reasons of the `Synced` condition.
    pub enum SyncReason {
        /// Every connected proxy acknowledged the desired version.
        AllProxiesSynced,
        /// The desired version is published and no proxy of the node is connected.
        NoProxiesConnected,
        /// Some connected proxies have not answered the desired version yet.
        ProxiesPending,
        /// Some connected proxies rejected the desired version.
        ProxiesRejected,
        /// The desired version is not what is published (invalid, rolled back, or not yet).
        DesiredVersionNotPublished,
    }
}

/// The `Synced` condition for a status and the sum of its reports: (status, reason, message).
pub fn synced(
    status: &EnvoyConfigStatus,
    sum: &ProxySync,
    node: &str,
) -> (bool, SyncReason, String) {
    let published = status.published_version.as_deref();
    let desired = status.desired_version.as_deref();
    let (Some(published), Some(desired)) = (published, desired) else {
        let message = "no version is published yet".to_owned();
        return (false, SyncReason::DesiredVersionNotPublished, message);
    };
    if published != desired {
        let message = format!(
            "the desired version {desired} is not published; proxies are served version {published}"
        );
        return (false, SyncReason::DesiredVersionNotPublished, message);
    }
    let of = |n: u32| format!("{n} of {} connected proxies", sum.connected);
    if sum.nacked > 0 {
        let message = format!("{} rejected version {published}", of(sum.nacked));
        return (false, SyncReason::ProxiesRejected, message);
    }
    if sum.pending > 0 {
        let message = format!(
            "{} have not acknowledged version {published} yet",
            of(sum.pending)
        );
        return (false, SyncReason::ProxiesPending, message);
    }
    if sum.connected == 0 {
        let message =
            format!("version {published} is published; no proxy of node {node} is connected");
        return (true, SyncReason::NoProxiesConnected, message);
    }
    let message = format!(
        "all {} connected proxies acknowledged version {published}",
        sum.connected
    );
    (true, SyncReason::AllProxiesSynced, message)
}

/// Every replica: counts its proxies of each served node and writes its report where the
/// count changed, until `stop`.
pub(crate) async fn report(ctx: Arc<Context>, stop: impl Future<Output = ()>) {
    tokio::pin!(stop);
    let mut turn = 0usize;
    loop {
        let Some(store) = super::next_turn(&ctx, &mut stop, PERIOD).await else {
            return;
        };
        let status = ctx.config.proxies.snapshot();
        let nodes = convergence::by_node(&status);
        let mut configs = store.state();
        configs.sort_by_key(|ec| (ec.namespace(), ec.name_any()));
        let mut writes = 0;
        // A different first config each period, so a cap reached never starves the same ones.
        let start = turn % configs.len().max(1);
        turn = turn.wrapping_add(WRITES_PER_PERIOD);
        for ec in configs[start..].iter().chain(&configs[..start]) {
            if writes == WRITES_PER_PERIOD {
                break;
            }
            let ns = ec.namespace().unwrap_or_default();
            // The store holds every namespace's configs: another discovery service's are its
            // replicas' to report on (a replica of the same name there would be overwritten).
            if !ctx.writes_for(&ns).await {
                continue;
            }
            let key = NodeKey::new(ns.clone(), ec.spec.node_id.clone());
            let proxies = nodes.get(&(ns.as_str(), ec.spec.node_id.as_str()));
            let count = ctx.publisher.current(&key).and_then(|load| {
                let c = convergence::count(proxies?.iter().copied(), &load.types);
                (c.connected > 0).then_some((load.version, c))
            });
            let canary = proxies.and_then(|p| canary_report(ec, &key, p, &ctx.traffic));
            let entry = Entry { count, canary };
            if let Some(wrote) = write_report(&ctx, ec, &entry).await {
                writes += 1;
                if let Err(e) = wrote {
                    debug!(error = %e, namespace = %ns, config = %ec.name_any(), "could not write this replica's sync report; next period");
                }
            }
        }
    }
}

/// This replica's entry of a config's sync reports.
struct Entry {
    count: Option<(String, Convergence)>,
    canary: Option<CanaryReport>,
}

/// Writes `entry` into `ec`'s reports when it changed: None when it had not. A write refused
/// because another writer came first (the other replicas, the leader: while a rollout steps
/// they all write often) is tried once more on a fresh read, so a busy config does not leave
/// this replica's counts, which the health analysis judges, a period behind each time.
async fn write_report(ctx: &Context, ec: &EnvoyConfig, entry: &Entry) -> Option<Result<(), Error>> {
    let me = &ctx.config.replica;
    let reports = reports_with(ec, me, entry.count.clone(), entry.canary.clone())?;
    let first = write(ctx, ec, serde_json::json!({ "syncReports": reports })).await;
    if first.is_ok() {
        return Some(first);
    }
    let api: Api<EnvoyConfig> =
        Api::namespaced(ctx.client.clone(), &ec.namespace().unwrap_or_default());
    let fresh = match api.get_opt(&ec.name_any()).await {
        Ok(Some(fresh)) if fresh.uid() == ec.uid() => fresh,
        _ => return Some(first),
    };
    let Some(reports) = reports_with(&fresh, me, entry.count.clone(), entry.canary.clone()) else {
        return Some(Ok(()));
    };
    Some(write(ctx, &fresh, serde_json::json!({ "syncReports": reports })).await)
}

/// While `ec`'s rollout is in a canary step: this replica's proxies of its node (`proxies`),
/// counted once per address, the lowest of their hashes under the version rolled out, and
/// what `book` read of their traffic in the step.
fn canary_report(
    ec: &EnvoyConfig,
    key: &NodeKey,
    proxies: &[&marin3r_xds::ProxyStatus],
    book: &super::traffic::Book,
) -> Option<CanaryReport> {
    let rollout = ec.status.as_ref()?.rollout.as_ref()?;
    if !matches!(
        rollout.phase,
        RolloutPhase::Progressing | RolloutPhase::Paused
    ) {
        return None;
    }
    let identities: BTreeSet<String> = proxies.iter().map(|p| proxy_identity(p)).collect();
    let mut hashes: Vec<u64> = identities
        .iter()
        .map(|ip| track_hash(&rollout.version, key, ip))
        .collect();
    hashes.sort_unstable();
    Some(CanaryReport {
        version: rollout.version.clone(),
        proxies: u32::try_from(identities.len()).unwrap_or(u32::MAX),
        lowest: hashes
            .iter()
            .take(MAX_CANARY_HASHES)
            .map(|h| format!("{h:016x}"))
            .collect(),
        traffic: rollout
            .step
            .and_then(|step| book.traffic(&key.namespace, &ec.name_any(), &rollout.version, step)),
    })
}

/// The config's reports with this replica's entry replaced by `count` and `canary` (removed
/// when `count` is `None`); `None` when its entry already says so.
fn reports_with(
    ec: &EnvoyConfig,
    me: &str,
    count: Option<(String, Convergence)>,
    canary: Option<CanaryReport>,
) -> Option<Vec<SyncReport>> {
    let reports = ec
        .status
        .as_ref()
        .map(|s| s.sync_reports.as_slice())
        .unwrap_or_default();
    let mine = reports.iter().find(|r| r.replica == me);
    let entry = count.map(|(version, c)| SyncReport {
        replica: me.to_owned(),
        version,
        connected: u32::try_from(c.connected).unwrap_or(u32::MAX),
        acked: u32::try_from(c.acked).unwrap_or(u32::MAX),
        nacked: u32::try_from(c.nacked).unwrap_or(u32::MAX),
        reported_at: super::now(),
        canary,
    });
    let same = match (mine, &entry) {
        (None, None) => true,
        (Some(old), Some(new)) => {
            (
                &old.version,
                old.connected,
                old.acked,
                old.nacked,
                &old.canary,
            ) == (
                &new.version,
                new.connected,
                new.acked,
                new.nacked,
                &new.canary,
            )
        }
        _ => false,
    };
    if same {
        return None;
    }
    let mut reports: Vec<SyncReport> = reports
        .iter()
        .filter(|r| r.replica != me)
        .cloned()
        .collect();
    reports.extend(entry);
    reports.sort_by(|a, b| a.replica.cmp(&b.replica));
    Some(reports)
}

/// The leader: sums the live replicas' reports of every config into `status.proxies` and
/// the `Synced` condition, and exports them as `marin3r_envoyconfig_proxies`, until `stop`.
pub(crate) async fn sum(ctx: Arc<Context>, stop: impl Future<Output = ()>) {
    tokio::pin!(stop);
    // `marin3r_envoyconfig_proxies` reports the sums while this replica writes them.
    let serves = {
        let ctx = Arc::clone(&ctx);
        Arc::new(move |ns: &str| ctx.serves_now(ns))
    };
    let _reporting = ctx
        .metrics
        .proxies
        .report(ctx.index.configs.store(), serves);
    loop {
        let Some(store) = super::next_turn(&ctx, &mut stop, PERIOD).await else {
            return;
        };
        let live = match super::nacks::live_replicas(&ctx).await {
            Ok(live) => live,
            Err(e) => {
                warn!(error = %e, "could not list the discovery pods; proxy counts wait");
                continue;
            }
        };
        let mut writes = 0;
        for ec in store.state() {
            if writes == WRITES_PER_PERIOD {
                break;
            }
            // The store holds every namespace's configs: another discovery service's are
            // summed by its own leader, whose replicas these are not.
            if !ctx.writes_for(&ec.namespace().unwrap_or_default()).await {
                continue;
            }
            let Some(patch) = summed(&ec, live.as_ref(), &super::now()) else {
                continue;
            };
            writes += 1;
            if let Err(e) = write(&ctx, &ec, patch).await {
                debug!(error = %e, namespace = ?ec.namespace(), config = %ec.name_any(), "could not write the proxy counts; next period");
            }
        }
    }
}

/// The status fields the leader writes for `ec` (the sum, the condition, the reports of live
/// replicas only), or `None` when they already say so. `live`: the discovery pods that exist
/// (`None`: every report counts).
fn summed(
    ec: &EnvoyConfig,
    live: Option<&BTreeSet<String>>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> Option<serde_json::Value> {
    let mut status = ec.status.clone().unwrap_or_default();
    // Nothing was ever published (an invalid spec): the EnvoyConfig controller's conditions
    // say why; no counts to write.
    let published = status.published_version.clone()?;
    let kept: Vec<SyncReport> = status
        .sync_reports
        .iter()
        .filter(|r| live.is_none_or(|live| live.contains(&r.replica)))
        .take(MAX_REPORTS)
        .cloned()
        .collect();
    let pruned = kept.len() != status.sync_reports.len();
    let sum = ProxySync::sum(&published, &kept);
    let (value, reason, message) = synced(&status, &sum, &ec.spec.node_id);
    let generation = ec.metadata.generation;
    let mut conditions = status.conditions.clone();
    set_condition(
        &mut conditions,
        SYNCED,
        value,
        reason,
        &message,
        generation,
        now,
    );
    let condition_same =
        |c: &&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition| c.type_ == SYNCED;
    let before = status.conditions.iter().find(condition_same);
    let after = conditions.iter().find(condition_same);
    let condition_changed = before
        .map(|c| (&c.status, &c.reason, &c.message, c.observed_generation))
        != after.map(|c| (&c.status, &c.reason, &c.message, c.observed_generation));
    if !pruned && !condition_changed && status.proxies.as_ref() == Some(&sum) {
        return None;
    }
    status.proxies = Some(sum);
    let mut patch = serde_json::json!({
        "proxies": status.proxies,
        "conditions": conditions,
    });
    if pruned {
        patch["syncReports"] = serde_json::to_value(&kept).unwrap_or_default();
    }
    Some(patch)
}

/// Merges `fields` into the status of `ec` as read: a stale read is refused with a conflict,
/// and the next period starts again from a fresh one.
async fn write(ctx: &Context, ec: &EnvoyConfig, fields: serde_json::Value) -> Result<(), Error> {
    let api: Api<EnvoyConfig> =
        Api::namespaced(ctx.client.clone(), &ec.namespace().unwrap_or_default());
    let mut patch = serde_json::json!({ "status": fields });
    if let Some(rv) = &ec.metadata.resource_version {
        patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    }
    patch_status(&api, &ec.name_any(), patch, super::FIELD_MANAGER).await?;
    Ok(())
}

#[cfg(test)]
#[path = "convergence_tests.rs"]
mod tests;
