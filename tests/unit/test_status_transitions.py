"""Events come from transitions between statuses: each once, none on a resync."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from guardedcron.status import EventReason, StatusChange
from tests.support import status_objects as k
from tests.support.status_world import Run, Runs, compute_change, slot, the_gcj

# Created just before the first slot the tests use, so no earlier slot is missed.
GCJ = the_gcj(created=slot(10) - timedelta(minutes=1))


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Runs:
    return Runs(tmp_path, monkeypatch)


class Passes:
    """Runs compute passes one after another, keeping the events of each."""

    def __init__(self) -> None:
        self.status: dict[str, Any] | None = None
        self.change: StatusChange | None = None
        self.now = slot(10)

    def step(self, world: list[Run], minutes: float = 1) -> list[tuple[EventReason, str]]:
        self.now += timedelta(minutes=minutes)
        self.change = compute_change(world, self.status, self.now, gcj=GCJ)
        self.status = k.json_roundtrip(self.change.status)  # as stored and read back
        return [(e.reason, e.subject) for e in self.change.events]


def job_name(day: int) -> str:
    return f"{k.CRONJOB}-{k.minute_of(slot(day))}"


def test_a_run_from_start_to_end_to_deletion(runs: Runs) -> None:
    passes = Passes()
    assert passes.step([runs.running(slot(10), 3)]) == [(EventReason.RUN_STARTED, job_name(10))]
    assert passes.step([runs.running(slot(10), 3)]) == []
    assert passes.step([runs.succeeded(slot(10), 3)], minutes=12) == [
        (EventReason.RUN_SUCCEEDED, job_name(10))]
    assert passes.step([runs.succeeded(slot(10), 3)]) == []
    assert passes.step([]) == []  # the history limit deleted the Job; nothing happened to the run


def test_a_run_first_seen_finished_gets_only_its_outcome(runs: Runs) -> None:
    passes = Passes()
    events = compute_change([runs.skipped(slot(10), 9, "lease-held")], None, slot(10) + timedelta(minutes=1),
                            gcj=GCJ).events
    assert [(e.reason, e.warning) for e in events] == [(EventReason.RUN_SKIPPED, False)]
    assert events[0].message == (f"run {job_name(10)} for slot {k.minute_of(slot(10))} skipped: "
                                 "lease held by eu-2/billing/x (fence 9)")
    assert passes.step([runs.failed(slot(10), 4)]) == [(EventReason.RUN_FAILED, job_name(10))]


@pytest.mark.parametrize(("make", "reason"), [
    (lambda r: r.failed(slot(10), 4), EventReason.RUN_FAILED),
    (lambda r: r.timed_out(slot(10), 4), EventReason.RUN_TIMED_OUT),
    (lambda r: r.guard_error(slot(10)), EventReason.GUARD_ERROR),
    (lambda r: r.lost(slot(10), 4, finished=True), EventReason.LEASE_LOST),
])
def test_each_outcome_has_its_warning(runs: Runs, make: Any, reason: EventReason) -> None:
    passes = Passes()
    passes.step([runs.running(slot(10), 4)])
    events = passes.step([make(runs)], minutes=70)
    assert events[0] == (reason, job_name(10))
    if reason is EventReason.GUARD_ERROR:
        # Past its deadline, a slot whose only run could not decide is a missed run too.
        [(missed, message)] = events[1:]
        assert missed is EventReason.MISSED_RUN and "never started its work" in message
    else:
        assert events[1:] == []
    assert passes.step([make(runs)]) == []
    assert compute_change([make(runs)], None, passes.now, gcj=GCJ).events[0].warning


def test_lease_lost_is_reported_when_seen_not_again_when_the_job_ends(runs: Runs) -> None:
    passes = Passes()
    assert passes.step([runs.running(slot(10), 4)]) == [(EventReason.RUN_STARTED, job_name(10))]
    assert passes.step([runs.lost(slot(10), 4, finished=False)]) == [(EventReason.LEASE_LOST, job_name(10))]
    assert passes.step([runs.lost(slot(10), 4, finished=True)], minutes=20) == []
    # ...but it is counted once, when it ends.
    assert passes.change is not None and [r.outcome for r in passes.change.finished] == ["Lost"]
    assert passes.status is not None and passes.status["runCounts"]["lost"] == 1


def test_missed_run_events_once_per_missed_slot(runs: Runs) -> None:
    passes = Passes()
    passes.now = slot(10) + timedelta(minutes=15)
    assert passes.step([runs.succeeded(slot(10), 1)]) == [(EventReason.RUN_SUCCEEDED, job_name(10))]
    missed_11 = passes.step([runs.succeeded(slot(10), 1)], minutes=24 * 60 - 5)  # 11 May 00:41
    assert [reason for reason, _ in missed_11] == [EventReason.MISSED_RUN]
    assert "2025-05-11T00:30:00Z" in missed_11[0][1]
    assert passes.step([runs.succeeded(slot(10), 1)], minutes=60) == []
    missed_12 = passes.step([runs.succeeded(slot(10), 1)], minutes=24 * 60)  # 12 May 01:41
    assert [reason for reason, _ in missed_12] == [EventReason.MISSED_RUN]
    assert "2025-05-12T00:30:00Z" in missed_12[0][1]
    assert passes.step([runs.succeeded(slot(10), 1), runs.running(slot(13), 2)], minutes=23 * 60) == [
        (EventReason.RUN_STARTED, job_name(13))]


def test_overlap_event_once(runs: Runs) -> None:
    passes = Passes()
    passes.step([runs.running(slot(10), 4)])
    both = [runs.running(slot(10), 4), runs.running(slot(10) + timedelta(minutes=1), 5, manual=True)]
    events = passes.step(both)
    assert [reason for reason, _ in events] == [EventReason.RUN_STARTED, EventReason.OVERLAP]
    assert passes.step(both) == []


def test_event_keys_are_stable_and_distinct(runs: Runs) -> None:
    world = [runs.succeeded(slot(10), 3), runs.succeeded(slot(11), 4)]
    now = slot(11) + timedelta(hours=1)
    first, second = (compute_change(world, None, now, gcj=GCJ).events for _ in range(2))
    assert [e.key() for e in first] == [e.key() for e in second]
    assert len({e.key() for e in first}) == 2
