//! `marin3r rollout promote|pause|resume|abort|undo`: a person's say over an EnvoyConfig's
//! rollout. Each writes an annotation the leader of the discovery service reads, bound to
//! the version it is about, so one left behind never acts on a later version:
//! - `promote` approves the version the blast-radius guard holds
//!   (`rollout-approve: <version>`), or ends the current canary step's bake
//!   (`rollout-promote: <version>/<step>`);
//! - `pause` stops the steps where they are (`rollout-paused: "true"`);
//! - `abort` gives every proxy the published version back (`rollout-abort: <version>`);
//! - `undo` publishes an earlier revision in place of the desired version
//!   (`rollout-undo: <revision>@<desired>`), without touching the spec;
//! - `resume` removes the last three: the rollout goes on (an aborted one from step 1).

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};

use super::cluster::ConfigTarget as Target;
use super::rollout_status::{Status, read};
use marin3r_api::rollout::{
    ABORT_ANNOTATION, APPROVE_ANNOTATION, PAUSE_ANNOTATION, PROMOTE_ANNOTATION, RolloutPhase,
    UNDO_ANNOTATION,
};
use marin3r_api::{EnvoyConfig, EnvoyConfigRevision};

#[derive(Debug, Args)]
pub struct ControlArgs {
    #[command(flatten)]
    target: Target,
}

#[derive(Debug, Args)]
pub struct UndoArgs {
    #[command(flatten)]
    target: Target,
    /// The version to publish (default: the newest revision before the published one that
    /// Envoy did not reject).
    #[arg(long, value_name = "VERSION")]
    to_revision: Option<String>,
}

/// What a command does to the annotations: set (Some) or remove (None).
type Annotations<'a> = Vec<(&'a str, Option<String>)>;

pub async fn promote(args: ControlArgs) -> anyhow::Result<ExitCode> {
    act(&args.target, |ec, status| {
        let version = status.desired_version.clone();
        let Some(rollout) = status.rollout.as_ref().filter(|r| r.version == version) else {
            bail!(
                "{} has nothing to promote: {}",
                status.envoy_config,
                status.summary()
            );
        };
        match (rollout.phase, rollout.step, rollout.steps) {
            (RolloutPhase::Held, ..) => Ok((
                vec![(APPROVE_ANNOTATION, Some(version.clone()))],
                format!(
                    "Approved version {version} of {}; the discovery service publishes it next.",
                    status.envoy_config
                ),
            )),
            (RolloutPhase::Progressing | RolloutPhase::Paused, Some(step), Some(of)) => {
                let next = if step >= of {
                    "the version is published to every proxy next".to_owned()
                } else {
                    format!("step {} starts next", step + 1)
                };
                Ok((
                    vec![(PROMOTE_ANNOTATION, Some(format!("{version}/{step}")))],
                    format!(
                        "Ended step {step} of {of} of version {version} of {}; {next}.",
                        ec.name_any()
                    ),
                ))
            }
            _ => bail!(
                "{} has nothing to promote: {}",
                status.envoy_config,
                status.summary()
            ),
        }
    })
    .await
}

pub async fn pause(args: ControlArgs) -> anyhow::Result<ExitCode> {
    act(&args.target, |_, status| {
        match status.rollout.as_ref().map(|r| r.phase) {
            Some(RolloutPhase::Progressing | RolloutPhase::Paused) => Ok((
                vec![(PAUSE_ANNOTATION, Some("true".to_owned()))],
                format!(
                    "Paused the rollout of version {} of {}: its canaries keep it, the others \
                     wait. `marin3r rollout resume` goes on.",
                    status.desired_version, status.envoy_config
                ),
            )),
            _ => bail!(
                "{} has no step to pause: {}",
                status.envoy_config,
                status.summary()
            ),
        }
    })
    .await
}

pub async fn resume(args: ControlArgs) -> anyhow::Result<ExitCode> {
    act(&args.target, |ec, status| {
        let set: Vec<&str> = [PAUSE_ANNOTATION, ABORT_ANNOTATION, UNDO_ANNOTATION]
            .into_iter()
            .filter(|a| ec.annotations().contains_key(*a))
            .collect();
        if set.is_empty() {
            bail!(
                "{} is not paused, aborted or undone: {}",
                status.envoy_config,
                status.summary()
            );
        }
        Ok((
            set.into_iter().map(|a| (a, None)).collect(),
            format!(
                "Resumed the rollout of version {} of {}.",
                status.desired_version, status.envoy_config
            ),
        ))
    })
    .await
}

