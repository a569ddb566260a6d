//! `marin3r validate -f FILE...`: checks EnvoyConfig manifests offline with the same
//! conversion the controller runs before publishing, so a bad config is caught before
//! `kubectl apply`.

use std::io::{self, Read as _, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde::Deserialize;

use crate::api::EnvoyConfigSpec;
use crate::convert::validate_config;
use crate::resource::ResourceType;

const API_VERSION: &str = "marin3r.3scale.net/v1alpha1";
const KIND: &str = "EnvoyConfig";

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Manifest files (YAML or JSON, several documents each); `-` reads standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true, num_args = 1..)]
    files: Vec<PathBuf>,
}

pub fn run(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    let ok = validate_files(
        &args.files,
        &mut io::stdout().lock(),
        &mut io::stderr().lock(),
    )?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Validates every file, printing one OK line per valid EnvoyConfig on `out` and every
/// problem, prefixed with the file name, on `err`. Returns whether everything was valid.
pub fn validate_files(
    files: &[PathBuf],
    out: &mut impl Write,
    err: &mut impl Write,
) -> io::Result<bool> {
    let mut all_ok = true;
    for path in files {
        let (name, text) = if path.as_os_str() == "-" {
            let mut text = String::new();
            let read = io::stdin().read_to_string(&mut text).map(|_| text);
            ("<stdin>".to_owned(), read)
        } else {
            (path.display().to_string(), std::fs::read_to_string(path))
        };
        let text = match text {
            Ok(text) => text,
            Err(e) => {
                all_ok = false;
                writeln!(err, "{name}: cannot read: {e}")?;
                continue;
            }
        };
        let reports = validate_manifests(&text);
        if !reports
            .iter()
            .any(|r| !matches!(r, Document::Skipped { .. }))
        {
            all_ok = false;
            writeln!(err, "{name}: no {KIND} ({API_VERSION}) found")?;
        }
        for report in reports {
            match report {
                Document::Valid { object, summary } => {
                    writeln!(out, "{name}: {KIND} {object}: OK ({summary})")?;
                }
                Document::Invalid { object, errors } => {
                    all_ok = false;
                    for e in errors {
                        writeln!(err, "{name}: {object}: {e}")?;
                    }
                }
                Document::Skipped { object } => {
                    writeln!(err, "{name}: {object}: skipped, not an {KIND}")?;
                }
            }
        }
    }
    Ok(all_ok)
}

/// The verdict on one document of a manifest file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Document {
    /// An EnvoyConfig that converts cleanly; `summary` names its node and counts.
    Valid { object: String, summary: String },
    /// An EnvoyConfig (or a document that cannot be read as one) with every problem found.
    Invalid { object: String, errors: Vec<String> },
    /// Another kind of object, e.g. a Secret in the same file.
    Skipped { object: String },
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

/// Validates every document of a YAML (or JSON) manifest text.
pub fn validate_manifests(text: &str) -> Vec<Document> {
    let documents: Vec<serde_json::Value> = match serde_saphyr::from_multiple(text) {
        Ok(documents) => documents,
        Err(e) => {
            return vec![Document::Invalid {
                object: "YAML".into(),
                errors: vec![e.without_snippet().to_string()],
            }];
        }
    };
    documents
        .into_iter()
        .enumerate()
        // `---` with nothing after it is an empty document, not an object.
        .filter(|(_, doc)| !doc.is_null())
        .map(|(i, doc)| validate_document(i + 1, doc))
        .collect()
}

fn validate_document(number: usize, doc: serde_json::Value) -> Document {
    let manifest = match serde_json::from_value::<Manifest>(doc) {
        Ok(manifest) => manifest,
        Err(e) => {
            return Document::Invalid {
                object: format!("document {number}"),
                errors: vec![format!("not a Kubernetes object: {e}")],
            };
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
        return Document::Skipped {
            object: format!("{kind} {name}"),
        };
    }
    let object = format!("{KIND} {name}");
    let mut errors = Vec::new();
    if manifest.api_version.as_deref() != Some(API_VERSION) {
        errors.push(format!(
            "apiVersion: {} is not {API_VERSION}",
            manifest.api_version.as_deref().unwrap_or("(missing)")
        ));
    }
    if manifest.metadata.name.is_none() {
        errors.push("metadata.name: missing".into());
    }
    let Some(spec) = manifest.spec else {
        errors.push("spec: missing".into());
        return Document::Invalid { object, errors };
    };
    let spec: EnvoyConfigSpec = match serde_path_to_error::deserialize(spec) {
        Ok(spec) => spec,
        Err(e) => {
            errors.push(format!("spec.{}: {}", e.path(), e.inner()));
            return Document::Invalid { object, errors };
        }
    };
    match validate_config(&spec) {
        Ok(resources) if errors.is_empty() => {
            let mut counts: Vec<String> = ResourceType::ALL
                .iter()
                .filter_map(|&kind| {
                    let n = resources.iter().filter(|r| r.kind == kind).count();
                    (n > 0).then(|| format!("{kind} {n}"))
                })
                .collect();
            if !spec.envoy_resources.secrets.is_empty() {
                counts.push(format!("secrets {}", spec.envoy_resources.secrets.len()));
            }
            let total = resources.len() + spec.envoy_resources.secrets.len();
            let counts = if counts.is_empty() {
                String::new()
            } else {
                format!(": {}", counts.join(", "))
            };
            Document::Valid {
                object: name,
                summary: format!("node {}, {total} resources{counts}", spec.node_id),
            }
        }
        Ok(_) => Document::Invalid { object, errors },
        Err(more) => {
            errors.extend(more.iter().map(ToString::to_string));
            Document::Invalid { object, errors }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: &str = "name: backend\\nconnect_timeout: 1s";

    fn mk_manifest(name: &str, clusters: &[&str]) -> String {
        let mut doc = format!(
            "apiVersion: {API_VERSION}\nkind: EnvoyConfig\nmetadata: {{ name: {name}, \
             namespace: default }}\nspec:\n  nodeID: proxy\n  serialization: yaml\n  \
             envoyResources:\n    clusters:\n"
        );
        for value in clusters {
            doc.push_str(&format!("      - value: \"{value}\"\n"));
        }
        doc
    }

    #[test]
    fn every_document_gets_a_verdict() {
        let text = [
            mk_manifest("good", &[CLUSTER]),
            "apiVersion: v1\nkind: Secret\nmetadata: { name: s }\n".into(),
            mk_manifest("bad", &[CLUSTER, "name: x\\nconect_timeout: 1s"]),
            String::new(),
        ]
        .join("---\n");
        assert_eq!(
            validate_manifests(&text),
            [
                Document::Valid {
                    object: "default/good".into(),
                    summary: "node proxy, 1 resources: clusters 1".into()
                },
                Document::Skipped {
                    object: "Secret s".into()
                },
                Document::Invalid {
                    object: "EnvoyConfig default/bad".into(),
                    errors: vec![
                        "spec.envoyResources.clusters[1].value: unknown field \
                         \"conect_timeout\" (line 2, column 1 of the value)"
                            .into()
                    ]
                },
            ]
        );
    }

    /// The errors of the only document of `text`.
    fn only_errors(text: &str) -> Vec<String> {
        match validate_manifests(text).as_slice() {
            [Document::Invalid { errors, .. }] => errors.clone(),
            other => panic!("one invalid document expected, got {other:?}"),
        }
    }

    #[test]
    fn spec_shape_errors_name_their_path() {
        let text =
            mk_manifest("m", &[]).replace("    clusters:\n", "    clusters:\n      - name: x\n");
        let text = text.replace(
            "apiVersion: marin3r.3scale.net/v1alpha1",
            "apiVersion: marin3r.3scale.net/v1",
        );
        assert_eq!(
            only_errors(&text),
            [
                "apiVersion: marin3r.3scale.net/v1 is not marin3r.3scale.net/v1alpha1",
                "spec.envoyResources.clusters[0]: missing field `value`",
            ]
        );
        assert_eq!(
            only_errors("kind: EnvoyConfig\napiVersion: x\n: [").len(),
            1
        );
    }
}
