//! `marin3r validate -f FILE...`: checks EnvoyConfig manifests offline with the same
//! conversion the controller runs before publishing, so a bad config is caught before
//! `kubectl apply`.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde::Deserialize;

use super::output::Output;
use super::validate_document::{self, Verdict, read_input};

use marin3r_xds::resource::{Resource, ResourceType};

use marin3r_api::EnvoyConfigSpec;
use marin3r_envoyconfig::convert::{
    ConversionError, endpoint_sources, secret_sources, validate_config,
};
use marin3r_envoyconfig::judge::{EnvoyJudge, JudgeError};

const API_VERSION: &str = "marin3r.3scale.net/v1alpha1";
const KIND: &str = "EnvoyConfig";

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Manifest files (YAML or JSON, several documents each); `-` reads standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true, num_args = 1..)]
    files: Vec<PathBuf>,
    /// The Envoy binary that judges what passes marin3r's own checks (`envoy --mode
    /// validate`); default: `envoy` on PATH, when there is one.
    #[arg(long, value_name = "PATH", conflicts_with = "no_envoy")]
    envoy: Option<PathBuf>,
    /// marin3r's own checks only, even with an Envoy on PATH.
    #[arg(long)]
    no_envoy: bool,
    /// `table` (a line per config and per problem, problems on stderr), `json` or `yaml`:
    /// `{"valid": bool, "files": [{file, documents: [{object, result, ...}]}]}` on stdout.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    output: Output,
}

pub fn run(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    let judge = if args.no_envoy {
        None
    } else {
        EnvoyJudge::find(args.envoy.as_deref())
    };
    if let Some(envoy) = &args.envoy
        && !envoy.is_file()
    {
        anyhow::bail!(
            "{} does not run as Envoy (no such file); pass --envoy PATH or --no-envoy",
            envoy.display()
        );
    }
    // Envoy's release is only named in the answer: asked beside the first verdict, not
    // before it. A binary that is no Envoy gives no verdict, which says so.
    if let Some(judge) = judge.clone() {
        std::thread::spawn(move || judge.version());
    }
    let ok = match args.output {
        Output::Table => validate_files_with(
            &args.files,
            judge.as_ref(),
            &mut io::stdout().lock(),
            &mut io::stderr().lock(),
        )?,
        output => {
            let verdicts = |text: &str| {
                let documents = validate_manifests_with(text, judge.as_ref());
                documents.into_iter().map(Verdict::from).collect()
            };
            let (document, ok) = validate_document::files(&args.files, verdicts);
            print!("{}", output.render(&document, String::new)?);
            ok
        }
    };
    if judge.is_none() && !args.no_envoy {
        eprintln!(
            "note: no Envoy found on PATH (--envoy PATH): marin3r's own checks only; Envoy may still refuse what passed them"
        );
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Validates every file, printing one OK line per valid EnvoyConfig on `out` and every
/// problem, prefixed with the file name, on `err`; with `judge`, Envoy judges what passes
/// marin3r's own checks. Returns whether everything was valid.
pub fn validate_files_with(
    files: &[PathBuf],
    judge: Option<&EnvoyJudge>,
    out: &mut impl Write,
    err: &mut impl Write,
) -> io::Result<bool> {
    let mut all_ok = true;
    for path in files {
        let (name, text) = read_input(path);
        let text = match text {
            Ok(text) => text,
            Err(e) => {
                all_ok = false;
                writeln!(err, "{name}: cannot read: {e}")?;
                continue;
            }
        };
        let reports = validate_manifests_with(&text, judge);
        if !reports
            .iter()
            .any(|r| !matches!(r, Document::Skipped { .. }))
        {
            all_ok = false;
            writeln!(err, "{name}: no {KIND} ({API_VERSION}) found")?;
        }
        for report in reports {
            match report {
                Document::Valid {
                    object,
                    summary,
                    warnings,
                } => {
                    writeln!(out, "{name}: {KIND} {object}: OK ({summary})")?;
                    for warning in warnings {
                        writeln!(err, "{name}: {KIND} {object}: warning: {warning}")?;
                    }
                }
                Document::Invalid { object, errors } => {
                    all_ok = false;
                    for problem in errors {
                        // `file:line:column:` is what editors and terminals turn into links.
                        match problem.at {
                            Some((line, column)) => {
                                writeln!(err, "{name}:{line}:{column}: {object}: {}", problem.text)?
                            }
                            None => writeln!(err, "{name}: {object}: {}", problem.text)?,
                        }
                    }
                }
                Document::Skipped { object, notes } => {
                    writeln!(err, "{name}: {object}: skipped, not an {KIND}")?;
                    for note in notes {
                        writeln!(err, "{name}: {object}: note: {note}")?;
                    }
                }
            }
        }
    }
    Ok(all_ok)
}

/// The verdict on one document of a manifest file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Document {
    /// An EnvoyConfig that converts cleanly; `summary` names its node and counts, `warnings`
    /// what Envoy accepts but will not do what the user meant ([`marin3r_envoyconfig::warnings`]).
    Valid {
        object: String,
        summary: String,
        warnings: Vec<String>,
    },
    /// An EnvoyConfig (or a document that cannot be read as one) with every problem found.
    Invalid {
        object: String,
        errors: Vec<Problem>,
    },
    /// Another kind of object, e.g. a Secret in the same file, with what marin3r does
    /// differently from the original with it ([`super::differences`]).
    Skipped { object: String, notes: Vec<String> },
}

impl From<Document> for Verdict {
    fn from(document: Document) -> Self {
        match document {
            Document::Valid {
                object,
                summary,
                warnings,
            } => Verdict::valid(object, summary, warnings),
            Document::Invalid { object, errors } => {
                let problems = errors.into_iter().map(|p| (p.at, p.text)).collect();
                Verdict::invalid(object, problems)
            }
            Document::Skipped { object, notes } => Verdict::skipped(object, notes),
        }
    }
}

/// One problem, with its line and column in the file when it can be placed there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub at: Option<(u64, u64)>,
    pub text: String,
}

