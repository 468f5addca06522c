"""Skipped wall times: which schedule minute the clock skipped (spring forward) the
operator runs next, and when (pure; docs/design.md, "Daylight-saving policy").

With spec.dstPolicy `skippedTime: RunAtNextMinute`, each wall time of the schedule that
a jump ahead skipped runs once, at the first minute after the jump (its `due`), as a Job
the operator starts (`<cronjob>-<key>-s<attempt>`) whose guard claims the wall time's key
(schedule.dst.skipped_time_slot). The key is above every real minute, so it never takes a
slot the schedule fires, and it is the same in every cluster: whichever cluster runs the
wall time first wins, every other attempt finds the key claimed. Attempts are retried as
make-up runs are (status/slots.py).

`status.skippedTime.settledThrough` is a watermark: the newest jump whose skipped times
are all decided (ran, settled or given up); it keeps records that `recentRunsLimit`
dropped from looking open again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from guardedcron import contract
from guardedcron.schedule.dst import SkippedTime, skipped_times
from guardedcron.schedule.search import floor_minute
from guardedcron.spec import ParsedSpec
from guardedcron.status.runs import RunRecord
from guardedcron.status.slots import SlotState, next_attempt, slot_state
from guardedcron.status.times import epoch_minute, format_time, parse_time

STATUS_KEY: Final = "skippedTime"
POLICY: Final = "RunAtNextMinute"
# How long after a jump its skipped times may still start (an operator down longer lets
# them go, as a CronJob would): far more than the retries of one key take (~15 min).
WINDOW: Final = timedelta(days=1)


@dataclass(frozen=True)
class SkippedTimePlan:
    start: SkippedTime | None  # the skipped wall time to run now; None: nothing to start
    settled_through: datetime | None  # the new watermark (a jump's instant)
    attempt: int = 1  # the attempt number for `start` (status/slots.py)
    waiting: SkippedTime | None = None  # the next one, when it must wait

    def to_status(self) -> dict[str, Any] | None:
        item: dict[str, Any] = {}
        if self.settled_through is not None:
            item["settledThrough"] = format_time(self.settled_through)
        following = self.start or self.waiting
        if following is not None:
            item["next"] = following.wall.isoformat(timespec="minutes")
            item["due"] = format_time(following.due)
        return item or None


def by_skipped_key(runs: Iterable[RunRecord]) -> list[RunRecord]:
    """The runs with a skipped-time attempt's slot read from its Job name: status reads a
    Job's slot from its scheduled-time annotation (the minute it was due, a real one)
    until its guard reports the key it claimed, and a guard that failed reports none."""
    result = []
    for run in runs:
        found = contract.attempt_of(run.job)
        if found is not None and found[1] == contract.RUN_KIND_SKIPPED_TIME and run.slot != found[0]:
            run = dataclasses.replace(run, slot=found[0])
        result.append(run)
    return result


def plan_skipped_times(parsed: ParsedSpec, *, runs: Iterable[RunRecord], created_at: datetime,
                       previous: Mapping[str, Any] | None, busy: bool, suspended: bool,
                       now: datetime) -> SkippedTimePlan | None:
    """The next skipped wall time to run, if any; None when the policy is off.

    `runs` as by_skipped_key returns them; `busy`: a run of this job is active here (the
    lease allows one at a time); `suspended`: skipped times then settle without running.
    """
    spec = parsed.spec
    if spec.dst_policy.skipped_time != POLICY:
        return None
    watermark = parse_time((previous or {}).get("settledThrough"))
    floor = max(t for t in (created_at, now - WINDOW, watermark) if t is not None)
    candidates = skipped_times(spec.schedule, spec.zone, after=floor, until=now) if floor < now else []
    if not candidates:
        return SkippedTimePlan(start=None, settled_through=watermark)
    if suspended:
        return SkippedTimePlan(start=None, settled_through=candidates[-1].due)
    records = list(runs)
    pending = [(c, state) for c in candidates
               if (state := slot_state(records, c.slot, now=now)) not in (SlotState.RAN, SlotState.SETTLED)]
    if not pending:
        return SkippedTimePlan(start=None, settled_through=candidates[-1].due)
    first, state = pending[0]
    through = max((c.due for c in candidates if c.due < first.due), default=watermark)
    if busy or state is not SlotState.OPEN or _controller_due(parsed, records, now):
        return SkippedTimePlan(start=None, settled_through=through, waiting=first)
    return SkippedTimePlan(start=first, settled_through=through,
                           attempt=next_attempt(records, first.slot))


def _controller_due(parsed: ParsedSpec, records: list[RunRecord], now: datetime) -> bool:
    """The schedule fires this minute and its Job is not here yet: the CronJob controller
    starts it any moment, and a skipped time's run beside it would take its lease."""
    minute = floor_minute(now)
    if not parsed.spec.schedule.fires_at(minute, parsed.spec.zone):
        return False
    return not any(run.slot == epoch_minute(minute) for run in records)
