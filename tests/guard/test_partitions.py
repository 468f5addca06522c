"""Silent network partitions between the guard and PostgreSQL (issue 10, hole 1).

A real Toxiproxy sits between the command and the database; its `timeout` toxic with
timeout 0 swallows every byte and never closes the connection: no RST, no FIN, so
neither the kernel nor libpq notices anything. Every command must still end within its
stated bound (docs/design.md, "Bounded waits"), and the keeper must report the lease
lost before the database can hand it to anyone else.

Bounds are asserted with slack for a loaded machine (other suites run beside this one on
two cores), never as a speed claim: SLACK_SECONDS is added to each stated bound.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from guardedcron.contract import ACQUIRE_CALL_SECONDS, HOLDER_CALL_SECONDS, KEEPER_STOP_SECONDS
from guardedcron.guard import lease as lease_ops
from guardedcron.guard.lease import AcquireRequest, AcquireResult
from tests.support import GUARDEDCRON, run_cli
from tests.support.toxiproxy import Proxied

LOCK = "job"
KEEP_LEASE_SECONDS = 6.0
CONNECT_TIMEOUT = 2  # libpq's minimum, so the stated bounds are as short as they get
# Added to every stated bound: start-up of a Python process and scheduling on a busy machine.
SLACK_SECONDS = 5.0
# SIGTERM to exit is a tighter promise; its slack covers process scheduling only.
STOP_SLACK_SECONDS = 1.5


def password_of(dsn: str) -> str:
    password = conninfo_to_dict(dsn).get("password")
    assert password, "the test database must have a password, to check it never leaks"
    return str(password)


def environment(dsn: str, termination_log: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GUARDEDCRON_DSN"}
    env["GUARDEDCRON_DSN"] = dsn
    env["GUARDEDCRON_TERMINATION_LOG"] = str(termination_log)
    return env


def acquire_directly(dsn: str, holder: str, lease_seconds: float) -> AcquireResult:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return lease_ops.acquire(conn, AcquireRequest(LOCK, holder, lease_seconds))


def start_keeper(proxied_dsn: str, fence: int, out: Path, termination_log: Path,
                 lease_seconds: float = KEEP_LEASE_SECONDS) -> subprocess.Popen[str]:
    termination_log.touch()
    return subprocess.Popen(
        [GUARDEDCRON, "keep", "--lock", LOCK, "--holder", "a", "--fence", str(fence),
         "--lease-seconds", f"{lease_seconds:g}", "--out", str(out),
         "--connect-timeout", str(CONNECT_TIMEOUT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(proxied_dsn, termination_log),
    )


def first_takeover(dsn: str, give_up_at: float) -> AcquireResult:
    """Holder b tries to take the lease, directly (not through the proxy), every 50 ms."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < give_up_at:
            result = lease_ops.acquire(conn, AcquireRequest(LOCK, "b", 60))
            if result.acquired:
                return result
            time.sleep(0.05)
    raise AssertionError("nobody could take the lease over: it never ran out")


@pytest.mark.parametrize("stream", [None, "upstream", "downstream"],
                         ids=["both-directions", "upstream-only", "downstream-only"])
def test_a_partitioned_keeper_reports_the_loss_before_anyone_can_take_over(
        dsn: str, proxied: Proxied, tmp_path: Path, stream: str | None) -> None:
    holder = acquire_directly(dsn, "a", KEEP_LEASE_SECONDS)
    out, termination_log = tmp_path / "run", tmp_path / "termination-log"
    keeper = start_keeper(proxied.dsn, holder.fence, out, termination_log)
    exited_at: list[float] = []  # wall clock, comparable with PostgreSQL's (same machine)

    def wait_for_exit() -> None:
        keeper.wait(timeout=60)
        exited_at.append(time.time())

    try:
        time.sleep(3.0)  # two renewals have answered (at start and after lease/3)
        assert keeper.poll() is None, keeper.communicate()[1]
        proxied.proxy.blackhole(stream)
        waiter = threading.Thread(target=wait_for_exit)
        waiter.start()
        # The renewals' answers are lost; with the downstream-only cut they still reach the
        # database and extend the lease, so a takeover comes later, never earlier.
        takeover = first_takeover(dsn, time.monotonic() + 3 * KEEP_LEASE_SECONDS + SLACK_SECONDS)
        waiter.join(timeout=30)
        _, stderr = keeper.communicate(timeout=10)
    finally:
        if keeper.poll() is None:
            keeper.kill()
            keeper.communicate()
    assert keeper.returncode == 76, stderr
    assert takeover.fence == holder.fence + 1 and takeover.db_now is not None
    taken_at = takeover.db_now.timestamp()
    lost = json.loads((out / "lost").read_text())
    assert lost["fence"] == holder.fence
    # The hung renewal ends at the deadline either way: the keeper stops waiting for it ("no
    # answer within N s") or, an instant earlier, its client-side deadline fails it in the
    # worker ("no answer from database ... within N s"), which the loss then names.
    assert lost["reason"].startswith("could not renew before the lease could run out: no answer ")
    # The marker was written, and the keeper had exited, before the database handed the
    # lease to b (both clocks are this machine's).
    assert (out / "lost").stat().st_mtime < taken_at
    assert exited_at and exited_at[0] < taken_at, (exited_at, taken_at)
    assert json.loads(termination_log.read_text())["outcome"] == "lost"
    assert "LEASE LOST" in stderr
    assert password_of(dsn) not in stderr + termination_log.read_text() + (out / "lost").read_text()


