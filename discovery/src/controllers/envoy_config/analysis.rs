//! The health analysis of a canary step, on the leader, pure: the replicas' reads of their
//! proxies' stats during the step (`status.syncReports[].canary.traffic`), summed, held to
//! `spec.rollout.analysis`. The canaries are compared with the proxies still on the stable
//! version over the same step: what both do wrong (an upstream down for everyone) is not the
//! version's fault.

use marin3r_api::EnvoyConfig;
use marin3r_api::proxy_sync::{StepTraffic, Traffic};
use marin3r_api::rollout::Analysis;

/// What the analysis decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The canaries do no worse than the limits allow.
    Healthy(String),
    /// The canaries do worse: the version is rolled back.
    Failing(String),
    /// Too little to judge (no traffic, no stats read): the step bakes for its time.
    Inconclusive(String),
}

impl Verdict {
    pub fn message(&self) -> &str {
        match self {
            Self::Healthy(m) | Self::Failing(m) | Self::Inconclusive(m) => m,
        }
    }
}

/// The analysis of step `step` of `version`, from `ec`'s sync reports.
pub fn judge(ec: &EnvoyConfig, limits: &Analysis, version: &str, step: u32) -> Verdict {
    let reports = ec
        .status
        .as_ref()
        .map(|s| s.sync_reports.as_slice())
        .unwrap_or_default();
    let mut sum: Option<StepTraffic> = None;
    for t in reports
        .iter()
        .filter_map(|r| r.canary.as_ref())
        .filter(|c| c.version == version)
        .filter_map(|c| c.traffic)
        .filter(|t| t.step == step)
    {
        let s = sum.get_or_insert(StepTraffic {
            step,
            ..StepTraffic::default()
        });
        s.canary = s.canary.plus(t.canary);
        s.stable = s.stable.plus(t.stable);
        s.unread = s.unread.saturating_add(t.unread);
    }
    let Some(sum) = sum else {
        return Verdict::Inconclusive(format!(
            "step {step}: no proxy's stats read yet; not judged"
        ));
    };
    decide(limits, &sum)
}

/// The verdict on one step's sums.
pub fn decide(limits: &Analysis, t: &StepTraffic) -> Verdict {
    let (canary, stable) = (&t.canary, &t.stable);
    let min = limits.min_requests();
    let seen = format!(
        "canaries: {}; stable: {}{}",
        describe(canary),
        describe(stable),
        match t.unread {
            0 => String::new(),
            n => format!(
                "; the stats of {n} proxies could not be read (their stats port must be \
                 reachable from the discovery pods)"
            ),
        }
    );
    if let Some(why) = collapsed(limits, canary, stable) {
        return Verdict::Failing(format!("{why} ({seen})"));
    }
    if canary.requests < min {
        return Verdict::Inconclusive(format!(
            "not judged: the canaries served {} of the {min} requests needed ({seen})",
            canary.requests
        ));
    }
    let checks = [
        (
            "5xx responses",
            limits.max_5xx_points(),
            share(canary.errors_5xx, canary.requests),
            (stable.requests >= min).then(|| share(stable.errors_5xx, stable.requests)),
            true,
        ),
        (
            "failed upstream attempts",
            limits.max_upstream_failure_points(),
            share(canary.upstream_failures, canary.upstream_attempts),
            (stable.upstream_attempts >= min)
                .then(|| share(stable.upstream_failures, stable.upstream_attempts)),
            canary.upstream_attempts >= min,
        ),
    ];
    for (what, limit, on_canary, on_stable, judged) in checks {
        if !judged || limit >= 100 {
            continue;
        }
        let base = on_stable.unwrap_or(0.0);
        if on_canary - base > f64::from(limit) {
            return Verdict::Failing(format!(
                "the canaries' {what} are {on_canary:.1}%, the stable proxies' {base:.1}%: \
                 more than {limit} points over ({seen})"
            ));
        }
    }
    Verdict::Healthy(format!("healthy ({seen})"))
}

/// Why the canaries' request rate collapsed, when it did: judged once the stable proxies
/// served `minRequests` each.
fn collapsed(limits: &Analysis, canary: &Traffic, stable: &Traffic) -> Option<String> {
    let percent = u64::from(limits.min_request_rate_percent());
    if percent == 0 || canary.proxies == 0 || stable.proxies == 0 {
        return None;
    }
    let per_stable = stable.requests / u64::from(stable.proxies);
    if per_stable < limits.min_requests() {
        return None;
    }
    let per_canary = canary.requests / u64::from(canary.proxies);
    // per_canary / per_stable < percent / 100, without dividing.
    (u128::from(per_canary) * 100 < u128::from(per_stable) * u128::from(percent)).then(|| {
        format!(
            "the canaries' request rate collapsed: {per_canary} requests per canary, \
             {per_stable} per stable proxy, under {percent}%"
        )
    })
}

/// `part` of `whole` in percent (0 of nothing).
fn share(part: u64, whole: u64) -> f64 {
    match whole {
        0 => 0.0,
        w => 100.0 * (part.min(w) as f64) / (w as f64),
    }
}

fn describe(t: &Traffic) -> String {
    format!(
        "{} proxies, {} requests, {:.1}% 5xx, {:.1}% of {} upstream attempts failed",
        t.proxies,
        t.requests,
        share(t.errors_5xx, t.requests),
        share(t.upstream_failures, t.upstream_attempts),
        t.upstream_attempts
    )
}

#[cfg(test)]
#[path = "analysis_tests.rs"]
mod tests;
