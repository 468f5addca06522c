"""Which finished runs outcome recording writes to the database history (pure).

A run whose own guard won the lease (it has a holder and a fence) and that ended
Succeeded, Failed or TimedOut is recorded as `succeeded` or `failed`, once: when its
record becomes final between two statuses. Skipped and GuardError runs never held the
lease; a Lost run's keeper recorded the loss itself, and the lease is someone else's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from guardedcron.contract import ReleaseOutcome
from guardedcron.status.runs import Outcome, RunRecord, bounded_reason

RECORDED: Final = {
    Outcome.SUCCEEDED: ReleaseOutcome.SUCCEEDED.value,
    Outcome.FAILED: ReleaseOutcome.FAILED.value,
    Outcome.TIMED_OUT: ReleaseOutcome.FAILED.value,
}


@dataclass(frozen=True)
class OutcomeRecord:
    job: str
    holder: str
    fence: int
    outcome: str  # succeeded | failed: what release_v1 accepts
    reason: str


def outcomes_to_record(finished: Sequence[RunRecord]) -> list[OutcomeRecord]:
    """Of the runs that just became final (`finished_runs`, newest first), those that held
    the lease, oldest first."""
    records = []
    for run in reversed(finished):
        outcome = RECORDED.get(run.outcome)
        if outcome is None or run.holder is None or run.fence is None:
            continue
        reason = bounded_reason(f"{run.outcome} (reported by the operator): {run.reason}")
        records.append(OutcomeRecord(run.job, run.holder, run.fence, outcome, reason))
    return records
