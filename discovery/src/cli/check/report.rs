//! What `marin3r check` found: one verdict per check, printed as lines for people or as one
//! JSON or YAML document (`-o json|yaml`) for scripts. A warning is never counted as a pass.

use std::fmt::Write;

use serde::Serialize;

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    Pass(String),
    /// What is not right, and what to do; it does not fail the run.
    Warn(String, String),
    /// What is wrong, and what to do.
    Fail(String, String),
}

#[derive(Debug, Default)]
pub(super) struct Report {
    lines: Vec<(String, Verdict)>,
}

/// The `-o json|yaml` document.
#[derive(Debug, Serialize)]
struct Document<'a> {
    checks: Vec<Line<'a>>,
    summary: Summary,
}

#[derive(Debug, Serialize)]
struct Line<'a> {
    check: &'a str,
    /// `pass`, `warn` or `fail`.
    result: &'static str,
    /// What was found.
    detail: &'a str,
    /// What to do, for a warning or a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<&'a str>,
}

#[derive(Debug, Serialize)]
struct Summary {
    total: usize,
    passed: usize,
    warned: usize,
    failed: usize,
}

impl Report {
    pub(super) fn add(&mut self, check: impl Into<String>, verdict: Verdict) {
        self.lines.push((check.into(), verdict));
    }

    pub(super) fn pass(&mut self, check: impl Into<String>, detail: impl Into<String>) {
        self.add(check, Verdict::Pass(detail.into()));
    }

    pub(super) fn warn(
        &mut self,
        check: impl Into<String>,
        what: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.add(check, Verdict::Warn(what.into(), fix.into()));
    }

    pub(super) fn fail(
        &mut self,
        check: impl Into<String>,
        what: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.add(check, Verdict::Fail(what.into(), fix.into()));
    }

    pub(super) fn failures(&self) -> usize {
        let failed = |(_, v): &&(String, Verdict)| matches!(v, Verdict::Fail(..));
        self.lines.iter().filter(failed).count()
    }

    fn warnings(&self) -> usize {
        let warned = |(_, v): &&(String, Verdict)| matches!(v, Verdict::Warn(..));
        self.lines.iter().filter(warned).count()
    }

    fn summary(&self) -> Summary {
        let (total, failed, warned) = (self.lines.len(), self.failures(), self.warnings());
        Summary {
            total,
            passed: total - failed - warned,
            warned,
            failed,
        }
    }

    /// The `-o json|yaml` document: every check with its result, and the counts.
    pub(super) fn document(&self) -> impl Serialize + '_ {
        let checks = self
            .lines
            .iter()
            .map(|(check, verdict)| {
                let (result, detail, fix) = match verdict {
                    Verdict::Pass(detail) => ("pass", detail, None),
                    Verdict::Warn(what, fix) => ("warn", what, Some(fix.as_str())),
                    Verdict::Fail(what, fix) => ("fail", what, Some(fix.as_str())),
                };
                Line {
                    check,
                    result,
                    detail,
                    fix,
                }
            })
            .collect();
        Document {
            checks,
            summary: self.summary(),
        }
    }

    /// The lines for people, then the counts.
    pub(super) fn render(&self) -> String {
        let mut out = String::new();
        for (check, verdict) in &self.lines {
            let _ = match verdict {
                Verdict::Pass(detail) => writeln!(out, "[ok]   {check}: {detail}"),
                Verdict::Warn(what, fix) => {
                    writeln!(out, "[warn] {check}: {what}\n       -> {fix}")
                }
                Verdict::Fail(what, fix) => {
                    writeln!(out, "[FAIL] {check}: {what}\n       -> {fix}")
                }
            };
        }
        let Summary {
            total: all,
            passed,
            warned,
            failed,
        } = self.summary();
        let _ = match (failed, warned) {
            (0, 0) => writeln!(out, "\nAll {all} checks passed."),
            (0, w) => writeln!(out, "\n{passed} of {all} checks passed; {w} warned."),
            (f, 0) => writeln!(out, "\n{f} of {all} checks failed."),
            (f, w) => writeln!(out, "\n{f} of {all} checks failed; {w} warned."),
        };
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_says_what_failed_and_what_to_do() {
        let mut r = Report::default();
        r.pass("CRD a", "current");
        r.warn("EnvoyConfig x", "rolled back", "describe it");
        assert_eq!(r.failures(), 0);
        // A warning is not a pass.
        assert!(r.render().ends_with("\n1 of 2 checks passed; 1 warned.\n"));
        r.fail("webhook w", "bad caBundle", "rewrite it");
        assert_eq!(r.failures(), 1);
        let out = r.render();
        assert!(
            out.contains("[FAIL] webhook w: bad caBundle\n       -> rewrite it\n"),
            "{out}"
        );
        assert!(out.ends_with("1 of 3 checks failed; 1 warned.\n"), "{out}");
        let mut clean = Report::default();
        clean.pass("CRD a", "current");
        assert!(clean.render().ends_with("\nAll 1 checks passed.\n"));
    }

    #[test]
    fn the_document_has_every_check_and_counts_a_warning_apart() {
        let mut r = Report::default();
        r.pass("CRD a", "current");
        r.warn("EnvoyConfig x", "rolled back", "describe it");
        r.fail("webhook w", "bad caBundle", "rewrite it");
        let doc = serde_json::to_value(r.document()).unwrap();
        assert_eq!(
            doc,
            serde_json::json!({
                "checks": [
                    {"check": "CRD a", "result": "pass", "detail": "current"},
                    {"check": "EnvoyConfig x", "result": "warn", "detail": "rolled back",
                     "fix": "describe it"},
                    {"check": "webhook w", "result": "fail", "detail": "bad caBundle",
                     "fix": "rewrite it"},
                ],
                "summary": {"total": 3, "passed": 1, "warned": 1, "failed": 1},
            })
        );
    }
}
