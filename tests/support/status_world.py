"""A GuardedCronJob's world for status tests: runs in each outcome, and compute passes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from guardedcron import contract
from guardedcron.builders import build_cronjob
from guardedcron.spec import ParsedSpec, SpecError, parse_guarded_cronjob
from guardedcron.status import StatusChange, compute_status
from tests.support import status_objects as k
from tests.support.gcj import DEFAULT_SETTINGS, put

CREATED = datetime(2025, 5, 1, tzinfo=UTC)
CEST = timedelta(hours=2)
Run = tuple[dict[str, Any], list[dict[str, Any]]]


def slot(day: int, month: int = 5) -> datetime:
    """02:30 in Stockholm (CEST) on that day of 2025."""
    return datetime(2025, month, day, 0, 30, tzinfo=UTC)


class Runs:
    """Jobs with their pods, one per scheduled slot, in each outcome."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self._tmp, self._mp = tmp_path, monkeypatch

    def _message(self, summary: dict[str, Any]) -> str:
        return k.guard_message(summary, self._tmp, self._mp)

    def _guard(self, exit_code: int, at: datetime, summary: dict[str, Any]) -> dict[str, Any]:
        return k.container_status(contract.GUARD_CONTAINER, state={"terminated": k.terminated(
            exit_code, at + timedelta(seconds=2), at + timedelta(seconds=4), self._message(summary))})

    def running(self, at: datetime, fence: int, *, manual: bool = False) -> Run:
        job = k.job(slot_time=None if manual else at, created=at, zone_offset=CEST, started=at, active=1,
                    manual_annotation="trigger" if manual else None,
                    name=f"{k.CRONJOB}-manual-{fence}" if manual else None)
        slot_minute = None if manual else k.minute_of(at)
        guard = self._guard(0, at, k.acquired_summary(k.holder_of(job), fence, slot_minute))
        pod = k.pod(job, created=at, phase="Running", init_statuses=[guard], statuses=[
            k.container_status("task", state={"running": {"startedAt": k.ts(at + timedelta(seconds=5))}})])
        return job, [pod]

    def succeeded(self, at: datetime, fence: int, minutes: int = 10) -> Run:
        end = at + timedelta(minutes=minutes)
        job = k.job(slot_time=at, created=at, zone_offset=CEST, started=at,
                    conditions=k.complete_conditions(end), completion=end, counts={"succeeded": 1})
        guard = self._guard(0, at, k.acquired_summary(k.holder_of(job), fence, k.minute_of(at)))
        pod = k.pod(job, created=at, phase="Succeeded", init_statuses=[guard], statuses=[
            k.container_status("task", state={"terminated": k.terminated(0, at, end)})])
        return job, [pod]

    def guard_error(self, at: datetime) -> Run:
        end = at + timedelta(seconds=9)
        job = k.job(slot_time=at, created=at, zone_offset=CEST, started=at, conditions=k.failed_conditions(
            "PodFailurePolicy", k.rule_message(f"{k.CRONJOB}-{k.minute_of(at)}-q7xkz", 69, 1), end))
        guard = self._guard(69, at, k.error_summary("billing/p", 69, "cannot reach the database"))
        return job, [k.pod(job, created=at, phase="Failed", init_statuses=[guard])]

    def skipped(self, at: datetime, fence: int, reason: str = "slot-claimed") -> Run:
        """The slot's run skipped: by default because the other cluster ran the slot (fence);
        `lease-held` for a lease held by a run of another slot."""
        end = at + timedelta(seconds=9)
        job = k.job(slot_time=at, created=at, zone_offset=CEST, started=at, conditions=k.failed_conditions(
            "PodFailurePolicy", k.rule_message(f"{k.CRONJOB}-{k.minute_of(at)}-q7xkz", 75, 0), end))
        summary = k.skipped_summary(k.holder_of(job), "eu-2/billing/x", fence, k.minute_of(at), reason)
        guard = self._guard(75, at, summary)
        return job, [k.pod(job, created=at, phase="Failed", init_statuses=[guard])]

    def failed(self, at: datetime, fence: int) -> Run:
        end = at + timedelta(minutes=3)
        job = k.job(slot_time=at, created=at, zone_offset=CEST, started=at, conditions=k.failed_conditions(
            "BackoffLimitExceeded", "Job has reached the specified backoff limit", end))
        guard = self._guard(0, at, k.acquired_summary(k.holder_of(job), fence, k.minute_of(at)))
        task = k.container_status("task", state={"terminated": k.terminated(2, at, end)})
        return job, [k.pod(job, created=at, phase="Failed", init_statuses=[guard], statuses=[task])]

    def timed_out(self, at: datetime, fence: int) -> Run:
        end = at + timedelta(hours=1)
        job = k.job(slot_time=at, created=at, zone_offset=CEST, started=at, conditions=k.failed_conditions(
            "DeadlineExceeded", "Job was active longer than specified deadline", end))
        guard = self._guard(0, at, k.acquired_summary(k.holder_of(job), fence, k.minute_of(at)))
        task = k.container_status("task", state={"terminated": k.terminated(137, at, end)})
        return job, [k.pod(job, created=at, phase="Failed", init_statuses=[guard], statuses=[task])]

    def lost(self, at: datetime, fence: int, *, finished: bool) -> Run:
        end = at + timedelta(minutes=20)
        if finished:
            job = k.job(slot_time=at, created=at, zone_offset=CEST, started=at,
                        conditions=k.complete_conditions(end), completion=end)
        else:
            job = k.job(slot_time=at, created=at, zone_offset=CEST, started=at, active=1)
        guard = self._guard(0, at, k.acquired_summary(k.holder_of(job), fence, k.minute_of(at)))
        lost = self._message({"outcome": "lost", "lock": k.LOCK, "holder": k.holder_of(job), "fence": fence,
                              "reason": f"lease taken over by eu-2/billing/y with fence {fence + 1}"})
        keeper = k.container_status(
            contract.KEEPER_CONTAINER, state={"running": {"startedAt": k.ts(at + timedelta(minutes=9))}},
            last_state={"terminated": k.terminated(76, at, at + timedelta(minutes=9), lost)}, restarts=1)
        task = k.container_status("task", state={"terminated": k.terminated(0, at, end)} if finished
                                  else {"running": {"startedAt": k.ts(at)}})
        return job, [k.pod(job, created=at, phase="Running", init_statuses=[guard, keeper], statuses=[task])]


