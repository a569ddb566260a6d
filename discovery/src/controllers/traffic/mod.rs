//! The health analysis' eyes, on every replica: while an `EnvoyConfig`'s rollout is in a
//! canary step, this replica reads the Envoy stats of the node's proxies connected to it
//! (`GET /stats/prometheus` on the proxy's address and stats port: the readiness listener
//! every sidecar and gateway has), every [`PERIOD`], and keeps the counters' growth since
//! the step began, summed per track. The sync report (`convergence`) carries the sums to the
//! leader, which judges them (`envoy_config::analysis`).
//!
//! Why read and not be sent: the stats endpoint is already there on every proxy marin3r
//! runs (a metrics-service sink would need every pod's bootstrap changed and would stream
//! every stat of every proxy all the time, for the few minutes a rollout step lasts); it is
//! read only during a step, and only these few counters (Envoy filters them).
//!
//! The address read is the source address of the proxy's mutual-TLS xDS stream, so only a
//! proxy holding its namespace's certificate can be read, and only from its own address.
//! The answer is a tenant's: it is bounded ([`MAX_BODY`], [`TIMEOUT`], no redirect, no
//! proxy), at most [`IN_FLIGHT`] reads at once and [`MAX_CANARIES`] plus [`MAX_STABLE`] per
//! node a period. A tenant can only lie about its own proxies, which judges its own rollout.

pub mod stats;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use marin3r_api::EnvoyConfig;
use marin3r_api::proxy_sync::StepTraffic;
use marin3r_api::rollout::RolloutPhase;
use marin3r_xds::{ProxyStatus, Track, convergence, proxy_identity};
use stats::Counters;
use tracing::debug;

use super::Context;

/// How often the stats of a config's proxies are read during a step; the first read of a
/// step (its base) comes within [`TICK`] of the replica seeing the step.
pub const PERIOD: Duration = Duration::from_secs(3);
/// How often the configs are looked at.
const TICK: Duration = Duration::from_secs(1);
/// The stats port of a proxy that does not declare one (sidecars injected before it did).
pub const DEFAULT_STATS_PORT: u16 = 9902;
/// The most bytes of one proxy's answer read.
const MAX_BODY: u64 = 1024 * 1024;
/// How long one read may take, connecting included.
const TIMEOUT: Duration = Duration::from_secs(3);
/// The most reads at once.
const IN_FLIGHT: usize = 16;
/// The most canaries and stable proxies of one node read a period (by address).
const MAX_CANARIES: usize = 64;
const MAX_STABLE: usize = 32;
/// The most proxies read a period over every config.
const MAX_READS: usize = 512;

/// A config in a step: (namespace, name).
type ConfigKey = (String, String);
/// One proxy's read: its address, its track, its counters (None: the read failed).
type Read = (String, Track, Option<Counters>);

/// What this replica read during each config's current step.
#[derive(Default)]
pub struct Book {
    steps: Mutex<HashMap<ConfigKey, StepBook>>,
}

/// One config's step.
struct StepBook {
    version: String,
    step: u32,
    /// Each proxy's counters when first read in the step (zero after it restarted).
    base: HashMap<String, Counters>,
    /// Each proxy's growth at its last read, and its track then.
    grown: HashMap<String, (Track, Counters)>,
    unread: u32,
    /// When it was last read.
    read_at: std::time::Instant,
}

impl Book {
    /// The sums of `ns`/`name`'s step `step` of `version`, once its stats were read.
    pub fn traffic(&self, ns: &str, name: &str, version: &str, step: u32) -> Option<StepTraffic> {
        let steps = self.steps.lock().ok()?;
        let book = steps.get(&(ns.to_owned(), name.to_owned()))?;
        if book.version != version || book.step != step {
            return None;
        }
        let mut out = StepTraffic {
            step,
            unread: book.unread,
            ..StepTraffic::default()
        };
        for (track, grown) in book.grown.values() {
            let sum = match track {
                Track::Canary => &mut out.canary,
                Track::Stable => &mut out.stable,
            };
            *sum = sum.plus(grown.traffic());
        }
        (out.canary.proxies + out.stable.proxies + out.unread > 0).then_some(out)
    }

