"""One fault at a time, on purpose: what the chaos run does at random, here made certain.

The first test is the checks' own control: a writer that skips the fence check must
be caught as double work and as an overlap, or the chaos run's zero would prove nothing.
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from guardedcron.guard import lease as lease_ops
from guardedcron.guard.fence import check_fence
from guardedcron.guard.lease import AcquireRequest
from tests.chaos.contenders import workload_command, workload_env
from tests.chaos.invariants import (
    Findings,
    check_duplicates,
    check_fence_order,
    check_outstanding,
    check_refusals,
)
from tests.chaos.schema import enqueue
from tests.chaos.work import Holding, Job, Refused
from tests.support import GUARDEDCRON, REPO

pytestmark = pytest.mark.chaos
Connection = psycopg.Connection[tuple[Any, ...]]


def admin(dsn: str) -> Connection:
    return psycopg.connect(dsn, autocommit=True)


def take(dsn: str, lock: str, holder: str, lease: float) -> int:
    with admin(dsn) as conn:
        result = lease_ops.acquire(conn, AcquireRequest(lock, holder, lease))
    assert result.acquired, result
    return result.fence


def findings(dsn: str) -> Findings:
    found = Findings()
    with admin(dsn) as conn:
        check_duplicates(conn, found)
        check_fence_order(conn, found)
        check_refusals(conn, found)
        check_outstanding(conn, found)
    return found


def test_the_checks_catch_a_writer_that_skips_the_fence(chaos_dsn: str) -> None:
    """A reads its batch, stalls past its lease; B takes over and does it all; A writes anyway."""
    with admin(chaos_dsn) as conn:
        enqueue(conn, "job", 4)
    a_fence = take(chaos_dsn, "job", "a", 0.3)

    def b_takes_over(batch: int) -> None:
        if batch == 0:
            time.sleep(0.4)
            b_fence = take(chaos_dsn, "job", "b", 30)
            Job(chaos_dsn, Holding("job", "b", b_fence, 30), rng=random.Random(2)).run()

    unfenced = Job(
        chaos_dsn,
        Holding("job", "a", a_fence, 0.3),
        rng=random.Random(1),
        after_read=b_takes_over,
        fenced=False,
    )
    unfenced.run()
    unfenced.close()
    found = findings(chaos_dsn)
    assert found.figures["duplicates"] == 2  # A's first batch: two items charged twice
    assert any(v.startswith("items with a step committed more than once: 2") for v in found.violations)
    assert any(
        v.startswith("fenced writes committed after a newer fence had written") for v in found.violations
    )


def test_a_stalled_holder_is_refused_and_the_checks_pass(chaos_dsn: str) -> None:
    with admin(chaos_dsn) as conn:
        enqueue(conn, "job", 4)
    a_fence = take(chaos_dsn, "job", "a", 0.3)

    def stall_then_b_takes_over(batch: int) -> None:
        if batch == 1:
            time.sleep(0.4)
            b_fence = take(chaos_dsn, "job", "b", 30)
            Job(chaos_dsn, Holding("job", "b", b_fence, 30), rng=random.Random(2)).run()

    stalled = Job(
        chaos_dsn,
        Holding("job", "a", a_fence, 0.3),
        rng=random.Random(1),
        before_batch=stall_then_b_takes_over,
    )
    with pytest.raises(Refused, match='stale fencing token 1 for lock "job": fence 2 is now held by b'):
        stalled.run()
    stalled.close()
    found = findings(chaos_dsn)
    assert found.violations == []
    assert found.figures["duplicates"] == 0
    assert found.figures["stale_writes_refused"] == 1


def spawn(dsn: str, lock: str, holder: str, lease: float, run_dir: Path) -> subprocess.Popen[bytes]:
    run_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        workload_command(lock, holder, None, lease, run_dir),
        cwd=REPO,
        env=workload_env(dsn),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def wait_for_progress(run_dir: Path, batches: int, proc: subprocess.Popen[bytes], limit: float = 30) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if int((run_dir / "progress").read_text()) >= batches:
                return
        except (OSError, ValueError):
            pass
        assert proc.poll() is None, "the workload ended before it got that far"
        time.sleep(0.005)
    raise AssertionError(f"no progress to batch {batches} within {limit} s")


def run_outcomes(dsn: str) -> list[tuple[str, str]]:
    with admin(dsn) as conn:
        rows = conn.execute("SELECT holder, outcome FROM guardedcron.runs ORDER BY id").fetchall()
    return [(str(h), str(o)) for h, o in rows]


def wait_for_lease_to_run_out(dsn: str, lock: str, limit: float = 30) -> None:
    """Until the database's clock is past the lock's lease (a killed holder releases nothing)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with admin(dsn) as conn:
            row = conn.execute(
                "SELECT locked_until <= clock_timestamp() FROM guardedcron.leases WHERE lock_name = %s",
                (lock,),
            ).fetchone()
        if row is None or row[0]:
            return
        time.sleep(0.1)
    raise AssertionError(f"the lease of {lock!r} still held after {limit} s")


