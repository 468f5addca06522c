"""Run history across passes: merging records, counting finished runs once (pure).

Jobs disappear (the CronJob's history limits delete them), so the status itself is
the memory: `recentRuns` plus `lastRun` of the previous pass. A record with
`finishedAt` is final and is never rewritten, so its fields, its event and its count
happen once. compute_status reads the runs of each status once, with `known_records`,
and compares the two readings with `finished_runs`; everything that follows from a
pass (counts, Events, metrics, outcome recording) uses that one comparison.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from guardedcron.status.runs import Outcome, RunRecord

# status.runCounts keys, in the order the CRD lists them.
COUNT_KEYS: dict[Outcome, str] = {
    Outcome.SUCCEEDED: "succeeded",
    Outcome.FAILED: "failed",
    Outcome.SKIPPED: "skipped",
    Outcome.TIMED_OUT: "timedOut",
    Outcome.LOST: "lost",
    Outcome.GUARD_ERROR: "guardError",
}


def known_records(status: Mapping[str, Any] | None) -> dict[str, RunRecord]:
    """The runs a status remembers, by Job name: recentRuns, then lastRun."""
    records: dict[str, RunRecord] = {}
    if not status:
        return records
    items = status.get("recentRuns")
    for item in [*(items if isinstance(items, list) else []), status.get("lastRun")]:
        record = RunRecord.from_status(item)
        if record is not None:
            records.setdefault(record.job, record)
    return records


def newest_first(records: Iterable[RunRecord]) -> list[RunRecord]:
    return sorted(records, key=RunRecord.sort_key, reverse=True)


def finished_runs(before: Mapping[str, RunRecord], after: Mapping[str, RunRecord]) -> list[RunRecord]:
    """Runs final in `after` that were unknown or still open in `before` (each the
    `known_records` of a status), newest first."""
    finished = []
    for record in newest_first(after.values()):
        previous = before.get(record.job)
        if record.final and (previous is None or not previous.final):
            finished.append(record)
    return finished


def add_counts(counts: Mapping[str, Any] | None, runs: Iterable[RunRecord]) -> dict[str, int]:
    """`status.runCounts` after adding `runs`; unreadable old values restart at 0."""
    result = {key: _count(counts, key) for key in COUNT_KEYS.values()}
    for run in runs:
        key = COUNT_KEYS.get(run.outcome)
        if key is not None:
            result[key] += 1
    return result


def _count(counts: Mapping[str, Any] | None, key: str) -> int:
    value = counts.get(key) if isinstance(counts, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
