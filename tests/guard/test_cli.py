"""The guard CLI as the injected container runs it: real processes, real PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from guardedcron.guard.migrations import LATEST_VERSION, load_migrations
from guardedcron.schedule.hashed import resolve_hashed
from guardedcron.spec import parse_guarded_cronjob
from guardedcron_devenv.postgres import ThrowawayPostgres, free_port
from tests.support import GUARDEDCRON, run_cli
from tests.support.faketime import skewed_env
from tests.support.gcj import base_gcj

ACQUIRE = ["acquire", "--lock", "billing/nightly", "--lease-seconds", "60"]


def test_acquire_writes_fence_files_and_prints_one_json_line(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_cli(
        [*ACQUIRE, "--holder", "billing/pod-1", "--slot", "29345678", "--out", str(out)], dsn=dsn
    )
    assert result.code == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) == 1
    payload = result.json
    assert payload["acquired"] is True
    assert (payload["lock"], payload["holder"], payload["fence"], payload["slot"]) == (
        "billing/nightly",
        "billing/pod-1",
        1,
        29345678,
    )
    assert (out / "fence").read_text() == "1\n"
    lease = json.loads((out / "lease.json").read_text())
    assert lease["fence"] == 1 and lease["locked_until"] == payload["locked_until"]


def test_loser_exits_75_names_the_holder_and_writes_nothing(dsn: str, tmp_path: Path) -> None:
    assert run_cli([*ACQUIRE, "--holder", "a"], dsn=dsn).code == 0
    out = tmp_path / "loser"
    result = run_cli([*ACQUIRE, "--holder", "b", "--out", str(out)], dsn=dsn)
    assert result.code == 75
    assert result.json["acquired"] is False and result.json["holder"] == "a"
    assert "held by a (fence 1)" in result.stderr
    assert not out.exists()


def test_slot_from_a_cronjob_made_job_name_and_none_for_a_manual_job(dsn: str) -> None:
    first = run_cli(
        [*ACQUIRE, "--holder", "a", "--job-name", "nightly-29345678", "--cronjob", "nightly"], dsn=dsn
    )
    assert first.code == 0 and first.json["slot"] == 29345678
    run_cli(["release", "--lock", "billing/nightly", "--holder", "a", "--fence", "1"], dsn=dsn)
    again = run_cli(
        [*ACQUIRE, "--holder", "b", "--job-name", "nightly-29345678", "--cronjob", "nightly"], dsn=dsn
    )
    assert again.code == 75 and again.json["reason"] == "slot-claimed"
    manual = run_cli(
        [*ACQUIRE, "--holder", "c", "--job-name", "nightly-manual-x7k2", "--cronjob", "nightly"], dsn=dsn
    )
    assert manual.code == 0 and manual.json["slot"] is None


def test_termination_message_summarises_the_outcome(dsn: str, tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    log.touch()
    env = {"GUARDEDCRON_TERMINATION_LOG": str(log)}
    assert run_cli([*ACQUIRE, "--holder", "a", "--slot", "7"], dsn=dsn, env=env).code == 0
    won = json.loads(log.read_text())
    assert (won["outcome"], won["holder"], won["fence"], won["slot"]) == ("acquired", "a", 1, 7)
    assert run_cli([*ACQUIRE, "--holder", "b", "--slot", "7"], dsn=dsn, env=env).code == 75
    lost = json.loads(log.read_text())
    assert (lost["outcome"], lost["holder"], lost["requester"]) == ("skipped", "a", "b")
    assert len(log.read_bytes()) <= 4096


def test_release_renew_exit_codes(dsn: str) -> None:
    assert run_cli([*ACQUIRE, "--holder", "a"], dsn=dsn).code == 0
    assert (
        run_cli(
            ["renew", "--lock", "billing/nightly", "--holder", "b", "--fence", "1", "--lease-seconds", "60"],
            dsn=dsn,
        ).code
        == 75
    )
    assert (
        run_cli(
            ["renew", "--lock", "billing/nightly", "--holder", "a", "--fence", "1", "--lease-seconds", "60"],
            dsn=dsn,
        ).code
        == 0
    )
    not_holder = run_cli(["release", "--lock", "billing/nightly", "--holder", "b", "--fence", "1"], dsn=dsn)
    assert not_holder.code == 75
    released = run_cli(
        ["release", "--lock", "billing/nightly", "--holder", "a", "--fence", "1", "--outcome", "succeeded"],
        dsn=dsn,
    )
    assert released.code == 0 and released.json["released"] is True


def burst(dsn: str, contenders: int, lock: str) -> tuple[list[int], list[float]]:
    """Start `contenders` guard processes at once; return exit codes and exit times."""
    start = time.monotonic()
    procs = [
        subprocess.Popen(
            [
                GUARDEDCRON,
                "acquire",
                "--lock",
                lock,
                "--holder",
                f"replica-{i}",
                "--lease-seconds",
                "60",
                "--dsn",
                dsn,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(contenders)
    ]
    codes, times = [], []
    pending = dict(enumerate(procs))
    exit_times: dict[int, float] = {}
    while pending:
        for index, proc in list(pending.items()):
            if proc.poll() is not None:
                exit_times[index] = time.monotonic() - start
                del pending[index]
        time.sleep(0.005)
    for index, proc in enumerate(procs):
        codes.append(proc.returncode)
        times.append(exit_times[index])
    return codes, times


@pytest.mark.quiet_machine  # run first: it measures the guard, not the suites beside it
def test_twenty_processes_one_winner_everyone_answered_within_five_seconds(dsn: str) -> None:
    """The seeds' check, 20 rounds: one works, the others exit within 5 s."""
    slowest = 0.0
    for round_number in range(20):
        codes, times = burst(dsn, 20, f"burst-{round_number}")
        assert sorted(codes) == [0] + [75] * 19, codes
        assert max(times) < 5.0, f"round {round_number}: slowest exit after {max(times):.2f} s"
        slowest = max(slowest, max(times))
    print(f"slowest of 400 guard processes answered {slowest:.2f} s after its burst started")


