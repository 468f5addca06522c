"""Where one past slot stands, from the runs known here (pure): shared by catch-up and
backfill (docs/design.md, "Catch-up and backfill").

The operator starts a Job for a past slot as an *attempt* named
`<cronjob>-<slot>-<c|b><n>` (catch-up or backfill, attempt n), whose guard is given the
slot with `--slot`: never the CronJob controller's name `<cronjob>-<slot>`, so an
attempt never collides with the controller's Job of that slot (which may exist, ended
GuardError), and the attempts of one slot are told apart.

An attempt that found the lease held (by another run, here or in another cluster) or
could not reach the database (GuardError) did not run the slot and did not claim it:
the slot is tried again, RETRY_AFTER_SECONDS after the first attempt ended and twice as
long after each further one (30 s, 1, 2, 4, 8 min: about a quarter of an hour for a
database outage to end), up to MAX_ATTEMPTS attempts, so two clusters making up the
same slots at once cannot both skip one. An attempt skipped because the slot was
already claimed settles it: it ran somewhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final

from guardedcron import contract
from guardedcron.status.runs import HELD_LEASE, SLOT_CLAIMED_WORDS, Outcome, RunRecord

MAX_ATTEMPTS: Final = 6
RETRY_AFTER_SECONDS: Final = 30  # after the first turned-away attempt; doubled after each


class SlotState(StrEnum):
    OPEN = "open"  # no run decided it: start an attempt
    WAITING = "waiting"  # an attempt was turned away a moment ago: try again later
    RUNNING = "running"  # a run of it is going here
    RAN = "ran"  # a run here held the lease for it
    SETTLED = "settled"  # decided without running here: claimed elsewhere, or given up


def _turned_away(run: RunRecord) -> bool:
    """An attempt that neither ran the slot nor found it claimed: it may be tried again."""
    if contract.attempt_of(run.job) is None or not run.final:
        return False
    if run.outcome is Outcome.GUARD_ERROR:
        return True
    return run.outcome is Outcome.SKIPPED and SLOT_CLAIMED_WORDS not in run.reason


def slot_state(runs: Iterable[RunRecord], slot: int, *, now: datetime) -> SlotState:
    """The state of `slot` given every run known here (manual runs have no slot)."""
    mine = [run for run in runs if run.slot == slot and not run.manual]
    if any(not run.final for run in mine):
        return SlotState.RUNNING
    if any(run.outcome in HELD_LEASE for run in mine):
        return SlotState.RAN
    if any(run.settles_slot for run in mine):  # a run found the slot claimed: it ran elsewhere
        return SlotState.SETTLED
    turned_away = [run for run in mine if _turned_away(run)]
    if len(turned_away) >= MAX_ATTEMPTS:
        return SlotState.SETTLED
    latest = max((run.finished_at for run in turned_away if run.finished_at is not None), default=None)
    delay = RETRY_AFTER_SECONDS * 2 ** (len(turned_away) - 1)
    if latest is not None and now < latest + timedelta(seconds=delay):
        return SlotState.WAITING
    return SlotState.OPEN


def next_attempt(runs: Iterable[RunRecord], slot: int) -> int:
    """The number of the next attempt at `slot` (attempts of either kind count)."""
    numbers = [found[2] for run in runs
               if (found := contract.attempt_of(run.job)) is not None and found[0] == slot]
    return max(numbers, default=0) + 1


def is_attempt_of_kind(job: str, kind: str) -> bool:
    found = contract.attempt_of(job)
    return found is not None and found[1] == kind
