"""Which finished runs outcome recording writes to the database history (pure).

A run whose own guard won the lease (it has a holder and a fence) and that ended
Succeeded, Failed or TimedOut is recorded as `succeeded` or `failed`, once: when its
record becomes final between two statuses. Skipped and GuardError runs never held the
lease; a Lost run's keeper recorded the loss itself, and the lease is someone else's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from guardedcron.status.history import finished_runs
from guardedcron.status.runs import Outcome, bounded_reason

RECORDED: Final = {Outcome.SUCCEEDED: "succeeded", Outcome.FAILED: "failed", Outcome.TIMED_OUT: "failed"}


@dataclass(frozen=True)
class OutcomeRecord:
    job: str
    holder: str
    fence: int
    outcome: str  # succeeded | failed: what release_v1 accepts
    reason: str


def outcomes_to_record(old_status: Mapping[str, Any] | None,
                       new_status: Mapping[str, Any]) -> list[OutcomeRecord]:
    """Runs that became final from `old_status` to `new_status` and held the lease, oldest first."""
    records = []
    for run in reversed(finished_runs(old_status, new_status)):
        outcome = RECORDED.get(run.outcome)
        if outcome is None or run.holder is None or run.fence is None:
            continue
        reason = bounded_reason(f"{run.outcome} (reported by the operator): {run.reason}")
        records.append(OutcomeRecord(run.job, run.holder, run.fence, outcome, reason))
    return records
