//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several operator replicas
//! exactly one runs the controllers. kube-rs 5 has no elector; this is the client-go
//! algorithm reduced to what we need: take the Lease when it is free or expired (an
//! optimistic-concurrency write, so two candidates never both win), renew it, and give it up
//! on shutdown so a successor need not wait for it to expire.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This candidate's identity (the pod name).
    pub identity: String,
    /// How long a Lease stays held without renewal.
    pub lease_duration: Duration,
    /// How often the holder renews and candidates retry.
    pub retry_period: Duration,
}

impl LeaseConfig {
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            retry_period: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lost the lease {0}: another replica may be running the controllers")]
    Lost(String),
}

/// What a candidate may do with a Lease as it is now.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Held by us: renew.
    Renew,
    /// Free or expired: take it (a new term).
    Take,
    /// Held by someone else who renewed recently.
    Wait,
}

/// Pure: who may hold `lease` at `now`.
pub fn verdict(lease: &LeaseSpec, identity: &str, now: Timestamp) -> Verdict {
    let holder = lease.holder_identity.as_deref().filter(|h| !h.is_empty());
    if holder == Some(identity) {
        return Verdict::Renew;
    }
    let Some(_) = holder else {
        return Verdict::Take;
    };
    let duration = i64::from(lease.lease_duration_seconds.unwrap_or(15));
    let renewed = lease.renew_time.as_ref().or(lease.acquire_time.as_ref());
    match renewed {
        Some(MicroTime(t)) if t.as_second() + duration > now.as_second() => Verdict::Wait,
        _ => Verdict::Take,
    }
}

/// Waits until this candidate holds the Lease, then runs `work` while renewing it. Returns
/// when `work` returns (the Lease is released), when `stop` is cancelled before the Lease
/// was won, or with an error if the Lease is lost, so the process can exit and never run
/// beside a new leader.
pub async fn run_as_leader<F>(
    client: Client,
    config: LeaseConfig,
    stop: CancellationToken,
    work: F,
) -> Result<(), LeaderError>
where
    F: Future<Output = ()>,
{
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let key = format!("{}/{}", config.namespace, config.name);
    loop {
        match try_hold(&api, &config).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(err) => warn!(lease = %key, error = %err, "could not read or write the lease"),
        }
        tokio::select! {
            () = tokio::time::sleep(config.retry_period) => {}
            () = stop.cancelled() => return Ok(()),
        }
    }
    info!(lease = %key, identity = %config.identity, "became the leader");
    let renew = async {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(config.retry_period).await;
            match try_hold(&api, &config).await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => return,
                Err(err) => {
                    warn!(lease = %key, error = %err, "could not renew the lease");
                    // Give up before the Lease could expire and be taken.
                    if last_renewal.elapsed() + config.retry_period >= config.lease_duration {
                        return;
                    }
                }
            }
        }
    };
    tokio::select! {
        () = work => {
            release(&api, &config).await;
            Ok(())
        }
        () = renew => Err(LeaderError::Lost(key)),
    }
}

/// One attempt to take or renew the Lease; true if we hold it afterwards.
async fn try_hold(api: &Api<Lease>, config: &LeaseConfig) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let seconds = i32::try_from(config.lease_duration.as_secs()).unwrap_or(15);
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(config.identity.clone()),
                lease_duration_seconds: Some(seconds),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let mut spec = lease.spec.clone().unwrap_or_default();
    match verdict(&spec, &config.identity, now) {
        Verdict::Wait => return Ok(false),
        Verdict::Renew => spec.renew_time = Some(MicroTime(now)),
        Verdict::Take => {
            spec.holder_identity = Some(config.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.renew_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
    }
    spec.lease_duration_seconds = Some(seconds);
    lease.spec = Some(spec);
    // The resourceVersion we read makes this a compare-and-swap: a concurrent taker gets 409.
    match api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

async fn release(api: &Api<Lease>, config: &LeaseConfig) {
    let Ok(Some(mut lease)) = api.get_opt(&config.name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    if let Err(err) = api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        warn!(error = %err, "could not release the lease");
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
    fn verdicts() {
        let now = Timestamp::from_second(1_000).unwrap();
        assert_eq!(verdict(&lease(Some("me"), 0), "me", now), Verdict::Renew);
        assert_eq!(verdict(&lease(None, 999), "me", now), Verdict::Take);
        assert_eq!(verdict(&lease(Some(""), 999), "me", now), Verdict::Take);
        assert_eq!(
            verdict(&lease(Some("other"), 990), "me", now),
            Verdict::Wait
        );
        assert_eq!(
            verdict(&lease(Some("other"), 985), "me", now),
            Verdict::Take
        );
        let never_renewed = LeaseSpec {
            holder_identity: Some("other".into()),
            ..Default::default()
        };
        assert_eq!(verdict(&never_renewed, "me", now), Verdict::Take);
    }
}
