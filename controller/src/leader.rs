//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several operator replicas
//! at most one runs the controllers at any instant. kube-rs 5 has no elector; this is the
//! client-go algorithm: a candidate takes the Lease when it is free, or when it has seen the
//! record unchanged for a whole lease duration on its own clock (an optimistic-concurrency
//! write, so two candidates never both win); the leader renews it with every request bounded
//! in time and stops acting once a renew deadline, shorter than the lease duration, passes
//! without a successful renewal; and it gives the Lease up on shutdown so a successor need
//! not wait for it to expire.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This candidate's identity (the pod name).
    pub identity: String,
    /// How long a candidate waits, on its own clock, after it last saw the Lease change
    /// before it may take it.
    pub lease_duration: Duration,
    /// How long the leader keeps acting without a successful renewal: it steps down once
    /// this much time has passed since it sent the last renewal that succeeded. Shorter than
    /// `lease_duration`, so the leader has stopped before anyone may take over.
    pub renew_deadline: Duration,
    /// How often the holder renews and candidates retry.
    pub retry_period: Duration,
    /// Where this candidate says whether it holds the Lease.
    pub metrics: LeaderMetrics,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    lease: String,
}

/// `marin3r_leader{lease}`: 1 while this replica holds the Lease, 0 otherwise. The label is
/// the Lease's name, one per process, so it stays bounded. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct LeaderMetrics {
    leader: Family<LeaseLabels, Gauge>,
}

impl LeaderMetrics {
    /// Adds `marin3r_leader{lease}` to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "marin3r_leader",
            "1 while this replica holds the leader Lease named by the label, else 0",
            self.leader.clone(),
        );
    }

    fn set(&self, lease: &str, leading: bool) {
        self.leader
            .get_or_create(&LeaseLabels {
                lease: lease.to_owned(),
            })
            .set(i64::from(leading));
    }
}

/// Sets the gauge to 1 for as long as it lives: whether the term ends by returning, by losing
/// the Lease or by the caller dropping the election, the gauge goes back to 0.
struct Leading {
    metrics: LeaderMetrics,
    lease: String,
}

impl Leading {
    fn start(config: &LeaseConfig) -> Self {
        config.metrics.set(&config.name, true);
        Self {
            metrics: config.metrics.clone(),
            lease: config.name.clone(),
        }
    }
}

impl Drop for Leading {
    fn drop(&mut self) {
        self.metrics.set(&self.lease, false);
    }
}

impl LeaseConfig {
    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            metrics: LeaderMetrics::default(),
        }
    }

    /// Reports in `metrics` whether this candidate holds the Lease.
    pub fn with_metrics(mut self, metrics: LeaderMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The three durations must nest (retry < renew deadline < lease duration), or two
    /// replicas could act at once.
    pub fn check(&self) -> Result<(), LeaderError> {
        let ordered = !self.retry_period.is_zero()
            && self.retry_period < self.renew_deadline
            && self.renew_deadline < self.lease_duration;
        if ordered && self.lease_duration.as_secs() >= 1 {
            Ok(())
        } else {
            Err(LeaderError::Config(format!(
                "need 0 < retry period ({:?}) < renew deadline ({:?}) < lease duration ({:?}), \
                 and a lease duration of at least 1 s",
                self.retry_period, self.renew_deadline, self.lease_duration
            )))
        }
    }

    /// Whole seconds as the Lease stores them.
    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lost the lease {0}: another replica may be running the controllers")]
    Lost(String),
    #[error("leader election: {0}")]
    Config(String),
}

/// What a candidate may do with a Lease as it is now.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Held by us: renew.
    Renew,
    /// Free, or unchanged for a whole lease duration on our clock: take it (a new term).
    Take,
    /// Held by someone else whose Lease changed less than a lease duration ago.
    Wait,
}

/// The Lease record as this candidate last saw it, and when (on its own monotonic clock).
/// Expiry is judged from these local observations, never from the holder's `renewTime`, so
/// clock skew between replicas cannot make a live Lease look expired (client-go does the
/// same).
#[derive(Debug, Clone)]
pub struct Observation {
    record: LeaseSpec,
    seen_at: Instant,
}

impl Observation {
    /// Records `current` as seen at `now`, keeping the older instant when nothing changed.
    pub fn update(previous: Option<Self>, current: &LeaseSpec, now: Instant) -> Self {
        match previous {
            Some(seen) if seen.record == *current => seen,
            _ => Self {
                record: current.clone(),
                seen_at: now,
            },
        }
    }
}