def test_a_killed_holder_is_resumed_from_the_outstanding_work(chaos_dsn: str, tmp_path: Path) -> None:
    with admin(chaos_dsn) as conn:
        enqueue(conn, "job", 12)
    # A 5 s lease: the next contender is a new Python process, which takes up to a few
    # seconds to reach the database on a loaded machine; it must still find the lease held.
    first = spawn(chaos_dsn, "job", "first", 5.0, tmp_path / "first")
    wait_for_progress(tmp_path / "first", 2, first)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert (tmp_path / "first" / "fence").read_text().strip() == "1"
    # While its lease lasts nobody else runs; once it has run out, the next run finishes the work.
    early = spawn(chaos_dsn, "job", "early", 1.0, tmp_path / "early")
    assert early.wait(timeout=30) == 75
    wait_for_lease_to_run_out(chaos_dsn, "job")
    second = spawn(chaos_dsn, "job", "second", 1.0, tmp_path / "second")
    assert second.wait(timeout=60) == 0
    found = findings(chaos_dsn)
    assert found.violations == []
    assert found.figures["items"] == 12
    assert run_outcomes(chaos_dsn) == [("first", "abandoned"), ("early", "skipped"), ("second", "succeeded")]


def test_a_stopped_holder_resumes_into_a_refused_write(chaos_dsn: str, tmp_path: Path) -> None:
    with admin(chaos_dsn) as conn:
        enqueue(conn, "job", 12)
    stopped = spawn(chaos_dsn, "job", "stopped", 1.0, tmp_path / "stopped")
    wait_for_progress(tmp_path / "stopped", 2, stopped)
    stopped.send_signal(signal.SIGSTOP)
    try:
        time.sleep(1.5)  # past its lease (and past the server's idle-in-transaction limit)
        taker = spawn(chaos_dsn, "job", "taker", 30.0, tmp_path / "taker")
        assert taker.wait(timeout=60) == 0
    finally:
        stopped.send_signal(signal.SIGCONT)
    _, stderr = stopped.communicate(timeout=60)
    assert stopped.returncode == 76, stderr.decode()
    assert b"stale fencing token 1" in stderr
    found = findings(chaos_dsn)
    assert found.violations == []
    assert found.figures["stale_writes_refused"] == 1
    assert run_outcomes(chaos_dsn) == [("stopped", "abandoned"), ("taker", "succeeded")]


def hold_the_lease_row(dsn: str, lock: str, fence: int, *, idle_timeout_ms: int | None) -> Connection:
    """A holder frozen in the middle of a fenced transaction: the fence check's lock stays held."""
    options = "" if idle_timeout_ms is None else f"-c idle_in_transaction_session_timeout={idle_timeout_ms}"
    conn = psycopg.connect(dsn, options=options)
    check_fence(conn, lock, fence)
    return conn