@pytest.mark.quiet_machine  # the seeds' one-second bound measures the database, not the suites beside it
def test_two_hundred_connections_one_winner_every_loser_within_a_second(
    postgres: ThrowawayPostgres, dsn: str
) -> None:
    from guardedcron.guard import lease as lease_ops

    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(200)]
    try:
        barrier = threading.Barrier(len(conns))
        results: list[tuple[bool, float]] = [(False, 0.0)] * len(conns)

        def contend(index: int) -> None:
            barrier.wait()
            began = time.monotonic()
            outcome = lease_ops.acquire(conns[index], lease_ops.AcquireRequest("crowd", f"conn-{index}", 60))
            results[index] = (outcome.acquired, time.monotonic() - began)

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(len(conns))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for conn in conns:
            conn.close()
    winners = [r for r in results if r[0]]
    assert len(winners) == 1
    assert max(seconds for _, seconds in results) < 1.0


def test_ten_concurrent_migrations_all_succeed(empty_dsn: str) -> None:
    procs = [
        subprocess.Popen(
            [GUARDEDCRON, "db", "migrate", "--dsn", empty_dsn],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(10)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 10, outputs
    applied = [json.loads(out)["applied"] for out, _ in outputs]
    # Every shipped migration, by the one list of them (it grows with each schema).
    every = [m.version for m in load_migrations()]
    assert every == list(range(1, LATEST_VERSION + 1))
    assert sorted(applied) == [[]] * 9 + [every]
    with psycopg.connect(empty_dsn) as conn:
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema='guardedcron'"
            )
        }
        functions = {
            r[0]
            for r in conn.execute(
                "SELECT routine_name FROM information_schema.routines WHERE routine_schema='guardedcron'"
            )
        }
        versions = conn.execute("SELECT version FROM guardedcron.schema_migrations").fetchall()
    assert tables == {"leases", "slot_claims", "runs", "schema_migrations", "lock_grants", "write_calls"}
    assert {
        "acquire_v1",
        "renew_v1",
        "release_v1",
        "acquire_v2",
        "renew_v2",
        "release_v2",
        "check_fence",
        "mark_lost_v1",
        "mark_abandoned_v1",
    } <= functions
    assert versions == [(v,) for v in every]


def test_schema_missing_exits_78_and_says_how_to_fix_it(empty_dsn: str) -> None:
    result = run_cli([*ACQUIRE, "--holder", "a"], dsn=empty_dsn)
    assert result.code == 78
    assert "guardedcron db migrate" in result.stderr
    status = run_cli(["db", "status"], dsn=empty_dsn)
    assert status.code == 78


def test_database_down_exits_69_in_time_without_the_password(tmp_path: Path) -> None:
    port = free_port()  # nothing listens here
    secret = "s3cr3t-Pa55word"
    dsn = f"postgresql://svc:{secret}@127.0.0.1:{port}/billing"
    result = run_cli([*ACQUIRE, "--holder", "a", "--connect-timeout", "2"], dsn=dsn)
    assert result.code == 69
    assert result.seconds < 2 + 1
    assert f"127.0.0.1:{port}/billing" in result.stderr
    assert secret not in result.stdout + result.stderr