/// Pure: what `identity` may do with the Lease it observed, at local instant `now`.
pub fn verdict(observed: &Observation, identity: &str, now: Instant) -> Verdict {
    let lease = &observed.record;
    let holder = lease.holder_identity.as_deref().filter(|h| !h.is_empty());
    match holder {
        Some(h) if h == identity => Verdict::Renew,
        None => Verdict::Take,
        Some(_) => {
            let seconds = lease.lease_duration_seconds.unwrap_or(15).max(1);
            let duration = Duration::from_secs(u64::try_from(seconds).unwrap_or(15));
            match observed.seen_at.checked_add(duration) {
                Some(expiry) if now < expiry => Verdict::Wait,
                // An instant too far in the future to represent never comes.
                None => Verdict::Wait,
                Some(_) => Verdict::Take,
            }
        }
    }
}

/// A candidate for the Lease: the API, its configuration and what it last observed.
struct Candidate {
    api: Api<Lease>,
    config: LeaseConfig,
    key: String,
    observed: Option<Observation>,
}

/// Waits until this candidate holds the Lease, then runs `work` while renewing it. Returns
/// when `work` returns (the Lease is released), when `stop` is cancelled before the Lease
/// was won, or with an error if the Lease is lost: `work` is dropped (it stops acting) once
/// no renewal has succeeded for the renew deadline, before any other candidate may take
/// over, and the process can exit and never run beside a new leader.
pub async fn run_as_leader<F>(
    client: Client,
    config: LeaseConfig,
    stop: CancellationToken,
    work: F,
) -> Result<(), LeaderError>
where
    F: Future<Output = ()>,
{
    config.check()?;
    // The series exists, at 0, from the first campaign.
    config.metrics.set(&config.name, false);
    let mut candidate = Candidate {
        api: Api::namespaced(client, &config.namespace),
        key: format!("{}/{}", config.namespace, config.name),
        config,
        observed: None,
    };
    let mut renewed_at = loop {
        let sent = Instant::now();
        // A candidate's attempt is bounded too, so a hung API server cannot stall it past
        // the point where its observation is stale.
        match candidate.attempt(candidate.config.retry_period).await {
            Ok(true) => break sent,
            Ok(false) => {}
            Err(err) => {
                warn!(lease = %candidate.key, error = %err, "could not read or write the lease")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(candidate.config.retry_period) => {}
            () = stop.cancelled() => return Ok(()),
        }
    };
    info!(lease = %candidate.key, identity = %candidate.config.identity, "became the leader");
    let _leading = Leading::start(&candidate.config);
    let key = candidate.key.clone();
    let renew = async {
        loop {
            tokio::time::sleep(candidate.config.retry_period).await;
            // Checked before every attempt: past the deadline we may no longer act.
            let Some(left) = candidate
                .config
                .renew_deadline
                .checked_sub(renewed_at.elapsed())
                .filter(|left| !left.is_zero())
            else {
                warn!(lease = %candidate.key, "no renewal succeeded within the renew deadline; stepping down");
                return;
            };
            let sent = Instant::now();
            match candidate.attempt(left).await {
                Ok(true) => renewed_at = sent,
                Ok(false) => {
                    warn!(lease = %candidate.key, "the lease was taken by another replica; stepping down");
                    return;
                }
                Err(err) => {
                    warn!(lease = %candidate.key, error = %err, "could not renew the lease")
                }
            }
        }
    };
    tokio::select! {
        () = work => {
            candidate.release().await;
            Ok(())
        }
        () = renew => Err(LeaderError::Lost(key)),
    }
}

#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("the API server did not answer within {0:?}")]
    Timeout(Duration),
}

impl Candidate {
    /// One attempt to take or renew the Lease within `budget`; true if we hold it after.
    async fn attempt(&mut self, budget: Duration) -> Result<bool, AttemptError> {
        tokio::time::timeout(budget, self.try_hold())
            .await
            .map_err(|_| AttemptError::Timeout(budget))?
            .map_err(AttemptError::from)
    }

