"""Stop after repeated failures: whether the operator keeps the CronJob suspended (pure;
docs/design.md, "Stop after repeated failures").

With `spec.suspendAfterFailures: N`, N runs in a row that ended Failed, TimedOut or Lost
suspend the CronJob. Skipped and GuardError runs neither count nor break the streak:
in neither did this job's workload run (a skip means another run held the lease or had
the slot, a guard error means the guard could not reach the database), so they say
nothing about whether the workload is broken, and a database outage must not stop a
job whose code is fine. A Succeeded run ends the streak.

The operator never writes the GuardedCronJob's spec (GitOps): it suspends the CronJob
it owns and keeps the decision in status.failures. It resumes when the annotation
`guardedcron.io/resume` gets a value it has not seen (once per value; a value seen while
not suspended is only recorded, so an annotation left in place does not lift a later
suspension), or when the spec's generation changes (someone changed the job). After a
resume only runs that finish from then on count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from guardedcron.status.runs import Outcome, RunRecord
from guardedcron.status.times import format_time, parse_time

STATUS_KEY: Final = "failures"
# Outcomes in which the workload ran and did not succeed.
FAILED_OUTCOMES: Final = frozenset({Outcome.FAILED, Outcome.TIMED_OUT, Outcome.LOST})
# Outcomes in which the workload did not run: neither counted nor breaking the streak.
NEUTRAL_OUTCOMES: Final = frozenset({Outcome.SKIPPED, Outcome.GUARD_ERROR})
SUSPENDED_NOTE: Final = "SuspendedAfterFailures"
RESUMED_NOTE: Final = "ResumedAfterFailures"


@dataclass(frozen=True)
class SuspensionDecision:
    suspended: bool  # the CronJob is to be suspended for failures
    status: dict[str, Any] | None  # status.failures
    failed_runs: tuple[str, ...] = ()  # the Jobs whose failures suspended it
    note: tuple[str, str] | None = None  # (Event reason, message) when this pass changed it


def failure_streak(runs_newest_first: Iterable[RunRecord], *, count_from: datetime | None) -> list[RunRecord]:
    """The finished runs that failed in a row, newest first, back to the last success (or
    to `count_from`, the last resume)."""
    streak: list[RunRecord] = []
    for run in runs_newest_first:
        if not run.final:
            continue
        if count_from is not None and run.finished_at is not None and run.finished_at < count_from:
            break
        if run.outcome in FAILED_OUTCOMES:
            streak.append(run)
        elif run.outcome not in NEUTRAL_OUTCOMES:
            break
    return streak


def decide_suspension(threshold: int | None, *, runs_newest_first: Iterable[RunRecord],
                      previous: Mapping[str, Any] | None, generation: int,
                      resume_token: str | None, now: datetime) -> SuspensionDecision:
    """The suspension after this pass. `previous` is the status.failures written last;
    `resume_token` the guardedcron.io/resume annotation's value (None when unset)."""
    if threshold is None:
        return SuspensionDecision(suspended=False, status=None)
    prev = previous if isinstance(previous, Mapping) else {}
    token = resume_token.strip() if isinstance(resume_token, str) and resume_token.strip() else None
    fresh_token = token is not None and token != prev.get("lastResumeToken")
    status: dict[str, Any] = {}
    if token is not None:
        status["lastResumeToken"] = token
    count_from = parse_time(prev.get("countFrom"))
    if prev.get("suspended") is True:
        why = None
        if fresh_token:
            why = f"the annotation guardedcron.io/resume was set to {token!r}"
        elif prev.get("generation") != generation:
            why = f"the spec changed (generation {generation})"
        if why is None:
            kept = {k: prev[k] for k in ("suspended", "since", "generation", "failedRuns") if k in prev}
            failed = tuple(str(j) for j in prev.get("failedRuns") or () if isinstance(j, str))
            return SuspensionDecision(suspended=True, status={**kept, **status}, failed_runs=failed)
        status["countFrom"] = format_time(now)
        return SuspensionDecision(suspended=False, status=status, note=(
            RESUMED_NOTE, f"CronJob resumed: {why}; failures count again from {format_time(now)}"))
    if count_from is not None:
        status["countFrom"] = format_time(count_from)
    streak = failure_streak(runs_newest_first, count_from=count_from)
    if len(streak) < threshold:
        return SuspensionDecision(suspended=False, status=status or None)
    failed = tuple(run.job for run in streak[:threshold])
    status |= {"suspended": True, "since": format_time(now), "generation": generation,
               "failedRuns": list(failed)}
    return SuspensionDecision(suspended=True, status=status, failed_runs=failed, note=(
        SUSPENDED_NOTE, describe(threshold, streak[:threshold])))


def describe(threshold: int, streak: list[RunRecord]) -> str:
    runs = ", ".join(f"{run.job} ({run.outcome})" for run in streak)
    return (f"CronJob suspended after {threshold} failed runs in a row: {runs}; resume with a new "
            "value of the annotation guardedcron.io/resume, or change the spec")