pub async fn abort(args: ControlArgs) -> anyhow::Result<ExitCode> {
    act(&args.target, |_, status| {
        match status.rollout.as_ref().map(|r| r.phase) {
            Some(RolloutPhase::Progressing | RolloutPhase::Paused) => Ok((
                vec![(ABORT_ANNOTATION, Some(status.desired_version.clone()))],
                format!(
                    "Aborted the rollout of version {} of {}: every proxy gets version {} \
                     again. `marin3r rollout resume` starts it over; another spec replaces it.",
                    status.desired_version,
                    status.envoy_config,
                    status.published_version.as_deref().unwrap_or("none")
                ),
            )),
            _ => bail!(
                "{} has no rollout to abort: {}",
                status.envoy_config,
                status.summary()
            ),
        }
    })
    .await
}

pub async fn undo(args: UndoArgs) -> anyhow::Result<ExitCode> {
    let (api, name) = args.target.config_api().await?;
    let ec = read(&api, &name).await?;
    let status = Status::of(&ec);
    let revisions = owned_revisions(&api, &ec).await?;
    let to = undo_target(&ec, &revisions, args.to_revision.as_deref())
        .map_err(|why| anyhow::anyhow!("{}: {why}", status.envoy_config))?;
    let value = format!("{to}@{}", status.desired_version);
    let message = format!(
        "Version {to} of {} is published next in place of version {}, until the spec changes \
         (`marin3r rollout resume` publishes version {} again).",
        status.envoy_config, status.desired_version, status.desired_version
    );
    write(&api, &name, &status, vec![(UNDO_ANNOTATION, Some(value))]).await?;
    println!("{message}");
    Ok(ExitCode::SUCCESS)
}

/// The version `undo` publishes: `named` when it is a revision Envoy did not reject, else
/// the newest such revision listed before the published one in `status.revisions`.
pub(super) fn undo_target(
    ec: &EnvoyConfig,
    revisions: &[EnvoyConfigRevision],
    named: Option<&str>,
) -> Result<String, String> {
    let desired = ec.spec.version();
    let usable = |v: &str| {
        revisions
            .iter()
            .any(|r| r.spec.version == v && !r.is_tainted())
    };
    let listed: Vec<&str> = ec
        .status
        .iter()
        .flat_map(|s| &s.revisions)
        .map(|r| r.version.as_str())
        .collect();
    if let Some(v) = named {
        if v == desired {
            return Err(format!(
                "version {v} is the desired version; name an earlier one"
            ));
        }
        if !revisions.iter().any(|r| r.spec.version == v) {
            return Err(format!(
                "no revision of version {v}; its revisions are {}",
                listed.join(", ")
            ));
        }
        if !usable(v) {
            return Err(format!("version {v} was rejected by Envoy (tainted)"));
        }
        return Ok(v.to_owned());
    }
    let published = ec
        .status
        .as_ref()
        .and_then(|s| s.published_version.as_deref());
    let before = listed
        .iter()
        .position(|v| Some(*v) == published)
        .unwrap_or(listed.len());
    listed[..before]
        .iter()
        .rev()
        .find(|v| **v != desired && usable(v))
        .map(|v| (*v).to_owned())
        .ok_or_else(|| {
            "no earlier revision Envoy did not reject; name one with --to-revision".to_owned()
        })
}

/// Reads the config, lets `decide` say which annotations to write (or why not), writes
/// them and prints what was done.
async fn act(
    target: &Target,
    decide: impl FnOnce(&EnvoyConfig, &Status) -> anyhow::Result<(Annotations<'static>, String)>,
) -> anyhow::Result<ExitCode> {
    let (api, name) = target.config_api().await?;
    let ec = read(&api, &name).await?;
    let status = Status::of(&ec);
    let (annotations, message) = decide(&ec, &status)?;
    write(&api, &name, &status, annotations).await?;
    println!("{message}");
    Ok(ExitCode::SUCCESS)
}

async fn write(
    api: &Api<EnvoyConfig>,
    name: &str,
    status: &Status,
    annotations: Annotations<'_>,
) -> anyhow::Result<()> {
    let map: serde_json::Map<String, serde_json::Value> = annotations
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.map_or(serde_json::Value::Null, Into::into)))
        .collect();
    let patch = serde_json::json!({"metadata": {"annotations": map}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .with_context(|| format!("annotating {}", status.envoy_config))?;
    Ok(())
}

/// The revisions `ec` owns.
async fn owned_revisions(
    api: &Api<EnvoyConfig>,
    ec: &EnvoyConfig,
) -> anyhow::Result<Vec<EnvoyConfigRevision>> {
    let ns = api.namespace().unwrap_or_default();
    let revisions: Api<EnvoyConfigRevision> = Api::namespaced(api.clone().into_client(), ns);
    let uid = ec.uid().unwrap_or_default();
    Ok(revisions
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing the EnvoyConfigRevisions of {ns}"))?
        .items
        .into_iter()
        .filter(|r| r.owner_references().iter().any(|o| o.uid == uid))
        .collect())
}

#[cfg(test)]
#[path = "rollout_control_tests.rs"]
mod tests;
