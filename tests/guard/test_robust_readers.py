"""Readers against every value the tables can hold (issue 11, item 3). The superuser writes
what Python's datetime cannot hold ('infinity', '-infinity', years past 9999 or BC), NULLs
and bigint extremes, as a DBA or a restore could; the guard, the keeper, check_fence and
`guardedcron runs` answer with them (clamped to the years 1 and 9999), never crash. On the
schema-3 code each of these exits 70 (psycopg's DataError) or loses the lease."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import UTC, datetime
from typing import Any

import psycopg

from guardedcron.contract import BIGINT_MAX, EXIT_FAILURE, EXIT_NOT_ACQUIRED, EXIT_OK
from guardedcron.guard.fence import check_fence
from tests.support import GUARDEDCRON, run_cli

Connection = psycopg.Connection[tuple[Any, ...]]
LATEST = datetime.max.replace(tzinfo=UTC).isoformat()
EARLIEST = datetime.min.replace(tzinfo=UTC).isoformat()
KEEP_6_S = ("--lease-seconds", "6", "--dsn")


def acquire(dsn: str, holder: str, lease_seconds: str = "30") -> dict[str, Any]:
    result = run_cli(
        ["acquire", "--lock", "job", "--holder", holder, "--lease-seconds", lease_seconds], dsn=dsn
    )
    assert result.code == EXIT_OK, result
    answer: dict[str, Any] = result.json
    return answer


def edit(dsn: str, statement: str, arguments: tuple[Any, ...] = ()) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement.encode(), arguments)


def test_a_lease_held_until_infinity_is_answered_by_every_command(dsn: str) -> None:
    fence = acquire(dsn, "h1")["fence"]
    edit(dsn, "UPDATE guardedcron.leases SET locked_until = 'infinity', min_hold_until = '-infinity'")
    other = run_cli(["acquire", "--lock", "job", "--holder", "h2", "--lease-seconds", "30"], dsn=dsn)
    assert other.code == EXIT_NOT_ACQUIRED, other
    assert other.json["locked_until"] == LATEST and other.json["holder"] == "h1"
    assert f"held by h1 (fence {fence}) until {LATEST}" in other.stderr
    holder = ["--lock", "job", "--holder", "h1", "--fence", str(fence)]
    renewed = run_cli(["renew", *holder, "--lease-seconds", "30"], dsn=dsn)
    assert renewed.code == EXIT_OK, renewed
    assert renewed.json["locked_until"] == LATEST
    with psycopg.connect(dsn) as conn, conn.transaction():
        check_fence(conn, "job", int(fence))
    listed = run_cli(["runs", "--lock", "job", "--json", "--overlaps", "--mark-abandoned"], dsn=dsn)
    assert listed.code == EXIT_OK, listed
    released = run_cli(["release", *holder], dsn=dsn)
    assert released.code == EXIT_OK, released
    edit(dsn, "UPDATE guardedcron.leases SET locked_until = '-infinity'")
    assert acquire(dsn, "h3")["fence"] > fence


def test_history_holding_what_python_cannot_is_listed_and_checked(dsn: str) -> None:
    acquire(dsn, "h1")
    edit(
        dsn,
        "INSERT INTO guardedcron.runs"
        " (lock_name, slot, holder, fence, started_at, finished_at, outcome, reason)"
        " VALUES ('job', %s, '', %s, '-infinity', 'infinity', 'succeeded', repeat('x', 10000)),"
        "        ('job', 0, 'far', -5, '20000-01-01 00:00+00', NULL, 'running', ''),"
        "        ('job', NULL, 'ancient', NULL, '0044-03-15 12:00+00 BC', '0044-03-15 13:00+00 BC',"
        "         'failed', ''),"
        "        ('job', NULL, 'never', 7, 'infinity', '-infinity', 'lost', '')",
        (BIGINT_MAX, BIGINT_MAX),
    )
    common = ["runs", "--lock", "job", "--overlaps", "--gaps", "--schedule", "* * * * *"]
    answer = run_cli([*common, "--json"], dsn=dsn)
    assert answer.code in (EXIT_OK, EXIT_FAILURE), answer  # gaps and overlaps are findings, not errors
    report = json.loads(answer.stdout)
    starts = sorted(run["started_at"] for run in report["runs"])
    assert EARLIEST in starts and LATEST in starts and len(starts) == 5
    assert {run["holder"]: run["finished_at"] for run in report["runs"]}[""] == LATEST
    text = run_cli(common, dsn=dsn)
    assert text.code in (EXIT_OK, EXIT_FAILURE) and "Traceback" not in text.stderr, text
    marked = run_cli(["runs", "--lock", "job", "--mark-abandoned", "--json"], dsn=dsn)
    assert marked.code == EXIT_OK, marked


def test_the_keeper_keeps_a_lease_edited_to_last_forever(dsn: str) -> None:
    """Its renewals answer 'infinity': believed for 7 days at most (every wait stays bounded),
    and the keeper renews and releases as usual. Schema-3 code: each renewal fails to read
    its answer, and the lease is reported lost at its first deadline (exit 76)."""
    fence = acquire(dsn, "h1", "6")["fence"]
    edit(dsn, "UPDATE guardedcron.leases SET locked_until = 'infinity'")
    keeper = subprocess.Popen(
        [GUARDEDCRON, "keep", "--lock", "job", "--holder", "h1", "--fence", str(fence), *KEEP_6_S, dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(6.0)  # past the lease's first deadline (6 s less the 1 s margin)
    assert keeper.poll() is None, keeper.communicate()
    keeper.send_signal(signal.SIGTERM)
    _, errors = keeper.communicate(timeout=10)
    assert keeper.returncode == EXIT_OK, errors
    assert "LEASE LOST" not in errors and "renewal failed" not in errors
    assert "released lock job" in errors