impl From<String> for Problem {
    fn from(text: String) -> Self {
        Self { at: None, text }
    }
}

impl From<&str> for Problem {
    fn from(text: &str) -> Self {
        text.to_owned().into()
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    metadata: Metadata,
    spec: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
struct Metadata {
    name: Option<String>,
    namespace: Option<String>,
}

/// Where the `value`s of one document's `spec.envoyResources` lists sit in the file. Read
/// apart from the spec so that a spec that does not deserialize still gets file positions.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ValueSpans {
    spec: Option<SpecSpans>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SpecSpans {
    #[serde(rename = "envoyResources")]
    envoy_resources: Option<HashMap<String, Vec<EntrySpan>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EntrySpan {
    value: Option<serde_saphyr::Spanned<String>>,
}

/// Validates every document of a YAML (or JSON) manifest text.
#[cfg(test)]
pub fn validate_manifests(text: &str) -> Vec<Document> {
    validate_manifests_with(text, None)
}

/// [`validate_manifests`], with Envoy judging what passes marin3r's own checks.
pub fn validate_manifests_with(text: &str, judge: Option<&EnvoyJudge>) -> Vec<Document> {
    let documents: Vec<serde_json::Value> = match serde_saphyr::from_multiple(text) {
        Ok(documents) => documents,
        Err(e) => {
            return vec![Document::Invalid {
                object: "YAML".into(),
                errors: vec![e.without_snippet().to_string().into()],
            }];
        }
    };
    // Positions are a convenience: without them, errors still name their field paths.
    let spans: Vec<Option<ValueSpans>> = serde_saphyr::from_multiple(text)
        .ok()
        .filter(|spans: &Vec<Option<ValueSpans>>| spans.len() == documents.len())
        .unwrap_or_default();
    let services: Vec<(usize, String, String)> = documents
        .iter()
        .enumerate()
        .filter(|(_, doc)| doc["kind"] == "DiscoveryService")
        .map(|(i, doc)| {
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            (
                i,
                text(&doc["metadata"]["namespace"]),
                text(&doc["metadata"]["name"]),
            )
        })
        .collect();
    let mut shared_notes = super::differences::discovery_service_notes(&services);
    documents
        .into_iter()
        .enumerate()
        // `---` with nothing after it is an empty document, not an object.
        .filter(|(_, doc)| !doc.is_null())
        .map(|(i, doc)| {
            let mut extra: Vec<String> = Vec::new();
            shared_notes.retain(|(at, note)| {
                let mine = *at == i;
                if mine {
                    extra.push(note.clone());
                }
                !mine
            });
            let place = |e: &ConversionError| -> Option<(u64, u64)> {
                let spans = spans
                    .get(i)?
                    .as_ref()?
                    .spec
                    .as_ref()?
                    .envoy_resources
                    .as_ref()?;
                file_position(text, spans, e)
            };
            let envoy = judge;
            let mut document = validate_document(i + 1, doc, &place, envoy);
            if let Document::Skipped { notes, .. } = &mut document {
                notes.append(&mut extra);
            }
            document
        })
        .collect()
}

/// The file position of an error inside a `value` written as a literal block scalar
/// (`value: |`), the usual way: its lines are the file's lines, shifted and indented.
/// Other scalar styles fold or escape their text, so their errors keep value positions.
fn file_position(
    text: &str,
    spans: &HashMap<String, Vec<EntrySpan>>,
    err: &ConversionError,
) -> Option<(u64, u64)> {
    let (line, column) = err.value_location?;
    let entry = err
        .path
        .strip_prefix("spec.envoyResources.")?
        .strip_suffix("].value")?;
    let (list, index) = entry.split_once('[')?;
    let span = spans
        .get(list)?
        .get(index.parse::<usize>().ok()?)?
        .value
        .as_ref()?;
    let (start, indent) = (span.referenced.line(), span.referenced.column());
    // The block's indicator ends the line before its first content line.
    let indicator_line = text
        .lines()
        .nth(usize::try_from(start).ok()?.checked_sub(2)?)?;
    let indicator = indicator_line.trim_end().rsplit(' ').next()?;
    if !indicator.starts_with('|') {
        return None;
    }
    Some((
        start + line.saturating_sub(1),
        (indent + column).saturating_sub(1).max(1),
    ))
}

fn validate_document(
    number: usize,
    doc: serde_json::Value,
    place: &dyn Fn(&ConversionError) -> Option<(u64, u64)>,
    envoy: Option<&EnvoyJudge>,
) -> Document {
    let (manifest, name) = match identify(number, doc) {
        Ok(found) => found,
        Err(not_envoy_config) => return not_envoy_config,
    };
    let object = format!("{KIND} {name}");
    let mut errors = header_problems(&manifest);
    let Some(spec) = manifest.spec else {
        errors.push("spec: missing".into());
        return Document::Invalid { object, errors };
    };
    let spec = match marin3r_envoyconfig::rules::read_spec(spec) {
        Ok((spec, unknown)) => {
            errors.extend(unknown.into_iter().map(Problem::from));
            spec
        }
        Err(e) => {
            errors.push(e.into());
            return Document::Invalid { object, errors };
        }
    };
    // What only the discovery service's settings decide, as the webhook judges it: a Secret
    // of another namespace (the manifest's namespace, else `default` as kubectl would use).
    let namespace = manifest.metadata.namespace.as_deref().unwrap_or("default");
    errors.extend(
        secret_sources(&spec.envoy_resources, &spec.resources)
            .iter()
            .filter_map(|source| {
                marin3r_envoyconfig::rules::foreign_secret(source, namespace, false)
            })
            .map(Problem::from),
    );
    match validate_config(&spec) {
        Ok(resources) if errors.is_empty() => match envoy {
            None => Document::Valid {
                object: name,
                summary: summary(&spec, &resources),
                warnings: marin3r_envoyconfig::warnings::warnings(&spec),
            },
            Some(judge) => judged(judge, &spec, &resources, name, object),
        },
        Ok(_) => Document::Invalid { object, errors },
        Err(more) => {
            errors.extend(more.iter().map(|e| match place(e) {
                Some(at) => Problem {
                    at: Some(at),
                    text: format!("{}: {}", e.path, e.message),
                },
                None => e.to_string().into(),
            }));
            Document::Invalid { object, errors }
        }
    }
}

/// The manifest of document `number` with its name (`namespace/name`); else what it is
/// reported as: another kind, skipped with what marin3r does differently with it, or no
/// Kubernetes object at all.
fn identify(number: usize, doc: serde_json::Value) -> Result<(Manifest, String), Document> {
    let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
    let notes = match kind.as_str() {
        KIND => Vec::new(),
        other => super::differences::notes(other, &doc),
    };
    let manifest = match serde_json::from_value::<Manifest>(doc) {
        Ok(manifest) => manifest,
        Err(e) => {
            return Err(Document::Invalid {
                object: format!("document {number}"),
                errors: vec![format!("not a Kubernetes object: {e}").into()],
            });
        }
    };
    let kind = manifest.kind.as_deref().unwrap_or_default();
    let name = match (&manifest.metadata.namespace, &manifest.metadata.name) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        (None, Some(name)) => name.clone(),
        _ => format!("document {number}"),
    };
    if kind != KIND {
        let kind = if kind.is_empty() {
            "object without kind"
        } else {
            kind
        };
        return Err(Document::Skipped {
            object: format!("{kind} {name}"),
            notes,
        });
    }
    Ok((manifest, name))
}

/// Envoy's verdict on a spec our checks passed (`resources`, its converted resources).
fn judged(
    judge: &EnvoyJudge,
    spec: &EnvoyConfigSpec,
    resources: &[Resource],
    name: String,
    object: String,
) -> Document {
    match judge.judge(spec) {
        Ok(()) => Document::Valid {
            object: name,
            summary: format!(
                "{}; accepted by Envoy {}",
                summary(spec, resources),
                judge.version().as_deref().unwrap_or("(release unknown)")
            ),
            warnings: marin3r_envoyconfig::warnings::warnings(spec),
        },
        Err(JudgeError::Refused(refused)) => Document::Invalid {
            object,
            errors: refused.into_iter().map(Problem::from).collect(),
        },
        Err(JudgeError::Unavailable(why)) => Document::Invalid {
            object,
            errors: vec![Problem::from(format!(
                "Envoy could not judge it: {why} (--no-envoy runs marin3r's own checks only)"
            ))],
        },
    }
}

/// What is wrong with an EnvoyConfig's apiVersion and metadata.
fn header_problems(manifest: &Manifest) -> Vec<Problem> {
    let mut errors = Vec::new();
    if manifest.api_version.as_deref() != Some(API_VERSION) {
        let given = manifest.api_version.as_deref().unwrap_or("(missing)");
        // The original's early releases had their own group for EnvoyConfig.
        let advice = if given.starts_with("envoy.marin3r.3scale.net/") {
            " (the original MARIN3R's early group: the spec is the same, see docs/migrating.md)"
        } else {
            ""
        };
        errors.push(Problem::from(format!(
            "apiVersion: {given} is not {API_VERSION}{advice}"
        )));
    }
    if manifest.metadata.name.is_none() {
        errors.push("metadata.name: missing".into());
    }
    errors
}

/// `node <id>, <n> resources: <type> <count>, ...` of a valid spec.
fn summary(spec: &EnvoyConfigSpec, resources: &[Resource]) -> String {
    // Secrets and EndpointSlice endpoints are built when the revision is loaded.
    let generated = |kind: ResourceType| match kind {
        ResourceType::Secret => secret_sources(&spec.envoy_resources, &spec.resources).len(),
        ResourceType::Endpoint => endpoint_sources(&spec.resources).len(),
        _ => 0,
    };
    let per_type: Vec<(ResourceType, usize)> = ResourceType::ALL
        .iter()
        .map(|&kind| {
            let n = resources.iter().filter(|r| r.kind == kind).count();
            (kind, n + generated(kind))
        })
        .collect();
    let total: usize = per_type.iter().map(|(_, n)| n).sum();
    let counts: Vec<String> = per_type
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect();
    let counts = if counts.is_empty() {
        String::new()
    } else {
        format!(": {}", counts.join(", "))
    };
    format!("node {}, {total} resources{counts}", spec.node_id)
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
