"""Which Jobs of skipped runs the operator removes (pure).

A run whose guard skipped (exit 75: the slot ran elsewhere, or the lease was held) ends
as a Failed Job through its podFailurePolicy. Left there, every skip would page
generic Job-failure alerting (kube-state-metrics' `kube_job_status_failed`, the
`KubeJobFailed` alert) and use up the CronJob's `failedJobsHistoryLimit`, so real
failures scroll away; a two-cluster install skips once per slot by design. Once the
skip is recorded in the GuardedCronJob's status (`recentRuns`, which outlives the Job)
its Job is removed. Manual runs' Jobs stay: the person who started one sees why it did
not run (docs/design.md, "Skipped runs' Jobs").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from guardedcron.objects import get_path, uid_of
from guardedcron.status.runs import Outcome, RunRecord


@dataclass(frozen=True)
class SkippedJob:
    job: str
    uid: str  # the Job instance recorded: never delete a newer Job of that name


def skipped_jobs_to_remove(remembered: Mapping[str, RunRecord],
                           jobs: Sequence[Mapping[str, Any]]) -> tuple[SkippedJob, ...]:
    """Live Jobs whose run the status being written remembers as a final, scheduled skip."""
    removals: list[SkippedJob] = []
    for job in jobs:
        name, uid = get_path(job, "metadata", "name"), uid_of(job)
        run = remembered.get(name) if isinstance(name, str) else None
        if run is None or run.manual or run.outcome is not Outcome.SKIPPED or not run.final:
            continue
        if not uid or get_path(job, "metadata", "deletionTimestamp"):
            continue
        removals.append(SkippedJob(run.job, uid))
    return tuple(sorted(removals, key=lambda removal: removal.job))
