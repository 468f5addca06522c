"""The guard through a real PgBouncer in transaction mode (issue 11, item 4).

Behind a transaction pooler, each transaction may run on another server session. The
pooler here (`guardedcron_devenv.pgbouncer`) hands idle server sessions out in turn
and every test first fills its pool with two, so one client's consecutive statements
alternate between two sessions: anything the guard left on a session (a prepared
statement, a `SET`, an advisory lock, ...) is missing from the next statement's, which
is exactly how it fails in production, only every time instead of now and then.

The scenarios run the real `guardedcron` command where they are command-level
(acquire, lose, renew, release, keep, runs, db), the Python helper where the workload
calls it (`check_fence`), and every test ends by reading every server session of its
pool: no prepared statement, session setting, advisory lock, LISTEN, temporary table or
cursor is left behind. The first test is the control: psycopg's default prepare
threshold breaks the keeper's renewals through this pooler with SQLSTATE 26000.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from guardedcron.guard import lease as lease_ops
from guardedcron.guard.connection import connect, connection_options
from guardedcron.guard.errors import StaleFenceError
from guardedcron.guard.fence import check_fence
from guardedcron.guard.lease import AcquireRequest
from guardedcron_devenv.pgbouncer import STARTUP_TIMEOUT_S, STOP_TIMEOUT_S, PgBouncer, PgBouncerError
from guardedcron_devenv.postgres import ThrowawayPostgres
from tests.support import GUARDEDCRON, run_cli
from tests.support.pgbouncer import open_server_connections, server_pids, session_state

LOCK = "billing/nightly"
RENEWALS = 12  # psycopg prepares a statement from its 5th use on: well past that
POOLED_SERVER_SESSIONS = 2


@pytest.fixture
def pooled(pgbouncer: PgBouncer, dsn: str) -> Iterator[str]:
    """The test's migrated database through the pooler, its pool holding two server sessions;
    afterwards, every one of them must be as clean as a fresh session."""
    through = pgbouncer.dsn_for(dsn)
    open_server_connections(through, POOLED_SERVER_SESSIONS)
    yield through
    leaks = {pid: state for pid, state in session_state(pgbouncer, through).items() if not state.clean}
    assert leaks == {}, f"server sessions left with state behind the pooler: {leaks}"


def acquire(pooled_dsn: str, holder: str, lease_seconds: str = "30", *extra: str) -> Any:
    return run_cli(
        ["acquire", "--lock", LOCK, "--holder", holder, "--lease-seconds", lease_seconds, *extra],
        dsn=pooled_dsn,
    )


def lease_row(dsn: str) -> tuple[Any, ...]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT holder, fence, locked_until > clock_timestamp()"
            " FROM guardedcron.leases WHERE lock_name = %s",
            (LOCK,),
        ).fetchone()
    assert row is not None
    return row


def test_the_control_psycopgs_default_prepare_threshold_breaks_renewals_through_the_pooler(
    pgbouncer: PgBouncer, dsn: str
) -> None:
    """What the guard's `prepare_threshold=None` prevents: the pooler test can fail."""
    pooled_dsn = pgbouncer.dsn_for(dsn)
    open_server_connections(pooled_dsn, POOLED_SERVER_SESSIONS)
    won = acquire(pooled_dsn, "a")
    assert won.code == 0, won.stderr
    options = {**connection_options(5), "prepare_threshold": 5}  # psycopg's default
    failures: list[str | None] = []
    with psycopg.connect(pooled_dsn, **options) as conn:
        for _ in range(RENEWALS):
            try:
                lease_ops.renew(conn, LOCK, "a", 1, 30)
            except psycopg.Error as error:
                failures.append(error.sqlstate)
                break
    assert failures == ["26000"]  # invalid_sql_statement_name: "prepared statement _pg3_0 does not exist"