def test_a_keeper_that_never_hears_from_the_database_reports_the_loss_before_the_lease_ends(
        dsn: str, proxied: Proxied, tmp_path: Path) -> None:
    """Cut from the start (a server that takes the connection and never answers): the
    keeper's first renewal hangs, and the loss is reported while the lease still runs
    (counted from the acquire, lease.json: 8 s leave a loaded machine time to start it)."""
    lease_seconds = 8.0
    out, termination_log = tmp_path / "run", tmp_path / "termination-log"
    acquired = run_cli(["acquire", "--lock", LOCK, "--holder", "a", "--lease-seconds", f"{lease_seconds:g}",
                        "--out", str(out)], dsn=dsn)
    assert acquired.code == 0, acquired.stderr
    lease_ends = datetime.fromisoformat(str(acquired.json["locked_until"])).timestamp()
    proxied.proxy.blackhole()
    keeper = start_keeper(proxied.dsn, int(str(acquired.json["fence"])), out, termination_log, lease_seconds)
    _, stderr = keeper.communicate(timeout=30)
    exited_at = time.time()
    assert keeper.returncode == 76, stderr
    # The marker is what counts: written before the lease ends (the same machine's clock).
    assert (out / "lost").stat().st_mtime < lease_ends
    assert "LEASE LOST" in stderr and "could not renew" in stderr
    assert exited_at < lease_ends + SLACK_SECONDS
    assert password_of(dsn) not in stderr


def test_sigterm_ends_a_keeper_whose_renewal_hangs_within_its_stop_bound(
        dsn: str, proxied: Proxied, tmp_path: Path) -> None:
    lease_seconds = 9.0  # renewals every 3 s; the one after the cut hangs until about 8 s
    holder = acquire_directly(dsn, "a", lease_seconds)
    keeper = start_keeper(proxied.dsn, holder.fence, tmp_path / "run", tmp_path / "termination-log",
                          lease_seconds)
    try:
        time.sleep(2.0)  # the first renewal has answered
        proxied.proxy.blackhole()
        time.sleep(3.0)  # the second renewal (about 3 s after start) is now hanging
        assert keeper.poll() is None, keeper.communicate()[1]
        keeper.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        _, stderr = keeper.communicate(timeout=30)
        took = time.monotonic() - signalled
    finally:
        if keeper.poll() is None:
            keeper.kill()
            keeper.communicate()
    assert keeper.returncode == 0, stderr
    assert took < KEEPER_STOP_SECONDS + STOP_SLACK_SECONDS, took
    assert f"no release within {KEEPER_STOP_SECONDS:g} s of SIGTERM; the lease runs out by itself" in stderr
    assert password_of(dsn) not in stderr


def test_a_guard_connection_detects_a_dead_peer_and_prepares_nothing(dsn: str) -> None:
    from guardedcron.guard.connection import connect

    with connect(dsn, 5) as conn:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 5
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 2
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 10_000
        for _ in range(10):  # psycopg would prepare a statement from its sixth run
            lease_ops.renew(conn, LOCK, "a", 1, 5)
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)
        # No `options` startup parameter (PgBouncer refuses it): only what libpq always sends.
        assert "options" not in conn.info.get_parameters()


def test_keep_with_the_schema_missing_exits_78(empty_dsn: str, tmp_path: Path) -> None:
    termination_log = tmp_path / "termination-log"
    keeper = start_keeper(empty_dsn, 1, tmp_path / "run", termination_log)
    _, stderr = keeper.communicate(timeout=30)
    assert keeper.returncode == 78, stderr
    assert "run `guardedcron db migrate`" in stderr
    assert not (tmp_path / "run" / "lost").exists()
    assert password_of(empty_dsn) not in stderr


@contextmanager
def lease_row_locked(dsn: str) -> Iterator[None]:
    """Hold the lease row FOR UPDATE, so a call on it waits inside the database."""
    with psycopg.connect(dsn) as blocker:
        blocker.execute("SELECT 1 FROM guardedcron.leases WHERE lock_name = %s FOR UPDATE", (LOCK,))
        yield
        blocker.commit()