    /// Whether `key`'s proxies are to be read now: a new step, or [`PERIOD`] since the last.
    fn due(&self, key: &ConfigKey, version: &str, step: u32) -> bool {
        let Ok(steps) = self.steps.lock() else {
            return false;
        };
        steps
            .get(key)
            .is_none_or(|b| b.version != version || b.step != step || b.read_at.elapsed() >= PERIOD)
    }

    /// Records a period's reads of `key`'s step: (address, track, counters or None when the
    /// read failed).
    fn record(&self, key: ConfigKey, at: &Target, reads: Vec<Read>) {
        let Ok(mut steps) = self.steps.lock() else {
            return;
        };
        let fresh = || StepBook {
            version: at.version.clone(),
            step: at.step,
            base: HashMap::new(),
            grown: HashMap::new(),
            unread: 0,
            read_at: std::time::Instant::now(),
        };
        let book = steps.entry(key).or_insert_with(fresh);
        if book.version != at.version || book.step != at.step {
            *book = fresh();
        }
        book.unread = 0;
        book.read_at = std::time::Instant::now();
        let present: BTreeSet<&String> = reads.iter().map(|(ip, _, _)| ip).collect();
        book.grown.retain(|ip, _| present.contains(ip));
        book.base.retain(|ip, _| present.contains(ip));
        for (ip, track, counters) in &reads {
            let Some(now) = counters else {
                book.unread += 1;
                continue;
            };
            let base = book.base.entry(ip.clone()).or_insert(*now);
            let grown = now.since(*base).unwrap_or_else(|| {
                // Restarted: it counts from zero again.
                *base = Counters::default();
                *now
            });
            book.grown.insert(ip.clone(), (*track, grown));
        }
    }

    /// Forgets every config not in `keep`.
    fn retain(&self, keep: &BTreeSet<ConfigKey>) {
        if let Ok(mut steps) = self.steps.lock() {
            steps.retain(|k, _| keep.contains(k));
        }
    }
}

/// The step of one config this period reads, and which proxies.
struct Target {
    version: String,
    step: u32,
    /// (identity, stats address, track).
    proxies: Vec<(String, SocketAddr, Track)>,
}

/// Every replica: reads the stats of its proxies of each config in a canary step, every
/// [`PERIOD`] (at once for a new step), until `stop`.
pub(crate) async fn run(ctx: Arc<Context>, stop: impl Future<Output = ()>) {
    tokio::pin!(stop);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(TIMEOUT))
        .max_redirects(0)
        .proxy(None)
        .build()
        .into();
    loop {
        let Some(store) = super::next_turn(&ctx, &mut stop, TICK).await else {
            return;
        };
        let status = ctx.config.proxies.snapshot();
        let nodes = convergence::by_node(&status);
        let mut targets: BTreeMap<ConfigKey, Target> = BTreeMap::new();
        for ec in store.state() {
            let ns = ec.namespace().unwrap_or_default();
            if !ctx.writes_for(&ns).await {
                continue;
            }
            let proxies = nodes.get(&(ns.as_str(), ec.spec.node_id.as_str()));
            if let Some(target) = target(&ec, proxies.map(Vec::as_slice).unwrap_or_default()) {
                targets.insert((ns, ec.name_any()), target);
            }
        }
        ctx.traffic.retain(&targets.keys().cloned().collect());
        targets.retain(|key, t| ctx.traffic.due(key, &t.version, t.step));
        let reads = tokio::select! {
            () = &mut stop => return,
            reads = read_all(&agent, &targets) => reads,
        };
        for (key, target) in targets {
            let mine = reads.get(&key).cloned().unwrap_or_default();
            ctx.traffic.record(key, &target, mine);
        }
    }
}

