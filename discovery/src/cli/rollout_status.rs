//! `marin3r rollout status`: where an EnvoyConfig's rollout stands (the phase, the version
//! rolled out and the one it replaces, its canary step, why it is held), once or until no
//! step is under way (`--watch`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use kube::{Api, ResourceExt};
use serde::Serialize;

use super::cluster::ConfigTarget as Target;
use super::output::Output;
use crate::proxy_config::printable;
use marin3r_api::EnvoyConfig;
use marin3r_api::rollout::{RolloutPhase, RolloutStatus};

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    target: Target,
    /// `table`, `json` or `yaml`: `{"envoyConfig", "strategy", "desiredVersion",
    /// "publishedVersion", "observed", "rollout": {...}}`.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Wait until the discovery service has acted on the current spec and no canary step is
    /// under way, then print: exit 0 when its version is published, 1 when it is held or
    /// was rolled back (as `kubectl rollout status`).
    #[arg(long, short = 'w')]
    watch: bool,
    /// With `--watch`: give up after this many seconds (exit 1).
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    timeout: u64,
}

/// What `status` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Status {
    pub(super) envoy_config: String,
    /// Whether the config has a rollout strategy (`spec.rollout`).
    strategy: bool,
    /// The version of the spec as it is now.
    pub(super) desired_version: String,
    pub(super) published_version: Option<String>,
    /// Whether the discovery service has acted on the spec as it is now.
    observed: bool,
    pub(super) rollout: Option<RolloutStatus>,
}

impl Status {
    pub(super) fn of(ec: &EnvoyConfig) -> Self {
        let status = ec.status.as_ref();
        let desired_version = ec.spec.version();
        let observed = status.is_some_and(|s| {
            s.desired_version.as_deref() == Some(desired_version.as_str())
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.observed_generation == ec.metadata.generation)
        });
        Self {
            envoy_config: format!("{}/{}", ec.namespace().unwrap_or_default(), ec.name_any()),
            strategy: ec.spec.rollout.is_some(),
            desired_version,
            published_version: status.and_then(|s| s.published_version.clone()),
            observed,
            rollout: status
                .and_then(|s| s.rollout.clone())
                .filter(|_| ec.spec.rollout.is_some()),
        }
    }

    /// Where it stands, in one line: `rollout phase Completed, version a published`.
    pub(super) fn summary(&self) -> String {
        let phase = self.rollout.as_ref().map_or("none", |r| r.phase.as_str());
        format!(
            "rollout phase {phase}, desired version {}, version {} published",
            self.desired_version,
            self.published_version.as_deref().unwrap_or("none")
        )
    }

    /// Whether the desired version is what the proxies are served.
    fn published(&self) -> bool {
        self.published_version.as_deref() == Some(self.desired_version.as_str())
    }

    fn text(&self) -> String {
        let mut lines = vec![format!("EnvoyConfig {}", self.envoy_config)];
        let published = self.published_version.as_deref().unwrap_or("none");
        if !self.observed {
            lines.push(format!(
                "Version {} is not acted on yet (version {published} is published).",
                self.desired_version
            ));
        } else if !self.strategy {
            lines.push(format!(
                "No rollout strategy: every version is published at once. Version \
                 {published} is published; the desired version is {}.",
                self.desired_version
            ));
        }
        if let Some(r) = self.rollout.as_ref().filter(|_| self.observed) {
            lines.push(format!("Phase:   {}", r.phase.as_str()));
            lines.push(format!("Version: {}", r.version));
            if let Some(stable) = &r.stable_version {
                lines.push(format!("Stable:  {stable}"));
            }
            lines.push(format!("Served:  {published}"));
            if let (Some(step), Some(of)) = (r.step, r.steps) {
                let canary = r.canary.as_deref().unwrap_or("-");
                let since = r
                    .step_started_at
                    .as_ref()
                    .map_or_else(|| "not started".to_owned(), |t| format!("since {}", t.0));
                lines.push(format!("Step:    {step} of {of}, {since}"));
                lines.push(format!("Canary:  {canary} proxies"));
            }
            if !r.message.is_empty() {
                lines.push(format!("Why:     {}", printable(&r.message)));
            }
            if let Some(analysis) = &r.analysis {
                lines.push(format!("Health:  {}", printable(analysis)));
            }
        }
        lines.join("\n") + "\n"
    }

    /// Whether a watch is over: the spec is acted on and no step is under way.
    fn settled(&self) -> bool {
        self.observed
            && self
                .rollout
                .as_ref()
                .is_none_or(|r| r.phase != RolloutPhase::Progressing)
    }

    /// `--watch`'s exit: 0 when the desired version is published, 1 otherwise.
    fn code(&self) -> ExitCode {
        ExitCode::from(u8::from(!self.published()))
    }
}