def test_wrong_password_exits_69_without_the_password(postgres: ThrowawayPostgres) -> None:
    wrong = "not-the-Right-one-42"
    dsn = postgres.dsn("postgres", password=wrong)
    result = run_cli([*ACQUIRE, "--holder", "a"], dsn=dsn)
    assert result.code == 69
    assert "password authentication failed" in result.stderr
    assert f"127.0.0.1:{postgres.port}/postgres" in result.stderr
    assert wrong not in result.stdout + result.stderr


def test_unresponsive_database_exits_69_within_the_connect_timeout() -> None:
    """A server that accepts TCP but never answers: the timeout must bound the wait."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        dsn = f"postgresql://svc:pw@127.0.0.1:{port}/billing"
        result = run_cli([*ACQUIRE, "--holder", "a", "--connect-timeout", "2"], dsn=dsn)
    finally:
        listener.close()
    assert result.code == 69
    assert result.seconds < 2 + 1, result.seconds


def test_the_client_clock_decides_nothing(dsn: str) -> None:
    """Guards on clocks skewed a day either way see the same lease as the database does."""
    skew_ahead, skew_behind = skewed_env("+1d"), skewed_env("-1d")
    # Long enough that the two refusals below happen inside it even on a loaded machine.
    first = run_cli([*ACQUIRE, "--holder", "ahead", "--lease-seconds", "20"], dsn=dsn, env=skew_ahead)
    assert first.code == 0, first.stderr
    # A client a day behind must not think the lease is free, nor one a day ahead.
    assert run_cli([*ACQUIRE, "--holder", "behind"], dsn=dsn, env=skew_behind).code == 75
    assert run_cli([*ACQUIRE, "--holder", "ahead2"], dsn=dsn, env=skew_ahead).code == 75
    with psycopg.connect(dsn, autocommit=True) as conn:
        live = conn.execute("SELECT locked_until > clock_timestamp() FROM guardedcron.leases").fetchone()
        assert live == (True,), "the refusals must have happened while the lease was live"
        # Let the lease run out by the database's clock (rather than sleep through 20 s).
        conn.execute("UPDATE guardedcron.leases SET locked_until = clock_timestamp(),"
                     " min_hold_until = clock_timestamp()")
    taken = run_cli([*ACQUIRE, "--holder", "behind"], dsn=dsn, env=skew_behind)
    assert taken.code == 0 and taken.json["fence"] == 2
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT abs(extract(epoch FROM acquired_at - clock_timestamp())) FROM guardedcron.leases"
        ).fetchone()
    assert row is not None and float(row[0]) < 60  # the database's time, not the skewed one


BAD_INPUT = [
    (["acquire", "--lock", "", "--holder", "a", "--lease-seconds", "5"], "lock must not be empty"),
    (["acquire", "--lock", "j", "--holder", "", "--lease-seconds", "5"], "holder must not be empty"),
    (["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "0"], "from 0.1 to 604800"),
    (["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "-3"], "from 0.1 to 604800"),
    (["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "soon"], "must be a number"),
    (["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "nan"], "finite"),
    (
        ["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "5", "--min-hold-seconds", "6"],
        "longer than the lease",
    ),
    (
        ["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "5", "--min-hold-seconds", "-1"],
        "--min-hold-seconds must be from 0 to 604800",
    ),
    (
        ["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "5", "--slot", "12.5"],
        "must be an integer",
    ),
    (
        ["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "5", "--slot", "-4"],
        "--slot must be from 0 to",
    ),
    (
        ["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "5", "--job-name", "x-1"],
        "needs --cronjob",
    ),
    (
        ["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "5", "--cronjob", "x"],
        "goes with --job-name",
    ),
    (
        ["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "5", "--connect-timeout", "0"],
        "connect-timeout",
    ),
    (
        ["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "5", "--retain-days", "0"],
        "--retain-days must be from 1 to",
    ),
    (
        ["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "5", "--retain-runs", "x"],
        "must be an integer",
    ),
    (["acquire", "--lock", "j", "--holder", "a"], "required"),
    (
        ["renew", "--lock", "j", "--holder", "a", "--fence", "one", "--lease-seconds", "5"],
        "must be an integer",
    ),
    (["renew", "--lock", "j", "--holder", "a", "--fence", "1", "--lease-seconds", "0"], "from 0.1 to"),
    (["release", "--lock", "j", "--holder", "a", "--fence", "1", "--outcome", "maybe"], "invalid choice"),
    (
        [
            "keep",
            "--lock",
            "j",
            "--holder",
            "a",
            "--fence-file",
            "/nonexistent/fence",
            "--lease-seconds",
            "5",
        ],
        "cannot read --fence-file",
    ),
    (["keep", "--lock", "j", "--holder", "a", "--fence", "1", "--lease-seconds", "-1"], "from 0.1 to"),
    (["runs", "--lock", "j", "--gaps"], "--gaps needs --schedule"),
    (["runs", "--lock", "j", "--since", "yesterday"], "ISO 8601"),
    (["runs", "--lock", "j", "--gaps", "--schedule", "H/90 * * * *"], "--schedule: minute field: step 90"),
    (["runs", "--lock", "j", "--gaps", "--schedule", "5-H * * * *"], "H must start the item"),
]


@pytest.mark.parametrize(
    ("args", "message"), BAD_INPUT, ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_bad_input_exits_64_and_touches_nothing(dsn: str, args: list[str], message: str) -> None:
    with psycopg.connect(dsn) as conn:
        before = conn.execute(
            "SELECT (SELECT count(*) FROM guardedcron.runs), (SELECT count(*) FROM guardedcron.leases)"
        ).fetchone()
    result = run_cli(args, dsn=dsn)
    assert result.code == 64, (result.stdout, result.stderr)
    assert message in result.stderr
    assert result.stdout == ""
    with psycopg.connect(dsn) as conn:
        after = conn.execute(
            "SELECT (SELECT count(*) FROM guardedcron.runs), (SELECT count(*) FROM guardedcron.leases)"
        ).fetchone()
    assert before == after


def test_missing_dsn_is_bad_input() -> None:
    result = run_cli([*ACQUIRE, "--holder", "a"])
    assert result.code == 64 and "GUARDEDCRON_DSN" in result.stderr


def test_unparseable_dsn_is_bad_input_and_not_echoed() -> None:
    dsn = "host=db password=hunter22 =broken"
    result = run_cli([*ACQUIRE, "--holder", "a"], dsn=dsn)
    assert result.code == 64
    assert "hunter22" not in result.stderr + result.stdout


def test_runs_gaps_resolve_h_with_the_lock_as_the_operator_does(dsn: str) -> None:
    """`H` in --schedule is the schedule the CronJob got: resolved from the lock inspected."""
    gcj = base_gcj()
    gcj["spec"]["schedule"] = "H H/6 * * *"
    gcj["spec"]["timeZone"] = "UTC"
    operator = parse_guarded_cronjob(gcj).spec  # what the operator gives the CronJob
    lock = operator.lease.name
    assert lock == "billing/nightly-invoices"
    # Resolved from another seed it would fire at other times, so the gaps would differ.
    assert resolve_hashed("H H/6 * * *", "") != operator.schedule_text
    since = datetime(2026, 3, 1, tzinfo=UTC)
    fires = list(operator.schedule.iter_between(since, since + timedelta(days=1), UTC))
    assert len(fires) == 4
    with psycopg.connect(dsn, autocommit=True) as conn:
        for fence, when in enumerate(fires[:1] + fires[2:], start=1):  # the second is missing
            conn.execute(
                "INSERT INTO guardedcron.runs (lock_name, slot, holder, fence, started_at, finished_at,"
                " outcome) VALUES (%s, %s, 'h', %s, %s, %s, 'succeeded')",
                (lock, int(when.timestamp()) // 60, fence, when + timedelta(seconds=5),
                 when + timedelta(seconds=30)),
            )
    window = ["--since", since.isoformat(), "--until", (since + timedelta(days=1)).isoformat()]
    args = ["runs", "--lock", lock, "--gaps", "--schedule", "H H/6 * * *", *window]
    result = run_cli([*args, "--json"], dsn=dsn)
    assert result.code == 1, result.stderr
    report: dict[str, Any] = result.json
    assert [g["expected_at"] for g in report["gaps"]] == [fires[1].isoformat()]
    assert report["gap_window"] == {
        "since": since.isoformat(), "until": (since + timedelta(days=1)).isoformat(), "expected": 4,
        "schedule": operator.schedule_text, "written_schedule": "H H/6 * * *", "time_zone": "UTC",
    }
    text = run_cli(args, dsn=dsn)
    assert text.code == 1, text.stderr
    assert f"schedule: {operator.schedule_text} (H resolved from H H/6 * * *) in UTC" in text.stdout
    assert f"no run for {fires[1].isoformat()}" in text.stdout
