"""Fencing a stalled holder's late writes, and the keeper's renew / loss / release cycle."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from guardedcron.contract import KEEPER_STOP_SECONDS
from guardedcron.guard import lease as lease_ops
from guardedcron.guard.errors import StaleFenceError
from guardedcron.guard.fence import check_fence, read_fence, read_lease
from guardedcron.guard.lease import AcquireRequest
from tests.support import GUARDEDCRON, run_cli


def make_ledger(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (item text PRIMARY KEY, fence bigint NOT NULL)")


def fenced_write(dsn: str, lock: str, fence: int, item: str) -> None:
    with psycopg.connect(dsn) as conn, conn.transaction():
        check_fence(conn, lock, fence)
        conn.execute("INSERT INTO ledger VALUES (%s, %s)", (item, fence))


def test_stalled_holder_is_fenced_out_and_the_new_holder_writes(dsn: str) -> None:
    make_ledger(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        a = lease_ops.acquire(conn, AcquireRequest("job", "a", 0.3))
        time.sleep(0.4)  # A stalls past its lease
        b = lease_ops.acquire(conn, AcquireRequest("job", "b", 60))
    assert a.acquired and b.acquired and b.fence == a.fence + 1
    with pytest.raises(StaleFenceError, match=r"stale fencing token 1 .* fence 2 is now held by b"):
        fenced_write(dsn, "job", a.fence, "invoice-1")
    fenced_write(dsn, "job", b.fence, "invoice-1")
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT item, fence FROM ledger").fetchall() == [("invoice-1", 2)]


def test_fence_check_for_an_unknown_lock_is_refused(dsn: str) -> None:
    make_ledger(dsn)
    with pytest.raises(StaleFenceError, match="no lease named"):
        fenced_write(dsn, "never-taken", 1, "x")


def test_a_takeover_waits_for_an_open_fenced_transaction(dsn: str) -> None:
    """Between the check and the commit, nobody can take over: the write is never stale."""
    make_ledger(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        a = lease_ops.acquire(conn, AcquireRequest("job", "a", 0.5))
    writer = psycopg.connect(dsn)
    with writer.transaction():
        check_fence(writer, "job", a.fence)
        time.sleep(0.7)  # the lease runs out while the fenced transaction is open
        taken: list[lease_ops.AcquireResult] = []
        thief = threading.Thread(
            target=lambda: taken.append(
                lease_ops.acquire(psycopg.connect(dsn, autocommit=True), AcquireRequest("job", "b", 60))
            )
        )
        thief.start()
        thief.join(0.5)
        assert thief.is_alive(), "the takeover must wait for the fenced transaction"
        # Renewal by the holder is not blocked by its own fence check.
        with psycopg.connect(dsn, autocommit=True) as other:
            assert lease_ops.renew(other, "job", "a", a.fence, 0.2).ok
        writer.execute("INSERT INTO ledger VALUES ('late', %s)", (a.fence,))
    thief.join(5)
    writer.close()
    assert taken and not taken[0].acquired  # A renewed first, so B is refused


def test_workload_helpers_read_what_acquire_wrote(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_cli(
        [
            "acquire",
            "--lock",
            "job",
            "--holder",
            "a",
            "--lease-seconds",
            "60",
            "--slot",
            "42",
            "--out",
            str(out),
        ],
        dsn=dsn,
    )
    assert result.code == 0
    lease = read_lease(out)
    assert (lease.lock, lease.holder, lease.fence, lease.slot) == ("job", "a", 1, 42)
    assert read_fence(out) == 1


def lease_until(dsn: str, lock: str) -> tuple[Any, ...]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT holder, fence, locked_until, locked_until > clock_timestamp()"
            " FROM guardedcron.leases WHERE lock_name = %s",
            (lock,),
        ).fetchone()
    assert row is not None
    return row


def start_keeper(dsn: str, out: Path, lease_seconds: str = "1.5") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            GUARDEDCRON,
            "keep",
            "--lock",
            "job",
            "--holder",
            "a",
            "--fence-file",
            str(out / "fence"),
            "--lease-seconds",
            lease_seconds,
            "--out",
            str(out),
            "--dsn",
            dsn,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def acquire_as_a(dsn: str, tmp_path: Path, lease_seconds: str = "1.5") -> Path:
    """Holder `a` takes the lock `job` (1.5 s lease by default); returns the folder of its fence file."""
    out = tmp_path / "run"
    acquired = run_cli(
        ["acquire", "--lock", "job", "--holder", "a", "--lease-seconds", lease_seconds, "--out", str(out)],
        dsn=dsn,
    )
    assert acquired.code == 0, acquired.stderr
    return out


def test_keeper_renews_while_alive_and_releases_on_sigterm(dsn: str, tmp_path: Path) -> None:
    # The keeper's first deadline counts from the acquire (lease.json): 4 s leaves a loaded
    # machine 3 s to start it.
    out = acquire_as_a(dsn, tmp_path, "4")
    first_until = lease_until(dsn, "job")[2]
    keeper = start_keeper(dsn, out, "4")
    try:
        time.sleep(6.0)  # past the first lease: only renewals keep it alive
        holder, fence, until, live = lease_until(dsn, "job")
        assert (holder, fence, live) == ("a", 1, True)
        assert until > first_until  # type: ignore[operator]
        assert (
            run_cli(["acquire", "--lock", "job", "--holder", "b", "--lease-seconds", "5"], dsn=dsn).code == 75
        )
    finally:
        keeper.send_signal(signal.SIGTERM)
        _, stderr = keeper.communicate(timeout=10)
    assert keeper.returncode == 0, stderr
    assert "released lock job" in stderr
    assert lease_until(dsn, "job")[3] is False
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT outcome FROM guardedcron.runs WHERE holder = 'a'").fetchall() == [
            ("finished",)
        ]
    assert run_cli(["acquire", "--lock", "job", "--holder", "b", "--lease-seconds", "5"], dsn=dsn).code == 0


def test_a_keeper_stopped_as_soon_as_it_says_ready_releases_the_lease(dsn: str, tmp_path: Path) -> None:
    # keeper-ready is what the keeper's startupProbe waits for before the workload starts;
    # a workload that ends at once has the keeper stopped right after it: the lease must
    # still be released (before, a keeper stopped while starting died and left it held).
    out = acquire_as_a(dsn, tmp_path, "30")
    ready = out / "keeper-ready"
    assert not ready.exists()
    keeper = start_keeper(dsn, out, "30")
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert keeper.poll() is None and time.monotonic() < deadline, keeper.communicate()
            time.sleep(0.005)
        keeper.send_signal(signal.SIGTERM)
        _, stderr = keeper.communicate(timeout=10)
    finally:
        if keeper.poll() is None:
            keeper.kill()
    assert keeper.returncode == 0, stderr
    assert "released lock job" in stderr
    assert ready.read_text().strip() == str(keeper.pid)
    assert lease_until(dsn, "job")[3] is False
    assert run_cli(["acquire", "--lock", "job", "--holder", "b", "--lease-seconds", "5"], dsn=dsn).code == 0


def test_a_keeper_whose_connection_was_cut_releases_over_a_new_one(dsn: str, tmp_path: Path) -> None:
    # The release first tries the last renewal's connection; when that one is dead (the
    # server ended it, a proxy dropped it) a new connection must carry the release, or the
    # next run would find the lease held for up to a whole lease.
    out = acquire_as_a(dsn, tmp_path, "30")
    keeper = start_keeper(dsn, out, "30")
    try:
        with psycopg.connect(dsn, autocommit=True) as admin:
            deadline = time.monotonic() + 30
            while not admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                    " WHERE application_name = 'guardedcron' AND state = 'idle'"
                                    " AND query LIKE '%renew%'").fetchall():
                assert keeper.poll() is None and time.monotonic() < deadline, keeper.communicate()
                time.sleep(0.05)
        keeper.send_signal(signal.SIGTERM)
        _, stderr = keeper.communicate(timeout=KEEPER_STOP_SECONDS + 10)
    finally:
        if keeper.poll() is None:
            keeper.kill()
    assert keeper.returncode == 0, stderr
    assert "release failed" in stderr and "released lock job" in stderr, stderr
    assert lease_until(dsn, "job")[3] is False


def test_a_keeper_paused_past_its_lease_calls_it_lost_on_waking(dsn: str, tmp_path: Path) -> None:
    out = acquire_as_a(dsn, tmp_path)
    keeper = start_keeper(dsn, out)
    try:
        time.sleep(0.8)
        keeper.send_signal(signal.SIGSTOP)  # the holder stalls past its lease
        time.sleep(1.8)
        taken = run_cli(["acquire", "--lock", "job", "--holder", "b", "--lease-seconds", "60"], dsn=dsn)
        assert taken.code == 0 and taken.json["fence"] == 2
        resumed = time.monotonic()
        keeper.send_signal(signal.SIGCONT)
        _, stderr = keeper.communicate(timeout=10)
        noticed = time.monotonic() - resumed
    finally:
        if keeper.poll() is None:
            keeper.kill()
    assert keeper.returncode == 76, stderr
    # Past its deadline it cannot prove the lease is still its own: lost at once, no call first.
    assert noticed < 1.5 / 3 + 1.0, noticed
    assert "could not renew before the lease could run out: " in stderr
    lost = json.loads((out / "lost").read_text())
    assert lost["fence"] == 1 and "paused or starved" in lost["reason"]
    with psycopg.connect(dsn) as conn:
        outcomes = conn.execute("SELECT holder, outcome FROM guardedcron.runs ORDER BY id").fetchall()
    assert outcomes == [("a", "lost"), ("b", "running")]


def test_keeper_notices_a_takeover_at_its_first_renewal(dsn: str, tmp_path: Path) -> None:
    acquire_as_a(dsn, tmp_path)
    time.sleep(1.6)  # the lease runs out before the keeper starts
    taken = run_cli(["acquire", "--lock", "job", "--holder", "b", "--lease-seconds", "60"], dsn=dsn)
    assert taken.code == 0 and taken.json["fence"] == 2
    # Given the fence alone (no lease.json of the acquire), the keeper counts the lease from
    # its own start, so it asks the database, which refuses.
    out = tmp_path / "keeper"
    out.mkdir()
    (out / "fence").write_text("1\n")
    keeper = start_keeper(dsn, out)
    _, stderr = keeper.communicate(timeout=10)
    assert keeper.returncode == 76, stderr
    assert "lease taken over by b with fence 2" in stderr
    lost = json.loads((out / "lost").read_text())
    assert lost["fence"] == 1 and "taken over" in lost["reason"]


def test_a_restarted_keeper_after_a_loss_waits_instead_of_fighting(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "fence").write_text("1\n")
    (out / "lost").write_text("{}\n")
    keeper = start_keeper(dsn, out)
    assert keeper.stderr is not None
    said = keeper.stderr.readline()  # once it says so, its SIGTERM handler is in place
    assert "lost earlier" in said
    time.sleep(0.5)
    assert keeper.poll() is None
    keeper.send_signal(signal.SIGTERM)
    keeper.communicate(timeout=10)
    assert keeper.returncode == 0


def test_keeper_gives_up_when_the_database_is_gone_past_the_lease(tmp_path: Path) -> None:
    from guardedcron.guard.migrations import migrate
    from guardedcron_devenv.postgres import ThrowawayPostgres

    with ThrowawayPostgres() as server:
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
        out = tmp_path / "run"
        assert (
            run_cli(
                ["acquire", "--lock", "job", "--holder", "a", "--lease-seconds", "3", "--out", str(out)],
                dsn=dsn,
            ).code
            == 0
        )
        keeper = subprocess.Popen(
            [
                GUARDEDCRON,
                "keep",
                "--lock",
                "job",
                "--holder",
                "a",
                "--fence",
                "1",
                "--lease-seconds",
                "3",
                "--out",
                str(out),
                "--dsn",
                dsn,
                "--connect-timeout",
                "1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={k: v for k, v in os.environ.items() if k != "GUARDEDCRON_DSN"},
        )
        time.sleep(1.2)
        server.stop("immediate")
        stopped = time.monotonic()
        _, stderr = keeper.communicate(timeout=20)
        elapsed = time.monotonic() - stopped
    assert keeper.returncode == 76, stderr
    assert "could not renew before the lease could run out" in stderr
    assert elapsed < 3 + 2
    assert (out / "lost").exists()
