"""Catch-up: which missed slot the operator makes up next (pure; docs/design.md, "Catch-up
and backfill").

A slot is missed as `MissedRun` counts it (status/missed.py): past its start deadline
plus missedRunToleranceSeconds, with no run here that got to a decision (a run that
ended GuardError never started its work). The operator sees only this cluster's runs;
it does not need the others': the make-up Job is named `<cronjob>-<slot>`, so its guard
claims that slot in the database, and a slot that ran in any cluster is skipped there.

`status.catchUp.settledThrough` is a watermark: slots at or before it are decided
(run, made up, or given up) and never looked at again. It keeps the choice stable
while make-up runs go one by one, and keeps each pass's walk over the schedule short.
Without it, records that `recentRunsLimit` dropped would look missed again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from guardedcron.spec import ParsedSpec
from guardedcron.status.runs import RunRecord
from guardedcron.status.slots import SlotState, next_attempt, slot_state
from guardedcron.status.times import epoch_minute, format_time, parse_time

STATUS_KEY: Final = "catchUp"
# The longest walk over the schedule in one pass: a week of a minute schedule.
MAX_SLOTS_EXAMINED: Final = 7 * 24 * 60


@dataclass(frozen=True)
class CatchUpPlan:
    start: datetime | None  # the slot to make up now, UTC; None: nothing to start
    settled_through: datetime | None  # the new watermark
    given_up: tuple[datetime, ...] = ()  # missed slots this plan will not make up (too many)
    attempt: int = 1  # the attempt number for `start` (status/slots.py)

    def to_status(self, previous: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """status.catchUp: the watermark and the slots given up last (kept until a new
        gap gives up others), or None when there is nothing to say."""
        item: dict[str, Any] = {}
        if self.settled_through is not None:
            item["settledThrough"] = format_time(self.settled_through)
        if self.given_up:
            item["givenUp"] = [format_time(t) for t in self.given_up]
        elif previous and isinstance(previous.get("givenUp"), list):
            item["givenUp"] = list(previous["givenUp"])
        return item or None


def heartbeat_warning(parsed: ParsedSpec) -> str | None:
    """Why catch-up of several slots will likely give most of them up, or None. Without
    lease.heartbeat a run's lease lasts durationSeconds after it ends, so the attempt at
    the next slot finds it held until its retries run out (docs/design.md, "One slot per
    lease"). A warning, never a refusal: such objects were accepted before."""
    spec = parsed.spec
    if spec.catch_up.policy != "All" or spec.catch_up.max_runs <= 1 or spec.lease.heartbeat:
        return None
    return (f"catchUp.policy All with maxRuns {spec.catch_up.max_runs} needs lease.heartbeat: "
            f"without it each make-up run holds the lease for durationSeconds "
            f"({spec.lease.duration_seconds} s) after it ends, and the next missed slot's "
            "attempts are turned away until they are given up")


def plan_catch_up(parsed: ParsedSpec, *, runs: Iterable[RunRecord], created_at: datetime,
                  last_schedule_time: datetime | None, previous: Mapping[str, Any] | None,
                  busy: bool, suspended: bool, now: datetime) -> CatchUpPlan | None:
    """The next make-up run, if any; None when catch-up is off.

    - `runs`: every run known here (status records and live Jobs), settled or running;
    - `busy`: a run of this job is active here (make-up runs wait for it: the lease
      allows one run at a time, and a make-up that found it held would be skipped);
    - `suspended`: by spec.suspend or after failures: slots while suspended are not
      missed, so they settle (a resumed job does not make up its suspension);
    - `previous`: the status.catchUp written last.
    """
    spec = parsed.spec
    if spec.catch_up.policy == "None":
        return None
    watermark = parse_time((previous or {}).get("settledThrough"))
    grace = timedelta(seconds=spec.starting_deadline_seconds + spec.missed_run_tolerance_seconds)
    latest_due = spec.schedule.previous_at_or_before(now - grace, spec.zone)
    if suspended:
        newest = max((t for t in (latest_due, watermark) if t is not None), default=None)
        return CatchUpPlan(start=None, settled_through=newest)
    floor = max(t for t in (created_at, now - timedelta(seconds=spec.catch_up.window_seconds),
                            watermark) if t is not None)
    if latest_due is None or latest_due <= floor:
        return CatchUpPlan(start=None, settled_through=watermark)
    records = list(runs)
    with_runs = {run.slot for run in records if run.slot is not None and not run.manual}
    last_scheduled = epoch_minute(last_schedule_time) if last_schedule_time is not None else None
    wanted = 1 if spec.catch_up.policy == "Latest" else spec.catch_up.max_runs
    missed: list[tuple[datetime, SlotState]] = []  # newest first
    given_up: list[datetime] = []
    slot_time: datetime | None = latest_due
    for _ in range(MAX_SLOTS_EXAMINED):
        if slot_time is None or slot_time <= floor:
            break
        slot = epoch_minute(slot_time)
        # The controller's lastScheduleTime stands for a run whose Job is gone already.
        state = SlotState.SETTLED if slot == last_scheduled and slot not in with_runs \
            else slot_state(records, slot, now=now)
        if state in (SlotState.OPEN, SlotState.WAITING):
            if len(missed) < wanted:
                missed.append((slot_time, state))
            else:
                given_up.append(slot_time)
        slot_time = spec.schedule.previous_at_or_before(slot_time - timedelta(minutes=1), spec.zone)
    if not missed:
        return CatchUpPlan(start=None, settled_through=latest_due)
    # Slots older than the ones chosen are given up now, so the choice cannot move on
    # the next pass (when the newest chosen one has run, an older one would fit).
    through = given_up[0] if given_up else watermark  # given_up[0] is above the floor
    oldest, state = missed[-1]
    ready = not busy and state is SlotState.OPEN
    return CatchUpPlan(start=oldest if ready else None, settled_through=through,
                       given_up=tuple(reversed(given_up)),
                       attempt=next_attempt(records, epoch_minute(oldest)))
