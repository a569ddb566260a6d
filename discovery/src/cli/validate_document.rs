//! `marin3r validate -o json|yaml`: the verdicts as one document for scripts and CI, every
//! problem with its place in the file, instead of lines on stdout and stderr.

use std::io::{self, Read as _};
use std::path::PathBuf;

use serde::Serialize;

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
pub(super) struct Verdict {
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

impl Verdict {
    fn new(object: String, result: &'static str) -> Self {
        Self {
            object,
            result,
            summary: None,
            warnings: Vec::new(),
            problems: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// An EnvoyConfig that converts cleanly.
    pub(super) fn valid(object: String, summary: String, warnings: Vec<String>) -> Self {
        Self {
            summary: Some(summary),
            warnings,
            ..Self::new(object, "valid")
        }
    }

    /// A document with its problems, each at its (line, column) when it can be placed.
    pub(super) fn invalid(object: String, problems: Vec<(Option<(u64, u64)>, String)>) -> Self {
        let problems = problems
            .into_iter()
            .map(|(at, message)| Problem {
                line: at.map(|(line, _)| line),
                column: at.map(|(_, column)| column),
                message,
            })
            .collect();
        Self {
            problems,
            ..Self::new(object, "invalid")
        }
    }

    /// Another kind of object, with what marin3r does differently from the original with it.
    pub(super) fn skipped(object: String, notes: Vec<String>) -> Self {
        Self {
            notes,
            ..Self::new(object, "skipped")
        }
    }
}

/// The name a file is reported by, and its text; `-` is standard input.
pub(super) fn read_input(path: &std::path::Path) -> (String, io::Result<String>) {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        let read = io::stdin().read_to_string(&mut text).map(|_| text);
        ("<stdin>".to_owned(), read)
    } else {
        (path.display().to_string(), std::fs::read_to_string(path))
    }
}

/// Validates every file with `validate` (its text to a verdict per document), as `marin3r
/// validate` does: the document, and whether all is valid.
pub(super) fn files(paths: &[PathBuf], validate: impl Fn(&str) -> Vec<Verdict>) -> (Report, bool) {
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
        let documents = validate(&text);
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
