//! The suite's result: one line per check, a summary, JUnit XML and JSON.

use std::fmt::Write as _;

use serde::Serialize;

use crate::trace::CallTrace;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    /// Does not apply to this provider or fabric (the reason says why).
    Skip,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    pub name: String,
    pub status: Status,
    /// Why it passed, failed or was skipped.
    pub why: String,
    pub duration_ms: f64,
    /// The provider calls the check made, with their capability traces.
    pub calls: Vec<CallTrace>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub component: String,
    /// `name version by vendor` from describe(), when the contract has it.
    pub provider: Option<String>,
    pub contract: String,
    /// `fti`, `redfish` (simulators) or `lab <endpoint>`.
    pub fabric: String,
    pub checks: Vec<CheckResult>,
    pub duration_ms: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl Report {
    pub fn summary(&self) -> Summary {
        let count = |s| self.checks.iter().filter(|c| c.status == s).count();
        Summary {
            passed: count(Status::Pass),
            failed: count(Status::Fail),
            skipped: count(Status::Skip),
        }
    }

    /// No check failed (and at least one ran).
    pub fn passed(&self) -> bool {
        let s = self.summary();
        s.failed == 0 && s.passed > 0
    }

    pub fn check(&self, name: &str) -> Option<&CheckResult> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// One line per check and the summary; `verbose` adds every call's trace.
    pub fn text(&self, verbose: bool) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "conformance of {} (contract {}{}) against {}",
            self.component,
            self.contract,
            self.provider
                .as_deref()
                .map(|p| format!(", {p}"))
                .unwrap_or_default(),
            self.fabric
        );
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        for c in &self.checks {
            let _ = writeln!(
                out,
                "{} {:width$}  {}",
                c.status.as_str(),
                c.name,
                one_line(&c.why)
            );
            if verbose {
                for call in &c.calls {
                    let _ = writeln!(
                        out,
                        "       {} -> {} ({:.1} ms, peak memory {} KiB)",
                        call.operation,
                        one_line(&call.outcome),
                        call.duration_ms,
                        call.peak_memory_bytes / 1024
                    );
                    for u in &call.uses {
                        let _ = writeln!(out, "         {}", one_line(&u.line()));
                    }
                }
            }
        }
        let s = self.summary();
        let _ = writeln!(
            out,
            "{}: {} passed, {} failed, {} skipped in {:.1} s",
            if self.passed() { "PASSED" } else { "FAILED" },
            s.passed,
            s.failed,
            s.skipped,
            self.duration_ms / 1000.0
        );
        out
    }

    pub fn json(&self) -> String {
        #[derive(Serialize)]
        struct Out<'a> {
            passed: bool,
            summary: Summary,
            #[serde(flatten)]
            report: &'a Report,
        }
        serde_json::to_string_pretty(&Out {
            passed: self.passed(),
            summary: self.summary(),
            report: self,
        })
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// JUnit XML: one test suite, one test case per check (a failure or a skip element
    /// with the reason), the calls' traces as system-out.
    pub fn junit(&self) -> String {
        let s = self.summary();
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let fabric: String = self
            .fabric
            .to_ascii_lowercase()
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join("-");
        let suite = format!("cro-conformance.{fabric}");
        let _ = writeln!(
            out,
            "<testsuites name=\"cro provider test\" tests=\"{}\" failures=\"{}\" skipped=\"{}\" time=\"{:.3}\">",
            self.checks.len(),
            s.failed,
            s.skipped,
            self.duration_ms / 1000.0
        );
        let _ = writeln!(
            out,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\" time=\"{:.3}\">",
            xml(&suite),
            self.checks.len(),
            s.failed,
            s.skipped,
            self.duration_ms / 1000.0
        );
        for c in &self.checks {
            let _ = write!(
                out,
                "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\">",
                xml(&suite),
                xml(&c.name),
                c.duration_ms / 1000.0
            );
            match c.status {
                Status::Pass => {}
                Status::Fail => {
                    let _ = write!(
                        out,
                        "<failure message=\"{}\">{}</failure>",
                        xml(&one_line(&c.why)),
                        xml(&c.why)
                    );
                }
                Status::Skip => {
                    let _ = write!(out, "<skipped message=\"{}\"/>", xml(&one_line(&c.why)));
                }
            }
            if !c.calls.is_empty() {
                let mut trace = String::new();
                for call in &c.calls {
                    let _ = writeln!(trace, "{} -> {}", call.operation, call.outcome);
                    for u in &call.uses {
                        let _ = writeln!(trace, "  {}", u.line());
                    }
                }
                let _ = write!(out, "<system-out>{}</system-out>", xml(&trace));
            }
            out.push_str("</testcase>\n");
        }
        out.push_str("  </testsuite>\n</testsuites>\n");
        out
    }
}

/// Text a provider wrote, on one line.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// Escapes text for XML attributes and content; drops characters XML 1.0 cannot carry.
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(ch),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            component: "p.wasm".into(),
            provider: None,
            contract: "0.2.0".into(),
            fabric: "fti".into(),
            checks: vec![
                CheckResult {
                    name: "attach".into(),
                    status: Status::Pass,
                    why: "ok".into(),
                    duration_ms: 1.0,
                    calls: vec![],
                },
                CheckResult {
                    name: "detach".into(),
                    status: Status::Fail,
                    why: "bad <\"x\"> & \u{1}".into(),
                    duration_ms: 1.0,
                    calls: vec![],
                },
            ],
            duration_ms: 2.0,
        }
    }

    #[test]
    fn a_failure_fails_the_report_and_xml_is_escaped() {
        let r = report();
        assert!(!r.passed());
        let x = r.junit();
        assert!(x.contains("failures=\"1\""), "{x}");
        assert!(x.contains("bad &lt;&quot;x&quot;&gt; &amp; "), "{x}");
        assert!(!x.contains('\u{1}'));
        let t = r.text(false);
        assert!(t.contains("FAIL detach"), "{t}");
        assert!(
            t.ends_with("FAILED: 1 passed, 1 failed, 0 skipped in 0.0 s\n"),
            "{t}"
        );
    }

    #[test]
    fn nothing_run_is_not_a_pass() {
        let mut r = report();
        r.checks.clear();
        assert!(!r.passed());
    }
}