def test_acquire_lose_renew_release_through_the_pooler(pooled: str, dsn: str) -> None:
    won = acquire(pooled, "a", "30", "--slot", "7")
    assert won.code == 0, won.stderr
    assert (won.json["acquired"], won.json["fence"]) == (True, 1)
    lost = acquire(pooled, "b", "30", "--slot", "8")  # another slot: its own claim is free
    assert lost.code == 75, lost.stderr
    assert (lost.json["reason"], lost.json["holder"]) == ("lease-held", "a")
    renew = ["renew", "--lock", LOCK, "--fence", "1", "--lease-seconds", "30"]
    for _ in range(RENEWALS):  # each one a new process, so each starts unprepared anyway
        assert run_cli([*renew, "--holder", "a"], dsn=pooled).code == 0
    assert run_cli([*renew, "--holder", "b"], dsn=pooled).code == 75
    released = run_cli(
        ["release", "--lock", LOCK, "--holder", "a", "--fence", "1", "--outcome", "succeeded"], dsn=pooled
    )
    assert released.code == 0 and released.json["released"] is True, released.stderr
    assert lease_row(dsn)[2] is False
    again = acquire(pooled, "c", "30", "--slot", "7")
    assert (again.code, again.json["reason"]) == (75, "slot-claimed")


def test_one_connection_renews_many_times_through_the_pooler(pooled: str) -> None:
    """The keeper's pattern: one connection, the same statement again and again."""
    assert acquire(pooled, "a").code == 0
    with connect(pooled, 5) as conn:
        # Consecutive statements of this one connection run on different server sessions.
        pids = {conn.execute("SELECT pg_backend_pid()").fetchone() for _ in range(POOLED_SERVER_SESSIONS)}
        assert len(pids) == POOLED_SERVER_SESSIONS
        for _ in range(RENEWALS):
            state = lease_ops.renew(conn, LOCK, "a", 1, 30)
            assert (state.ok, state.holder, state.fence) == (True, "a", 1)
        assert lease_ops.release(conn, LOCK, "a", 1, "succeeded").ok