    async fn try_hold(&mut self) -> Result<bool, kube::Error> {
        let wall = Timestamp::now();
        let seconds = self.config.lease_seconds();
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            let spec = LeaseSpec {
                holder_identity: Some(self.config.identity.clone()),
                lease_duration_seconds: Some(seconds),
                acquire_time: Some(MicroTime(wall)),
                renew_time: Some(MicroTime(wall)),
                lease_transitions: Some(0),
                ..Default::default()
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    ..Default::default()
                },
                spec: Some(spec.clone()),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.observed = Some(Observation::update(None, &spec, Instant::now()));
                    Ok(true)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let current = lease.spec.clone().unwrap_or_default();
        let observed = Observation::update(self.observed.take(), &current, Instant::now());
        let verdict = verdict(&observed, &self.config.identity, Instant::now());
        self.observed = Some(observed);
        let mut spec = current;
        match verdict {
            Verdict::Wait => return Ok(false),
            Verdict::Renew => spec.renew_time = Some(MicroTime(wall)),
            Verdict::Take => {
                spec.holder_identity = Some(self.config.identity.clone());
                spec.acquire_time = Some(MicroTime(wall));
                spec.renew_time = Some(MicroTime(wall));
                spec.lease_transitions =
                    Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            }
        }
        spec.lease_duration_seconds = Some(seconds);
        lease.spec = Some(spec.clone());
        // The resourceVersion we read makes this a compare-and-swap: a concurrent taker gets 409.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                self.observed = Some(Observation::update(None, &spec, Instant::now()));
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up so a successor need not wait for it to expire; bounded like any
    /// other attempt.
    async fn release(&self) {
        let release = async {
            let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else {
                return;
            };
            let Some(spec) = lease.spec.as_mut() else {
                return;
            };
            if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
                return;
            }
            spec.holder_identity = None;
            if let Err(err) = self
                .api
                .replace(&self.config.name, &PostParams::default(), &lease)
                .await
            {
                warn!(error = %err, "could not release the lease");
            }
        };
        if tokio::time::timeout(self.config.retry_period, release)
            .await
            .is_err()
        {
            warn!(lease = %self.key, "the API server did not answer; the lease will expire instead");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed_at: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed_at).unwrap())),
            ..Default::default()
        }
    }

    #[test]
    fn verdicts_follow_local_observation_not_the_holders_clock() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        let seen = |spec: &LeaseSpec| Observation::update(None, spec, t0);
        assert_eq!(
            verdict(&seen(&lease(Some("me"), 0)), "me", t0),
            Verdict::Renew
        );
        assert_eq!(verdict(&seen(&lease(None, 999)), "me", t0), Verdict::Take);
        assert_eq!(
            verdict(&seen(&lease(Some(""), 999)), "me", t0),
            Verdict::Take
        );
        // A renewTime from the distant past (a holder whose clock is behind ours) does not
        // make a Lease we have just seen look expired...
        let other = seen(&lease(Some("other"), 0));
        assert_eq!(verdict(&other, "me", t0), Verdict::Wait);
        assert_eq!(verdict(&other, "me", t0 + secs(14)), Verdict::Wait);
        // ...only seeing it unchanged for the whole lease duration does.
        assert_eq!(verdict(&other, "me", t0 + secs(15)), Verdict::Take);
        // A renewal (any change of the record) restarts the wait from when we saw it.
        let renewed =
            Observation::update(Some(other.clone()), &lease(Some("other"), 1), t0 + secs(10));
        assert_eq!(verdict(&renewed, "me", t0 + secs(20)), Verdict::Wait);
        assert_eq!(verdict(&renewed, "me", t0 + secs(25)), Verdict::Take);
        // The same record seen again keeps the first instant.
        let again = Observation::update(Some(other), &lease(Some("other"), 0), t0 + secs(10));
        assert_eq!(verdict(&again, "me", t0 + secs(15)), Verdict::Take);
        // A renewTime far in the future (a holder whose clock is ahead) expires all the same.
        let ahead = seen(&lease(Some("other"), 4_000_000_000));
        assert_eq!(verdict(&ahead, "me", t0 + secs(15)), Verdict::Take);
    }

    #[test]
    fn the_durations_must_nest() {
        let ok = LeaseConfig::new("ns", "lease", "me");
        assert!(ok.check().is_ok());
        let mut bad = ok.clone();
        bad.renew_deadline = bad.lease_duration;
        assert!(
            bad.check()
                .unwrap_err()
                .to_string()
                .contains("renew deadline")
        );
        let mut bad = ok.clone();
        bad.retry_period = bad.renew_deadline;
        assert!(bad.check().is_err());
        let mut bad = ok;
        bad.retry_period = Duration::ZERO;
        assert!(bad.check().is_err());
    }
}
