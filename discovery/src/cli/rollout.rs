//! `marin3r rollout`: an EnvoyConfig's revisions read as a rollout. `history` lists them in
//! publication order (the order of `status.revisions`) with when each was made, whether it is
//! published, the desired version, tainted and why; `diff` shows what changes between two of
//! them in Envoy's terms: each revision converted as the discovery service serves it (proto3
//! JSON with proto field names, secret fields redacted), compared by type and name, with a
//! unified diff for each resource that differs. Secrets and EndpointSlice endpoints are built
//! from cluster objects when a revision loads: `diff` compares which ones each revision
//! names, not their content.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use kube::{Api, ResourceExt};
use serde::Serialize;

use super::cluster::ConfigTarget as Target;
use super::output::Output;
use super::table::aligned;
use crate::proxy_config::{Entry, diff, printable, served};
use marin3r_api::{EnvoyConfig, EnvoyConfigRevision};
use marin3r_envoyconfig::convert;

#[derive(Debug, Subcommand)]
pub enum RolloutCommand {
    /// An EnvoyConfig's revisions in publication order: version, revision, when it was made,
    /// and whether it is published, desired or tainted (with why).
    History(HistoryArgs),
    /// What changes between two revisions of an EnvoyConfig, resource by resource, in Envoy's
    /// terms (secret fields redacted). Exit code 0 when they are alike, 1 when they differ, 2
    /// when they could not be compared.
    Diff(DiffArgs),
    /// Where the rollout of an EnvoyConfig's desired version stands: its phase, the version
    /// it replaces, its canary step, and why it is held. `--watch` waits until the discovery
    /// service has acted on the spec and no step is under way, then exits 0 when its version
    /// is published and 1 when not.
    Status(super::rollout_status::StatusArgs),
    /// Approves the version the blast-radius guard holds, so that it is published; during
    /// canary steps, ends the current step's bake at once.
    Promote(super::rollout_control::ControlArgs),
    /// Stops the canary steps where they are: the canaries keep the new version, the others
    /// wait; a canary's NACK still rolls it back.
    Pause(super::rollout_control::ControlArgs),
    /// Removes a pause, an abort or an undo: the rollout goes on (an aborted one from step
    /// 1; an undone one publishes the desired version).
    Resume(super::rollout_control::ControlArgs),
    /// Aborts the canary steps: every proxy gets the published version back; the new
    /// version is not published while the spec stays.
    Abort(super::rollout_control::ControlArgs),
    /// Publishes an earlier revision in place of the desired version, without changing the
    /// spec, until the spec changes.
    Undo(super::rollout_control::UndoArgs),
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    target: Target,
    /// `table`, `json` or `yaml`: `{"envoyConfig", "desiredVersion", "publishedVersion",
    /// "revisions": [...]}`.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    #[command(flatten)]
    target: Target,
    /// The version to compare from (default: the revision before `--to` in the history).
    #[arg(long, value_name = "VERSION")]
    from: Option<String>,
    /// The version to compare to (default: the published revision, else the newest).
    #[arg(long, value_name = "VERSION")]
    to: Option<String>,
}