/// What to read of `ec` this period: its step and proxies, when its rollout is in one and
/// its analysis is on.
fn target(ec: &EnvoyConfig, proxies: &[&ProxyStatus]) -> Option<Target> {
    let strategy = ec.spec.rollout.as_ref()?;
    if strategy.steps.is_empty() {
        return None;
    }
    let rollout = ec.status.as_ref()?.rollout.as_ref()?;
    if !matches!(
        rollout.phase,
        RolloutPhase::Progressing | RolloutPhase::Paused
    ) {
        return None;
    }
    let step = rollout.step?;
    // Per address: a canary when any of its streams is.
    let mut by_ip: BTreeMap<String, (SocketAddr, Track)> = BTreeMap::new();
    for p in proxies {
        let identity = proxy_identity(p);
        let Some(addr) = stats_address(&identity, p.stats_port) else {
            continue;
        };
        let entry = by_ip.entry(identity).or_insert((addr, Track::Stable));
        if p.track() == Track::Canary {
            entry.1 = Track::Canary;
        }
    }
    let pick = |track: Track, most: usize| {
        by_ip
            .iter()
            .filter(move |(_, (_, t))| *t == track)
            .take(most)
            .map(|(ip, (addr, t))| (ip.clone(), *addr, *t))
    };
    let proxies = pick(Track::Canary, MAX_CANARIES)
        .chain(pick(Track::Stable, MAX_STABLE))
        .collect();
    Some(Target {
        version: rollout.version.clone(),
        step,
        proxies,
    })
}

/// Where a proxy's stats are: its address and stats port. None for an address this pod
/// must not read: its own loopback, an unspecified or link-local one (a cloud's metadata
/// service), a multicast one.
fn stats_address(identity: &str, port: Option<u16>) -> Option<SocketAddr> {
    let ip: IpAddr = identity.parse().ok()?;
    let refused = ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || match ip {
            IpAddr::V4(v4) => v4.is_link_local() || v4.is_broadcast(),
            IpAddr::V6(v6) => v6.is_unicast_link_local(),
        };
    (!refused).then(|| SocketAddr::new(ip, port.unwrap_or(DEFAULT_STATS_PORT)))
}

/// Reads every target's proxies, at most [`IN_FLIGHT`] at once and [`MAX_READS`] in all.
async fn read_all(
    agent: &ureq::Agent,
    targets: &BTreeMap<ConfigKey, Target>,
) -> HashMap<ConfigKey, Vec<Read>> {
    // Owned, so the futures borrow nothing across the spawned reads.
    let jobs: Vec<(ConfigKey, String, SocketAddr, Track)> = targets
        .iter()
        .flat_map(|(key, t)| {
            t.proxies
                .iter()
                .map(move |(ip, addr, track)| (key.clone(), ip.clone(), *addr, *track))
        })
        .take(MAX_READS)
        .collect();
    let reads: Vec<(ConfigKey, Read)> = futures::stream::iter(jobs)
        .map(|(key, ip, addr, track)| {
            let agent = agent.clone();
            tokio::task::spawn_blocking(move || {
                let counters = read_one(&agent, addr)
                    .inspect_err(|e| debug!(%addr, error = %e, "could not read a proxy's stats"))
                    .ok();
                (key, (ip, track, counters))
            })
        })
        .buffer_unordered(IN_FLIGHT)
        .filter_map(|joined| std::future::ready(joined.ok()))
        .collect()
        .await;
    let mut out: HashMap<ConfigKey, Vec<_>> = HashMap::new();
    for (key, read) in reads {
        out.entry(key).or_default().push(read);
    }
    out
}

/// One proxy's counters.
fn read_one(agent: &ureq::Agent, addr: SocketAddr) -> Result<Counters, String> {
    let url = format!(
        "http://{addr}{}?{}",
        marin3r_webhook::readiness::STATS_PATH,
        stats::QUERY
    );
    let mut response = agent.get(&url).call().map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("{}", response.status()));
    }
    let body = response
        .body_mut()
        .with_config()
        .limit(MAX_BODY)
        .read_to_string()
        .map_err(|e| e.to_string())?;
    Ok(stats::read(&body))
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