def the_gcj(created: datetime = CREATED, **spec: Any) -> dict[str, Any]:
    body = k.gcj_body(created=created)
    for key, value in spec.items():
        body = put(body, f"spec.{key}", value)
    return body


def live_cronjob(gcj: dict[str, Any], last_schedule: datetime | None = None) -> dict[str, Any]:
    cronjob = build_cronjob(parse_guarded_cronjob(gcj), DEFAULT_SETTINGS)
    cronjob["metadata"] |= {"uid": k.CRONJOB_UID, "creationTimestamp": k.ts(CREATED + timedelta(seconds=1))}
    cronjob["status"] = {"lastScheduleTime": k.ts(last_schedule)} if last_schedule else {}
    return cronjob


def compute(runs_now: list[Run], previous: dict[str, Any] | None, now: datetime, *,
            gcj: dict[str, Any] | None = None, cronjob: dict[str, Any] | str | None = "live",
            apply_error: str | None = None) -> dict[str, Any]:
    """The status a pass computes, as stored and read back."""
    change = compute_change(runs_now, previous, now, gcj=gcj, cronjob=cronjob, apply_error=apply_error)
    return k.json_roundtrip(change.status)


def compute_change(runs_now: list[Run], previous: dict[str, Any] | None, now: datetime, *,
                   gcj: dict[str, Any] | None = None, cronjob: dict[str, Any] | str | None = "live",
                   apply_error: str | None = None) -> StatusChange:
    """The status a pass computes with what follows from it (Events, metrics, ...)."""
    gcj = gcj or the_gcj()
    parsed: ParsedSpec | None
    try:
        parsed, problems = parse_guarded_cronjob(gcj), ()
    except SpecError as exc:
        parsed, problems = None, exc.problems
    live = live_cronjob(gcj) if cronjob == "live" and parsed is not None else None
    return compute_status(
        gcj=gcj, parsed=parsed, spec_problems=problems,
        cronjob=live if cronjob == "live" else cronjob,  # type: ignore[arg-type]
        jobs=[job for job, _ in runs_now],
        pods_by_job={job["metadata"]["name"]: pods for job, pods in runs_now},
        previous_status=previous, now=now, apply_error=apply_error,
    )

