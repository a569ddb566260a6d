//! `marin3r validate -o json|yaml`: the verdicts as one document for scripts and CI, every
//! problem with its place in the file, instead of lines on stdout and stderr.

use std::path::PathBuf;

use serde::Serialize;

use super::validate::{Document, read_input, validate_manifests_with};
use marin3r_envoyconfig::judge::EnvoyJudge;

#[derive(Debug, Serialize)]
pub struct Report {
    /// Whether every file held an EnvoyConfig and every EnvoyConfig is valid (the exit code
    /// says the same).
    valid: bool,
    files: Vec<File>,
}

#[derive(Debug, Serialize)]
struct File {
    file: String,
    /// Why the file gave no verdict: it could not be read, or it holds no EnvoyConfig.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    documents: Vec<Verdict>,
}

#[derive(Debug, Serialize)]
struct Verdict {
    /// An EnvoyConfig's `NAMESPACE/NAME`, or the kind and name of another object.
    object: String,
    /// `valid`, `invalid`, or `skipped` (not an EnvoyConfig).
    result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    summary: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    problems: Vec<Problem>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Problem {
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    column: Option<u64>,
    message: String,
}

impl From<Document> for Verdict {
    fn from(document: Document) -> Self {
        let verdict = |object, result| Verdict {
            object,
            result,
            summary: None,
            warnings: Vec::new(),
            problems: Vec::new(),
            notes: Vec::new(),
        };
        match document {
            Document::Valid {
                object,
                summary,
                warnings,
            } => Verdict {
                summary: Some(summary),
                warnings,
                ..verdict(object, "valid")
            },
            Document::Invalid { object, errors } => Verdict {
                problems: errors
                    .into_iter()
                    .map(|p| Problem {
                        line: p.at.map(|(line, _)| line),
                        column: p.at.map(|(_, column)| column),
                        message: p.text,
                    })
                    .collect(),
                ..verdict(object, "invalid")
            },
            Document::Skipped { object, notes } => Verdict {
                notes,
                ..verdict(object, "skipped")
            },
        }
    }
}

/// Validates every file as `marin3r validate` does: the document, and whether all is valid.
pub fn files(paths: &[PathBuf], judge: Option<&EnvoyJudge>) -> (Report, bool) {
    let mut files = Vec::new();
    for path in paths {
        let (file, text) = read_input(path);
        let text = match text {
            Ok(text) => text,
            Err(e) => {
                let error = Some(format!("cannot read: {e}"));
                files.push(File {
                    file,
                    error,
                    documents: Vec::new(),
                });
                continue;
            }
        };
        let documents: Vec<Verdict> = validate_manifests_with(&text, judge)
            .into_iter()
            .map(Verdict::from)
            .collect();
        let none = documents.iter().all(|d| d.result == "skipped");
        let error = none.then(|| "no EnvoyConfig (marin3r.3scale.net/v1alpha1) found".to_owned());
        files.push(File {
            file,
            error,
            documents,
        });
    }
    let valid = files
        .iter()
        .all(|f| f.error.is_none() && f.documents.iter().all(|d| d.result != "invalid"));
    (Report { valid, files }, valid)
}