pub async fn run(command: RolloutCommand) -> anyhow::Result<ExitCode> {
    match command {
        RolloutCommand::History(args) => {
            let history = History::read(&args.target).await?;
            let text = args.output.render(&history, || history.table())?;
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        // As `diff` and `kubectl diff`: 1 when the revisions differ, 2 when they could not
        // be compared.
        RolloutCommand::Status(args) => super::rollout_status::status(args).await,
        RolloutCommand::Promote(args) => super::rollout_control::promote(args).await,
        RolloutCommand::Pause(args) => super::rollout_control::pause(args).await,
        RolloutCommand::Resume(args) => super::rollout_control::resume(args).await,
        RolloutCommand::Abort(args) => super::rollout_control::abort(args).await,
        RolloutCommand::Undo(args) => super::rollout_control::undo(args).await,
        RolloutCommand::Diff(args) => match diff(&args).await {
            Ok(alike) => Ok(ExitCode::from(u8::from(!alike))),
            Err(err) => {
                eprintln!("error: {}", super::error_line(&err));
                Ok(ExitCode::from(2))
            }
        },
    }
}

/// Prints the comparison; whether the two revisions are alike.
async fn diff(args: &DiffArgs) -> anyhow::Result<bool> {
    let history = History::read(&args.target).await?;
    let (from, to) = history.pair(args.from.as_deref(), args.to.as_deref())?;
    let report = compare(&Side::of(from)?, &Side::of(to)?);
    print!("{}", report.text);
    Ok(report.alike)
}

/// The EnvoyConfig's revisions as `history` prints them.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct History {
    envoy_config: String,
    desired_version: Option<String>,
    published_version: Option<String>,
    revisions: Vec<Row>,
    /// The revisions themselves, for `diff`.
    #[serde(skip)]
    objects: Vec<EnvoyConfigRevision>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Row {
    version: String,
    revision: String,
    created: Option<String>,
    published: bool,
    desired: bool,
    tainted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    taint_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    taint_message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_published_at: Option<String>,
}

impl History {
    async fn read(target: &Target) -> anyhow::Result<Self> {
        let (configs, name) = target.config_api().await?;
        let ns = configs.namespace().unwrap_or_default().to_owned();
        let config = super::rollout_status::read(&configs, &name).await?;
        let revisions: Api<EnvoyConfigRevision> = Api::namespaced(configs.into_client(), &ns);
        let mut objects = Vec::new();
        for entry in config.status.iter().flat_map(|s| &s.revisions) {
            let Some(name) = entry.revision_ref.name.as_deref() else {
                continue;
            };
            // A revision deleted since the status was written is left out.
            if let Some(revision) = revisions
                .get_opt(name)
                .await
                .with_context(|| format!("reading EnvoyConfigRevision {ns}/{name}"))?
            {
                objects.push(revision);
            }
        }
        Ok(Self::of(&config, objects))
    }

    fn of(config: &EnvoyConfig, objects: Vec<EnvoyConfigRevision>) -> Self {
        let status = config.status.as_ref();
        let desired_version = status.and_then(|s| s.desired_version.clone());
        let revisions = objects
            .iter()
            .map(|r| Row::of(r, desired_version.as_deref()))
            .collect();
        Self {
            envoy_config: format!(
                "{}/{}",
                config.namespace().unwrap_or_default(),
                config.name_any()
            ),
            desired_version,
            published_version: status.and_then(|s| s.published_version.clone()),
            revisions,
            objects,
        }
    }

    fn table(&self) -> String {
        if self.revisions.is_empty() {
            return format!("EnvoyConfig {} has no revision yet.\n", self.envoy_config);
        }
        let mut rows = vec![
            ["VERSION", "REVISION", "CREATED", "STATE"]
                .map(String::from)
                .to_vec(),
        ];
        for row in &self.revisions {
            rows.push(vec![
                row.version.clone(),
                row.revision.clone(),
                row.created.clone().unwrap_or_default(),
                row.state(),
            ]);
        }
        aligned(&rows)
    }

    /// The revisions `diff` compares: `to` (default: the published one, else the newest) and
    /// `from` (default: the one listed before `to`).
    fn pair(
        &self,
        from: Option<&str>,
        to: Option<&str>,
    ) -> anyhow::Result<(&EnvoyConfigRevision, &EnvoyConfigRevision)> {
        let known = || {
            let versions: Vec<&str> = self.revisions.iter().map(|r| r.version.as_str()).collect();
            if versions.is_empty() {
                "it has no revision".to_owned()
            } else {
                format!("its revisions are {}", versions.join(", "))
            }
        };
        let find = |version: &str| {
            self.objects
                .iter()
                .position(|r| r.spec.version == version)
                .with_context(|| {
                    format!(
                        "EnvoyConfig {} has no revision of version {version}: {}",
                        self.envoy_config,
                        known()
                    )
                })
        };
        let to = match to {
            Some(version) => find(version)?,
            None => match self.objects.iter().position(|r| r.is_published()) {
                Some(i) => i,
                None if self.objects.is_empty() => {
                    bail!("EnvoyConfig {} has no revision yet", self.envoy_config)
                }
                None => self.objects.len() - 1,
            },
        };
        let from = match from {
            Some(version) => find(version)?,
            None if to == 0 => bail!(
                "revision {} of EnvoyConfig {} is the first: name one to compare with \
                 (--from); {}",
                self.objects[to].spec.version,
                self.envoy_config,
                known()
            ),
            None => to - 1,
        };
        Ok((&self.objects[from], &self.objects[to]))
    }
}

impl Row {
    fn of(revision: &EnvoyConfigRevision, desired: Option<&str>) -> Self {
        let taint = revision.taint_condition();
        Self {
            version: revision.spec.version.clone(),
            revision: revision.name_any(),
            created: revision.creation_timestamp().map(|t| t.0.to_string()),
            published: revision.is_published(),
            desired: desired == Some(revision.spec.version.as_str()),
            tainted: revision.is_tainted(),
            taint_reason: taint.map(|c| c.reason.clone()),
            taint_message: taint.map(|c| c.message.clone()),
            last_published_at: revision
                .status
                .as_ref()
                .and_then(|s| s.last_published_at.as_ref())
                .map(|t| t.0.to_string()),
        }
    }

    /// `published, desired`, `tainted (RejectedByEnvoy): ...` or `-`.
    fn state(&self) -> String {
        let mut words = Vec::new();
        if self.published {
            words.push("published".to_owned());
        }
        if self.desired {
            words.push("desired".to_owned());
        }
        if self.tainted {
            let reason = self.taint_reason.as_deref().unwrap_or("Tainted");
            let message = self.taint_message.as_deref().unwrap_or_default();
            let message = printable(message.lines().next().unwrap_or(""));
            words.push(
                format!("tainted ({reason}): {message}")
                    .trim_end_matches(": ")
                    .to_owned(),
            );
        }
        if words.is_empty() {
            "-".to_owned()
        } else {
            words.join(", ")
        }
    }
}

/// One revision as `diff` reads it: its resources as served, and the Secrets and
/// EndpointSlice sources it names.
struct Side {
    label: String,
    resources: BTreeMap<String, Entry>,
    sources: Vec<String>,
}

impl Side {
    fn of(revision: &EnvoyConfigRevision) -> anyhow::Result<Self> {
        let label = format!(
            "{} (revision {})",
            revision.spec.version,
            revision.name_any()
        );
        let config = revision.spec.config();
        let resources = convert::validate_config(&config).map_err(|errors| {
            let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
            anyhow::anyhow!("{label} does not convert: {}", all.join("; "))
        })?;
        let snapshot = marin3r_xds::Snapshot::new(resources)
            .with_context(|| format!("building the snapshot of {label}"))?;
        let rendered = served::render("", &config.node_id, &snapshot)
            .with_context(|| format!("decoding the resources of {label}"))?;
        // A revision holds what a tenant wrote: no control character reaches the terminal
        // (the JSON of each resource escapes its own; the names are escaped here).
        let resources = rendered
            .resources
            .into_iter()
            .map(|e| (printable(&format!("{}/{}", e.kind, e.name)).into_owned(), e))
            .collect();
        let mut sources: Vec<String> =
            convert::secret_sources(&config.envoy_resources, &config.resources)
                .iter()
                .map(|s| {
                    let from = match &s.namespace {
                        Some(ns) => format!("{ns}/{}", s.secret_name),
                        None => s.secret_name.clone(),
                    };
                    printable(&format!("secret {} from Secret {from}", s.sds_name)).into_owned()
                })
                .collect();
        sources.extend(
            convert::endpoint_sources(&config.resources)
                .iter()
                .map(|s| {
                    let selector = serde_json::to_string(&s.selector).unwrap_or_default();
                    format!(
                        "endpoints of cluster {} from EndpointSlices {selector}, port {}",
                        s.cluster_name, s.target_port
                    )
                }),
        );
        Ok(Self {
            label,
            resources,
            sources,
        })
    }
}

struct Report {
    alike: bool,
    text: String,
}

fn compare(from: &Side, to: &Side) -> Report {
    let mut out = String::new();
    let _ = writeln!(out, "from {}\nto   {}", from.label, to.label);
    let split = diff::split(
        &from.resources,
        &to.resources,
        |key| format!("{key} {}", from.label),
        |key| format!("{key} {}", to.label),
    );
    let sources_added: Vec<&String> = to
        .sources
        .iter()
        .filter(|s| !from.sources.contains(s))
        .collect();
    let sources_removed: Vec<&String> = from
        .sources
        .iter()
        .filter(|s| !to.sources.contains(s))
        .collect();
    let alike = split.only_first.is_empty()
        && split.only_second.is_empty()
        && split.differ.is_empty()
        && sources_added.is_empty()
        && sources_removed.is_empty();
    let same = split.same.len();
    if alike {
        let _ = writeln!(out, "No difference: the {same} resource(s) are alike.");
        return Report { alike, text: out };
    }
    let _ = writeln!(out, "{same} resource(s) alike.");
    for key in &split.only_first {
        let _ = writeln!(out, "  removed: {key}");
    }
    for key in &split.only_second {
        let _ = writeln!(out, "  added: {key}");
    }
    for source in &sources_removed {
        let _ = writeln!(out, "  no longer built: {source}");
    }
    for source in &sources_added {
        let _ = writeln!(out, "  now built: {source}");
    }
    for (key, unified) in &split.differ {
        let _ = writeln!(out, "  changed: {key}");
        out.push_str(unified);
    }
    Report { alike, text: out }
}

#[cfg(test)]
#[path = "rollout_tests.rs"]
mod tests;
