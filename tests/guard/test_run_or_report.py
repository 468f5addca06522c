"""One meaning of "missed": the operator's MissedRun and `runs --gaps` agree on one history.

Two clusters (`west`, `east`) share a real PostgreSQL. Every answer `west`'s guards got
from the store becomes the Job and pod the operator of `west` would see (the guard's
termination message carries the answer), and the operator's status code decides each
slot; `guardedcron runs --gaps` reads the same lock's history. A slot counts as run only
when a run of that slot started in either cluster.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from guardedcron import contract
from guardedcron.guard import lease as lease_ops
from guardedcron.guard.lease import AcquireRequest
from guardedcron.status.conditions import get_condition
from guardedcron.status.times import format_time
from tests.support import run_cli
from tests.support.status_objects import minute_of
from tests.support.status_world import Run, Runs, compute, slot

LOCK = "billing/nightly-invoices"
LEASE_SECONDS = 3600  # longer than the test: a held lease stays held until released
Conn = psycopg.Connection[tuple[Any, ...]]


def ask(conn: Conn, holder: str, day: int | None) -> lease_ops.AcquireResult:
    slot_minute = None if day is None else minute_of(slot(day))
    return lease_ops.acquire(conn, AcquireRequest(LOCK, holder, LEASE_SECONDS, slot=slot_minute))


def release(conn: Conn, holder: str, won: lease_ops.AcquireResult) -> None:
    assert won.acquired and lease_ops.release(conn, LOCK, holder, won.fence, "succeeded").ok


def test_missed_run_and_gaps_agree_slot_by_slot(dsn: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    runs = Runs(tmp_path, monkeypatch)
    west: dict[int, Run] = {}  # day -> the run the operator of `west` sees for that slot

    def west_asks(conn: Conn, day: int) -> None:
        holder = f"west/billing/nightly-invoices-{day}"
        answer = ask(conn, holder, day)
        if answer.acquired:
            west[day] = runs.succeeded(slot(day), answer.fence)
            release(conn, holder, answer)
        else:
            west[day] = runs.skipped(slot(day), answer.fence or 0, answer.reason)

    east = "east/billing/nightly-invoices-"
    with psycopg.connect(dsn, autocommit=True) as conn:
        west_asks(conn, 10)  # ran here
        east_11 = ask(conn, f"{east}11", 11)  # ran in the other cluster, still going
        west_asks(conn, 11)
        west_asks(conn, 12)  # east's run of the 11th still holds the lease: no run of the 12th anywhere
        assert not ask(conn, f"{east}12", 12).acquired
        release(conn, f"{east}11", east_11)
        manual = ask(conn, "west/billing/nightly-invoices-manual-x", None)  # a manual run across the 13th
        west_asks(conn, 13)
        release(conn, "west/billing/nightly-invoices-manual-x", manual)
        # 14th: no Job anywhere (operator and controller down); 15th: west's guard could not decide.
        west[15] = runs.guard_error(slot(15))
        release(conn, f"{east}16", ask(conn, f"{east}16", 16))
        west_asks(conn, 16)

    reported: list[int] = []
    for day in range(10, 17):
        seen = [run for d, run in sorted(west.items()) if d <= day]
        status = compute(seen, None, slot(day) + timedelta(minutes=20))
        missed = get_condition(status["conditions"], "MissedRun")
        assert missed is not None
        if missed["status"] == "True":
            assert format_time(slot(day)) in missed["message"], missed
            reported.append(day)

    window = ["--since", slot(10).isoformat(), "--until", (slot(16) + timedelta(hours=1)).isoformat()]
    gaps = run_cli(["runs", "--lock", LOCK, "--gaps", "--schedule", "30 2 * * *",
                    "--time-zone", "Europe/Stockholm", *window, "--json"], dsn=dsn)
    assert gaps.code == contract.EXIT_FAILURE, gaps  # gaps found
    from_history = sorted(g["slot"] for g in gaps.json["gaps"])  # type: ignore[index]

    assert reported == [12, 13, 14, 15]
    assert from_history == [minute_of(slot(day)) for day in reported]
