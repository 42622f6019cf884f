//! The suite as a table: every check the suite knows (its name is written here and
//! nowhere else in the suite), the rows of a run (a check and what it needs first) and
//! the one loop that runs them and records their verdicts.

use std::time::Instant;

use crate::SuiteError;
use crate::report::Status;
use crate::run::{Run, Verdict, skip};

/// Every check of the suite. `docs/vendors.md` explains each one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CheckId {
    Describe,
    Attach,
    Check,
    CheckWarning,
    GetResources,
    Pool,
    PoolFollows,
    InProgress,
    LostReplyRetry,
    ListedAfterAttach,
    RetriedAttach,
    Detach,
    GoneAfterDetach,
    DetachTwice,
    Fault5xxCheck,
    FaultMalformedCheck,
    FaultLostCheck,
    Fault5xxPool,
    Fault5xxAttach,
    FaultMalformedAttach,
    FaultLostAttach,
    FailedJob,
    RolledBackJob,
    Deadline,
    Denied,
    DeclaredCapabilities,
    Resources,
}

impl CheckId {
    /// The name the report, the JUnit XML and the JSON give the check.
    pub(crate) fn name(self) -> &'static str {
        match self {
            CheckId::Describe => "describe",
            CheckId::Attach => "attach",
            CheckId::Check => "check",
            CheckId::CheckWarning => "check-warning",
            CheckId::GetResources => "get-resources",
            CheckId::Pool => "pool",
            CheckId::PoolFollows => "pool-follows-fabric",
            CheckId::InProgress => "in-progress",
            CheckId::LostReplyRetry => "lost-reply-retry",
            CheckId::ListedAfterAttach => "listed-after-attach",
            CheckId::RetriedAttach => "retried-attach",
            CheckId::Detach => "detach",
            CheckId::GoneAfterDetach => "gone-after-detach",
            CheckId::DetachTwice => "detach-twice",
            CheckId::Fault5xxCheck => "fault-5xx-check",
            CheckId::FaultMalformedCheck => "fault-malformed-check",
            CheckId::FaultLostCheck => "fault-lost-check",
            CheckId::Fault5xxPool => "fault-5xx-pool",
            CheckId::Fault5xxAttach => "fault-5xx-attach",
            CheckId::FaultMalformedAttach => "fault-malformed-attach",
            CheckId::FaultLostAttach => "fault-lost-attach",
            CheckId::FailedJob => "failed-job",
            CheckId::RolledBackJob => "rolled-back-job",
            CheckId::Deadline => "deadline",
            CheckId::Denied => "denied",
            CheckId::DeclaredCapabilities => "declared-capabilities",
            CheckId::Resources => "resources",
        }
    }
}

/// What a check needs before it can run; unmet, the check is skipped with [`Need::why`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// An earlier check of the run passed (it left the state this one starts from).
    Passed(CheckId),
    /// The vendor allowed the suite to attach a device on a lab fabric.
    AttachAllowed,
}

impl Need {
    /// Why a check whose need is unmet is skipped.
    pub(crate) fn why(self) -> String {
        match self {
            Need::Passed(check) => format!("needs a passing `{}`", check.name()),
            Need::AttachAllowed => {
                "destructive against a lab fabric: pass --allow-attach and --target-node"
                    .to_string()
            }
        }
    }

    /// The verdict of a check whose need is unmet.
    pub(crate) fn skip(self) -> Verdict {
        skip(self.why())
    }
}

/// One row of a run's table: a check and what it needs, in order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Row {
    pub(crate) check: CheckId,
    pub(crate) needs: &'static [Need],
}

impl Row {
    pub(crate) const fn new(check: CheckId, needs: &'static [Need]) -> Row {
        Row { check, needs }
    }
}

/// A run of the suite against one fabric: the checks' functions and their state.
pub(crate) trait Suite {
    /// The run the verdicts are recorded in.
    fn run(&mut self) -> &mut Run;
    /// Whether the suite may attach devices ([`Need::AttachAllowed`]).
    fn attach_allowed(&self) -> bool;
    /// Runs one check. An error stops the whole suite (the provider could not be
    /// loaded again, say); a check that fails is a verdict.
    async fn verdict(&mut self, check: CheckId) -> Result<Verdict, SuiteError>;
}

/// Runs every row of `table` in order and records each verdict (a skip for a row whose
/// need is unmet), timed from the row's start.
pub(crate) async fn run_table(suite: &mut impl Suite, table: &[Row]) -> Result<(), SuiteError> {
    for row in table {
        let started = Instant::now();
        let verdict = match unmet(suite, row.needs) {
            Some(need) => need.skip(),
            None => suite.verdict(row.check).await?,
        };
        suite.run().record(row.check.name(), started, verdict);
    }
    Ok(())
}

/// The first need of `needs` that is not met.
fn unmet(suite: &mut impl Suite, needs: &[Need]) -> Option<Need> {
    let allowed = suite.attach_allowed();
    let run = suite.run();
    needs.iter().copied().find(|need| match need {
        Need::Passed(check) => !run
            .checks
            .iter()
            .any(|c| c.name == check.name() && c.status == Status::Pass),
        Need::AttachAllowed => !allowed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each check has its own name, and a table only needs checks it ran before.
    fn assert_well_formed(table: &[Row]) {
        for (i, row) in table.iter().enumerate() {
            assert!(
                table[..i]
                    .iter()
                    .all(|r| r.check.name() != row.check.name()),
                "{} twice",
                row.check.name()
            );
            for need in row.needs {
                if let Need::Passed(check) = need {
                    assert!(
                        table[..i].iter().any(|r| r.check == *check),
                        "{} needs {}, which does not run before it",
                        row.check.name(),
                        check.name()
                    );
                }
            }
        }
    }

    #[test]
    fn the_tables_are_well_formed() {
        assert_well_formed(crate::suite::SIMULATED);
        assert_well_formed(&crate::suite::simulated_table(true));
        assert_well_formed(crate::lab::LAB);
    }

    #[test]
    fn unmet_needs_say_what_they_need() {
        assert_eq!(
            Need::Passed(CheckId::LostReplyRetry).why(),
            "needs a passing `lost-reply-retry`"
        );
        assert_eq!(Need::AttachAllowed.skip().0, Status::Skip);
    }
}