def test_the_keeper_sidecar_through_the_pooler(pooled: str, dsn: str, tmp_path: Path) -> None:
    """`guardedcron keep` renews every second on one connection, then releases on SIGTERM.
    Without `--out` its first deadline counts from its own start, not from the acquire: a
    machine loaded enough to start it late would otherwise fail this test for that alone."""
    out = tmp_path / "run"
    assert acquire(pooled, "a", "3", "--out", str(out)).code == 0
    termination = tmp_path / "termination-log"
    termination.touch()
    keeper = subprocess.Popen(
        [GUARDEDCRON, "keep", "--lock", LOCK, "--holder", "a", "--fence-file", str(out / "fence"),
         "--lease-seconds", "3", "--dsn", pooled],
        env={**os.environ, "GUARDEDCRON_TERMINATION_LOG": str(termination)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(8.0)  # past two leases: only renewals (every second) keep it alive
        assert keeper.poll() is None, keeper.stderr.read() if keeper.stderr else ""
        assert lease_row(dsn) == ("a", 1, True)
        assert acquire(pooled, "b", "5").code == 75
    finally:
        keeper.send_signal(signal.SIGTERM)
        _, stderr = keeper.communicate(timeout=10)
    assert keeper.returncode == 0, stderr
    assert "released lock" in stderr and "renewal failed" not in stderr, stderr
    message = json.loads(termination.read_text())
    assert message["outcome"] == "released"
    assert message["renewals"] > 5, message  # past psycopg's prepare threshold
    assert lease_row(dsn)[2] is False
    assert acquire(pooled, "b", "5").code == 0


def test_check_fence_holds_the_lease_row_for_the_whole_transaction_through_the_pooler(pooled: str) -> None:
    """The pooler keeps a transaction on one server session: the fence check's lock lasts
    until the commit, so a takeover waits for the holder's write, as without a pooler."""
    assert acquire(pooled, "a", "0.3").code == 0
    events: list[str] = []
    with connect(pooled, 5) as holder:
        with pytest.raises(StaleFenceError), holder.transaction():
            check_fence(holder, LOCK, 2)  # a fence never granted: refused
        with holder.transaction():
            check_fence(holder, LOCK, 1)
            time.sleep(0.4)  # the lease runs out while the check's lock is held

            def take_over() -> None:
                with connect(pooled, 5) as conn:
                    result = lease_ops.acquire(conn, AcquireRequest(LOCK, "b", 30))
                events.append(f"b acquired={result.acquired}")

            taker = threading.Thread(target=take_over)
            taker.start()
            taker.join(1.0)  # it waits on the lease row: the holder's transaction still has it
            events.append("a commits")
        taker.join(30)
        with pytest.raises(StaleFenceError, match="fence 2 is now held by b"), holder.transaction():
            check_fence(holder, LOCK, 1)
    assert events == ["a commits", "b acquired=True"]


def test_runs_and_db_commands_through_the_pooler(pgbouncer: PgBouncer, pooled: str, empty_dsn: str) -> None:
    assert acquire(pooled, "a", "0.2").code == 0
    time.sleep(0.3)
    assert acquire(pooled, "b").code == 0
    report = run_cli(["runs", "--lock", LOCK, "--json", "--overlaps", "--mark-abandoned"], dsn=pooled)
    assert report.code == 0, report.stderr
    document = report.json
    assert [(r["holder"], r["outcome"]) for r in document["runs"]] == [
        ("b", "running"),
        ("a", "abandoned"),
    ]
    assert document["overlaps"] == []
    # The schema itself, migrated through the pooler (one transaction, its advisory lock
    # transaction-scoped), on a database that has none yet.
    fresh = pgbouncer.dsn_for(empty_dsn)
    migrated = run_cli(["db", "migrate"], dsn=fresh)
    assert migrated.code == 0, migrated.stderr
    assert run_cli(["db", "status"], dsn=fresh).code == 0
    assert server_pids(pgbouncer, fresh)
    leaks = {pid: s for pid, s in session_state(pgbouncer, fresh).items() if not s.clean}
    assert leaks == {}


def test_a_pooler_that_cannot_start_fails_at_once_with_its_reason(postgres: ThrowawayPostgres) -> None:
    with pytest.raises(PgBouncerError, match="pgbouncer exited with 1 at start-up") as refused:
        PgBouncer(postgres.dsn(), settings={"pool_mode": "sometimes"}).__enter__()
    assert "sometimes" in str(refused.value)
    assert postgres.password not in str(refused.value)
    with pytest.raises(
        PgBouncerError, match=r"not installed at /nonexistent/pgbouncer; run `bash .ci/bootstrap`"
    ):
        PgBouncer(postgres.dsn(), binary=Path("/nonexistent/pgbouncer")).__enter__()


def test_a_pooler_that_never_listens_is_given_up_after_the_start_bound(
    postgres: ThrowawayPostgres, tmp_path: Path
) -> None:
    """Both bounds of the pooler's life cycle: the start gives up after STARTUP_TIMEOUT_S,
    and a process that ignores SIGTERM is killed STOP_TIMEOUT_S later."""
    silent = tmp_path / "silent-pooler"
    # Never opens its port, and ignores SIGTERM.
    silent.write_text("#!/bin/sh\ntrap '' TERM\nwhile :; do sleep 0.2; done\n")
    silent.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(PgBouncerError, match=f"did not accept connections .* within {STARTUP_TIMEOUT_S:g} s"):
        PgBouncer(postgres.dsn(), binary=silent).__enter__()
    took = time.monotonic() - started
    assert STARTUP_TIMEOUT_S + STOP_TIMEOUT_S <= took < STARTUP_TIMEOUT_S + STOP_TIMEOUT_S + 5  # then killed
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if str(silent).encode() in read_bytes(p)]


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process ended meanwhile
        return b""