def test_a_holder_frozen_inside_a_fenced_transaction_is_ended_by_the_server(chaos_dsn: str) -> None:
    """With idle_in_transaction_session_timeout on the job's connections, a takeover is not blocked."""
    fence = take(chaos_dsn, "job", "frozen", 0.3)
    frozen = hold_the_lease_row(chaos_dsn, "job", fence, idle_timeout_ms=500)
    time.sleep(0.35)
    started = time.monotonic()
    with admin(chaos_dsn) as conn:
        result = lease_ops.acquire(conn, AcquireRequest("job", "next", 30))
    assert result.acquired and result.fence == fence + 1
    assert time.monotonic() - started < 1.5
    with pytest.raises(psycopg.Error, match="idle-in-transaction timeout"):
        frozen.execute(
            "INSERT INTO chaos.refusals (lock_name, fence, holder, kind, message) VALUES ('', 0, '', '', '')"
        )
        frozen.commit()
    frozen.close()


def test_an_attempt_that_found_the_lease_row_locked_has_a_history_row(chaos_dsn: str) -> None:
    """Without that timeout, a frozen fenced transaction makes acquirers give up (row-busy); recorded."""
    fence = take(chaos_dsn, "job", "frozen", 0.3)
    frozen = hold_the_lease_row(chaos_dsn, "job", fence, idle_timeout_ms=None)
    try:
        time.sleep(0.35)
        with admin(chaos_dsn) as conn:
            result = lease_ops.acquire(conn, AcquireRequest("job", "blocked", 30))
    finally:
        frozen.rollback()
        frozen.close()
    assert (result.acquired, result.reason) == (False, "row-busy")
    assert result.run_id is not None
    with admin(chaos_dsn) as conn:
        row = conn.execute(
            "SELECT holder, outcome, reason FROM guardedcron.runs WHERE id = %s", (result.run_id,)
        )
        holder, outcome, reason = row.fetchone() or (None, None, None)
    assert (holder, outcome) == ("blocked", "skipped")
    assert "locked" in reason


def test_acquire_whose_connection_is_cut_mid_call_exits_unavailable(chaos_dsn: str) -> None:
    """A cut during the call is the database going away: exit 69 and one line, not a traceback."""
    fence = take(chaos_dsn, "job", "frozen", 0.3)
    frozen = hold_the_lease_row(chaos_dsn, "job", fence, idle_timeout_ms=None)
    try:
        time.sleep(0.35)
        guard = subprocess.Popen(
            [GUARDEDCRON, "acquire", "--lock", "job", "--holder", "cut", "--lease-seconds", "5"],
            env=workload_env(chaos_dsn),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        cut = threading.Event()
        with admin(chaos_dsn) as conn:
            deadline = time.monotonic() + 10
            while not cut.is_set() and time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE application_name = 'guardedcron' AND wait_event_type = 'Lock'"
                ).fetchone()
                if row and row[0]:
                    cut.set()
                time.sleep(0.02)
        stdout, stderr = guard.communicate(timeout=30)
    finally:
        frozen.rollback()
        frozen.close()
    assert cut.is_set()
    assert guard.returncode == 69, stderr
    assert "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "cannot reach database" in stderr or "lost the connection" in stderr
    dsn_password = psycopg.conninfo.conninfo_to_dict(chaos_dsn)["password"]
    assert str(dsn_password) not in stdout + stderr


def test_a_skewed_client_clock_changes_nothing(chaos_dsn: str, tmp_path: Path) -> None:
    """A workload a year ahead and one a day behind: leases and fences follow the database clock."""
    with admin(chaos_dsn) as conn:
        enqueue(conn, "job", 4)
    env_ahead, env_behind = workload_env(chaos_dsn, "+400d"), workload_env(chaos_dsn, "-1d")
    ahead = subprocess.run(
        workload_command("job", "ahead", None, 1.0, tmp_path / "ahead"), cwd=REPO, env=env_ahead, check=False
    )
    behind = subprocess.run(
        workload_command("job", "behind", None, 1.0, tmp_path / "behind"),
        cwd=REPO,
        env=env_behind,
        check=False,
    )
    assert (ahead.returncode, behind.returncode) == (0, 0)
    assert (tmp_path / "behind" / "fence").read_text().strip() == "2"
    found = findings(chaos_dsn)
    assert found.violations == []
    assert found.figures["items"] == 4
    with admin(chaos_dsn) as conn:
        row = conn.execute(
            "SELECT max(abs(extract(epoch FROM started_at - clock_timestamp()))) FROM guardedcron.runs"
        ).fetchone()
    assert row is not None and float(row[0]) < 60
