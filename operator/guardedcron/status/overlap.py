"""Overlaps: two runs of one lock active at the same time (pure). This must never happen.

A run holds the lock from the moment its guard won the lease (`started_at`, with its
own fence) until its Job ended (`finished_at`; open while it runs). Two such runs with
different fences whose intervals [started_at, finished_at) intersect overlapped: the
later fence was handed out while the earlier run's workload was still going (a lease
shorter than the run, a lost lease, a clock or database fault). Timestamps from the
API have whole-second resolution, so runs that meet within the same second are not
reported. Runs that never won the lease (Skipped, GuardError, guard still deciding)
take no part.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from guardedcron.status.runs import RunRecord

_STILL_RUNNING = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Overlap:
    earlier: RunRecord  # the lower fence
    later: RunRecord

    def describe(self) -> str:
        return (f"run {self.later.job} (fence {self.later.fence}) started while run "
                f"{self.earlier.job} (fence {self.earlier.fence}) was still active")


def find_overlaps(records: Iterable[RunRecord]) -> list[Overlap]:
    """Every overlapping pair, in fence order; a run counts once per job name."""
    by_job: dict[str, RunRecord] = {}
    for record in records:
        if record.held_lease:
            by_job.setdefault(record.job, record)
    holders = sorted(by_job.values(), key=lambda r: (r.fence or 0, r.job))
    overlaps: list[Overlap] = []
    for i, earlier in enumerate(holders):
        for later in holders[i + 1:]:
            if earlier.fence != later.fence and _intersect(earlier, later):
                overlaps.append(Overlap(earlier, later))
    return overlaps


def _intersect(a: RunRecord, b: RunRecord) -> bool:
    assert a.started_at is not None and b.started_at is not None  # held_lease guarantees it
    return a.started_at < _end(b) and b.started_at < _end(a)


def _end(record: RunRecord) -> datetime:
    return record.finished_at or _STILL_RUNNING