pub async fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let (api, name) = args.target.config_api().await?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    loop {
        let ec = read(&api, &name).await?;
        let status = Status::of(&ec);
        if !args.watch || status.settled() || Instant::now() >= deadline {
            print!("{}", args.output.render(&status, || status.text())?);
            if !args.watch {
                return Ok(ExitCode::SUCCESS);
            }
            if !status.settled() {
                eprintln!(
                    "error: version {} was not rolled out within {} s",
                    status.desired_version, args.timeout
                );
            }
            return Ok(status.code());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

pub(super) async fn read(api: &Api<EnvoyConfig>, name: &str) -> anyhow::Result<EnvoyConfig> {
    let ns = api.namespace().unwrap_or_default();
    api.get_opt(name)
        .await
        .with_context(|| format!("reading EnvoyConfig {ns}/{name}"))?
        .with_context(|| format!("no EnvoyConfig {ns}/{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use marin3r_api::EnvoyConfigStatus;

    fn config(rollout: Option<RolloutStatus>, strategy: bool, observed: bool) -> EnvoyConfig {
        let mut spec = serde_json::json!({"nodeID": "edge", "resources": [
            {"type": "cluster", "value": {"name": "a"}}]});
        if strategy {
            spec["rollout"] = serde_json::json!({});
        }
        let mut ec = EnvoyConfig::new("edge", serde_json::from_value(spec).unwrap());
        ec.metadata.namespace = Some("team-a".into());
        ec.metadata.generation = Some(3);
        let desired = ec.spec.version();
        ec.status = Some(EnvoyConfigStatus {
            desired_version: Some(if observed { desired } else { "older".into() }),
            published_version: Some("stable1".into()),
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: "False".into(),
                reason: "RolloutHeld".into(),
                message: String::new(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: Some(3),
            }],
            rollout,
            ..Default::default()
        });
        ec
    }

    #[test]
    fn a_held_rollout_says_why_and_exits_1_when_watched() {
        let ec = config(None, true, true);
        let rollout = RolloutStatus {
            version: ec.spec.version(),
            stable_version: Some("stable1".into()),
            phase: RolloutPhase::Held,
            message: "version x is held: it removes 4 of 5 clusters\u{1b}[2J".into(),
            analysis: Some("healthy (canaries: 1 proxies)".into()),
            ..Default::default()
        };
        let status = Status::of(&config(Some(rollout), true, true));
        let text = status.text();
        assert!(text.contains("Phase:   Held\n"), "{text}");
        assert!(
            text.contains("Stable:  stable1\nServed:  stable1\n"),
            "{text}"
        );
        assert!(text.contains("removes 4 of 5 clusters"), "{text}");
        assert!(
            text.contains("Health:  healthy (canaries: 1 proxies)\n"),
            "{text}"
        );
        assert!(
            !text.contains('\u{1b}'),
            "a tenant's text is printed escaped: {text}"
        );
        assert_eq!(status.code(), ExitCode::from(1));
    }

    #[test]
    fn without_a_strategy_or_before_the_service_acts_it_says_so() {
        let text = Status::of(&config(None, false, true)).text();
        assert!(text.contains("No rollout strategy"), "{text}");
        let status = Status::of(&config(None, true, false));
        assert!(!status.observed);
        assert!(
            status.text().contains("is not acted on yet"),
            "{}",
            status.text()
        );
    }
}