def a_call_waits_on_the_lock(dsn: str) -> bool:
    """Whether a guardedcron call is (soon, within 10 s) waiting on a lock in the database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(200):
            waiting = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'guardedcron'"
                " AND wait_event_type = 'Lock'"
            ).fetchone()
            if waiting and waiting[0]:
                return True
            time.sleep(0.05)
    return False


CUT_MID_CALL = {
    "acquire": (["acquire", "--lock", LOCK, "--holder", "b", "--lease-seconds", "30"],
                ACQUIRE_CALL_SECONDS),
    "renew": (["renew", "--lock", LOCK, "--holder", "a", "--fence", "1", "--lease-seconds", "30"],
              HOLDER_CALL_SECONDS),
    "release": (["release", "--lock", LOCK, "--holder", "a", "--fence", "1"], HOLDER_CALL_SECONDS),
}


@pytest.mark.parametrize("command", list(CUT_MID_CALL))
def test_a_command_whose_answer_is_swallowed_exits_69_within_its_bound(
        dsn: str, proxied: Proxied, tmp_path: Path, command: str) -> None:
    """The call reaches the database and waits there on a row lock; then the network
    swallows everything, the lock is freed, and the answer never arrives."""
    args, call_seconds = CUT_MID_CALL[command]
    assert acquire_directly(dsn, "a", 0.2).fence == 1
    time.sleep(0.3)  # run out, so that acquire too goes for the row lock (renew and release do anyway)
    termination_log = tmp_path / "termination-log"
    termination_log.touch()
    with lease_row_locked(dsn):
        started = time.monotonic()
        proc = subprocess.Popen(
            [GUARDEDCRON, *args, "--connect-timeout", str(CONNECT_TIMEOUT)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=environment(proxied.dsn, termination_log))
        if not a_call_waits_on_the_lock(dsn):
            proc.kill()
            raise AssertionError(f"the call never reached the database: {proc.communicate()}")
        proxied.proxy.blackhole()
    try:
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    took = time.monotonic() - started
    bound = CONNECT_TIMEOUT + call_seconds
    assert proc.returncode == 69, stderr
    assert took < bound + SLACK_SECONDS, (took, bound)
    assert f"no answer from database guardedcron@127.0.0.1:{proxied.proxy.listen_port}/" in stderr
    assert f"within {call_seconds:g} s" in stderr
    assert len(stderr.splitlines()) == 1, stderr  # one reason, no driver warnings, no traceback
    assert password_of(dsn) not in stderr + termination_log.read_text()
    if command == "acquire":
        message = json.loads(termination_log.read_text())
        assert (message["outcome"], message["exitCode"]) == ("error", 69)
        assert "no answer from database" in message["reason"]


@pytest.mark.parametrize("command", list(CUT_MID_CALL))
def test_a_command_that_cannot_connect_through_a_partition_exits_69_within_its_bound(
        dsn: str, proxied: Proxied, tmp_path: Path, command: str) -> None:
    args, _ = CUT_MID_CALL[command]
    acquire_directly(dsn, "a", 30)
    termination_log = tmp_path / "termination-log"
    termination_log.touch()
    proxied.proxy.blackhole()
    result = run_cli([*args, "--connect-timeout", str(CONNECT_TIMEOUT)],
                     env=environment(proxied.dsn, termination_log), timeout=60)
    assert result.code == 69, result.stderr
    assert result.seconds < CONNECT_TIMEOUT + SLACK_SECONDS, result.seconds
    assert "cannot reach database" in result.stderr and "connection timeout expired" in result.stderr
    assert password_of(dsn) not in result.stderr + termination_log.read_text()


def test_sigterm_ends_an_acquire_stuck_in_a_partition_at_once(
        dsn: str, proxied: Proxied, tmp_path: Path) -> None:
    """Only `keep` handles SIGTERM (to release); every other command ends on it at once."""
    proxied.proxy.blackhole()
    proc = subprocess.Popen(
        [GUARDEDCRON, *CUT_MID_CALL["acquire"][0], "--connect-timeout", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=environment(proxied.dsn, tmp_path / "termination-log"))
    time.sleep(2.0)  # started, and waiting for the database
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    try:
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGTERM
    assert time.monotonic() - signalled < KEEPER_STOP_SECONDS + STOP_SLACK_SECONDS
    assert password_of(dsn) not in stdout + stderr


def test_db_migrate_whose_answer_is_swallowed_exits_69_at_its_deadline(
        empty_dsn: str, proxied_empty: Proxied, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The admin commands (db, runs) bound all their statements by ADMIN_CALL_SECONDS;
    here it is shortened so the test does not wait a minute."""
    from guardedcron.cli.main import main
    from guardedcron.guard.migrations import MIGRATION_LOCK_KEY

    monkeypatch.setattr("guardedcron.cli.db.ADMIN_CALL_SECONDS", 3.0)
    with psycopg.connect(empty_dsn) as blocker:  # another migration holds the lock
        blocker.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        threading.Timer(1.0, proxied_empty.proxy.blackhole).start()
        started = time.monotonic()
        code = main(["db", "migrate", "--dsn", proxied_empty.dsn, "--connect-timeout", "2"])
        took = time.monotonic() - started
        blocker.rollback()
    err = capsys.readouterr().err
    assert code == 69, err
    assert "no answer from database" in err and "within 3 s" in err
    assert took < 3.0 + 5.0, took  # the bound plus slack for a loaded machine
    assert password_of(empty_dsn) not in err
