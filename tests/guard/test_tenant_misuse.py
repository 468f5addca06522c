"""Tenants who misbehave, on a real PostgreSQL: look-alike role names, text and calls
without bound, locks on the guard's tables and on the migration's old advisory key, an
open fence-check transaction, a grant prefix without its separator (schema version 9).

Roles are cluster-wide, so every name carries a random suffix; the helpers of
test_tenants.py make the owned database and the logins.
"""

from __future__ import annotations

import secrets
import subprocess
import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from guardedcron.contract import (
    EXIT_NOT_ACQUIRED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    SQLSTATE_NOT_GRANTED,
)
from guardedcron.guard import lease as lease_ops
from guardedcron.guard.errors import (
    ARGUMENT_TOO_LONG_SQLSTATE,
    TOO_MANY_CALLS_SQLSTATE,
    BadInput,
    LockNotGranted,
)
from guardedcron.guard.fence import check_fence
from guardedcron.guard.migrations import LATEST_VERSION, MIGRATION_LOCK_KEY
from guardedcron_devenv.postgres import ThrowawayPostgres
from tests.guard.test_tenants import (
    Cluster,
    Login,
    acquire,
    assert_no_password,
    assert_ok,
    grant,
    owned_database,
    sqlstate_of,
)
from tests.support import GUARDEDCRON, run_cli

Connection = psycopg.Connection[tuple[Any, ...]]
STALE_FENCE = "GC001"


def named_login(cluster: Cluster, role: str) -> Login:
    """A LOGIN role with exactly this name (quoted: any case, dots, spaces, digits, unicode)."""
    password = secrets.token_urlsafe(16)
    with psycopg.connect(cluster.admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password))
        )
    return Login(role, password, cluster.dsn_of(role, password))


def schema_version(cluster: Cluster) -> int:
    with psycopg.connect(cluster.admin_dsn) as conn:
        row = conn.execute("SELECT max(version) FROM guardedcron.schema_migrations").fetchone()
    assert row is not None
    return int(row[0])


# --- look-alike role names -----------------------------------------------------------------
def test_a_look_alike_role_name_gets_nothing_of_its_victims_grants(postgres: ThrowawayPostgres) -> None:
    """ "Reports_x" once folded to reports_x's grants, and a role named after reports_x's
    decimal OID was read as that OID: each could end, win and fence the victim's lease."""
    cluster = owned_database(postgres)
    suffix = uuid.uuid4().hex[:8]
    victim = named_login(cluster, f"reports_{suffix}")
    grant(cluster, victim.role, "team-r/")
    taken = acquire(victim.dsn, "team-r/job", "victim-pod", "--slot", "1", "--lease-seconds", "3600")
    assert_ok(taken, victim)
    fence = int(str(taken.json["fence"]))
    with psycopg.connect(cluster.admin_dsn) as conn:
        row = conn.execute("SELECT oid FROM pg_roles WHERE rolname = %s", (victim.role,)).fetchone()
    assert row is not None
    look_alikes = [
        named_login(cluster, f"Reports_{suffix}"),
        named_login(cluster, f"REPORTS_{suffix}"),
        named_login(cluster, str(row[0])),  # the victim's OID, in decimal
    ]
    for number, attacker in enumerate(look_alikes):  # each a tenant with locks of its own
        grant(cluster, attacker.role, f"mine-{number}/")
    lock = "team-r/job"
    for attacker in look_alikes:
        with psycopg.connect(attacker.dsn, autocommit=True) as conn:
            with pytest.raises(LockNotGranted, match=f'role "{attacker.role}"'):
                lease_ops.acquire(conn, lease_ops.AcquireRequest(lock, "thief", 30, slot=2))
            with pytest.raises(LockNotGranted), conn.transaction():
                check_fence(conn, lock, fence)
            assert conn.execute("SELECT count(*) FROM guardedcron.runs").fetchone() == (0,)
        for statement, arguments in [
            (
                "SELECT * FROM guardedcron.release_v2(%s, 'victim-pod', %s, 'failed', 'ended by a thief')",
                (lock, fence),
            ),
            ("SELECT * FROM guardedcron.renew_v2(%s, 'victim-pod', %s, 1)", (lock, fence)),
            ("SELECT guardedcron.mark_lost_v1(%s, 'victim-pod', %s, 'forged')", (lock, fence)),
            ("SELECT guardedcron.mark_abandoned_v1(%s)", (lock,)),
            ("SELECT guardedcron.record_skip_v1(%s, 'thief', 3, 'x')", (lock,)),
            ("SELECT guardedcron.check_grant_v1(%s)", (lock,)),
        ]:
            assert sqlstate_of(attacker.dsn, statement, arguments) == SQLSTATE_NOT_GRANTED, (
                attacker,
                statement,
            )
        assert_no_password(acquire(attacker.dsn, lock, "thief"), attacker)
    with psycopg.connect(cluster.admin_dsn) as conn:
        lease = conn.execute(
            "SELECT holder, fence, locked_until > clock_timestamp() + interval '3000 s', released_at"
            "  FROM guardedcron.leases"
        ).fetchall()
        runs = conn.execute("SELECT holder, outcome FROM guardedcron.runs").fetchall()
    assert lease == [("victim-pod", fence, True, None)]
    assert runs == [("victim-pod", "running")]


ODD_NAMES = ["Reports_{}", "team.b_{}", "team b_{}", 'say "hi"_{}', "équipe_Ü_{}", "42_{}", "x-{}"]


def test_roles_whose_names_are_not_plain_identifiers_use_their_own_grants(
    postgres: ThrowawayPostgres,
) -> None:
    """Every one of these exited 70 on its own granted lock: its name did not parse as a role."""
    cluster = owned_database(postgres)
    suffix = uuid.uuid4().hex[:8]
    odd = [named_login(cluster, name.format(suffix)) for name in ODD_NAMES]
    for number, login in enumerate(odd):
        listed = grant(cluster, login.role, f"odd-{number}/")
        assert listed.json["role"] == login.role
    for number, login in enumerate(odd):
        lock = f"odd-{number}/job"
        won = acquire(login.dsn, lock, "pod")
        assert_ok(won, login)
        fence = int(str(won.json["fence"]))
        with psycopg.connect(login.dsn) as conn:
            with conn.transaction():
                check_fence(conn, lock, fence)
            assert conn.execute("SELECT count(*) FROM guardedcron.runs").fetchone() == (1,)
            # Another's prefix stays another's.
            with pytest.raises(LockNotGranted, match=f'role "{login.role}"'):
                lease_ops.renew(conn, f"odd-{(number + 1) % len(odd)}/job", "pod", fence, 30)
        assert_ok(
            run_cli(["release", "--lock", lock, "--holder", "pod", "--fence", str(fence)], dsn=login.dsn),
            login,
        )
        revoked = run_cli(["db", "revoke", "--role", login.role, "--every-grant"], dsn=cluster.owner.dsn)
        assert_ok(revoked, cluster.owner)
        assert sqlstate_of(login.dsn, "SELECT guardedcron.check_grant_v1(%s)", (lock,)) is not None


# --- text and calls without bound ------------------------------------------------------------
@pytest.fixture
def tenant(postgres: ThrowawayPostgres) -> tuple[Cluster, Login]:
    cluster = owned_database(postgres)
    a = cluster.login("tenant_a")
    grant(cluster, a.role, "team-a/")
    return cluster, a


def stored(cluster: Cluster) -> tuple[int, int, int, int]:
    """Rows of leases, runs and slot_claims, and the bytes of text they hold."""
    with psycopg.connect(cluster.admin_dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM guardedcron.leases), (SELECT count(*) FROM guardedcron.runs),"
            "       (SELECT count(*) FROM guardedcron.slot_claims),"
            "       (SELECT coalesce(sum(octet_length(lock_name) + octet_length(holder)"
            "                            + octet_length(reason)), 0) FROM guardedcron.runs)"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2]), int(row[3])


def test_every_text_argument_of_the_entry_points_is_bounded(tenant: tuple[Cluster, Login]) -> None:
    cluster, a = tenant
    won = acquire(a.dsn, "team-a/job", "pod", "--lease-seconds", "3600")
    assert_ok(won, a)
    fence = int(str(won.json["fence"]))
    before = stored(cluster)
    long_lock = "team-a/" + "x" * 247  # 254 characters
    huge = "team-a/" + "é" * (4 * 1024 * 1024)  # 8 MB of UTF-8
    long_holder = "h" * 254
    long_reason = "r" * 4097
    calls = [
        ("SELECT * FROM guardedcron.acquire_v2(%s, 'pod-2', 30, 0, NULL, 90, 10000)", (long_lock,)),
        ("SELECT * FROM guardedcron.acquire_v2(%s, 'pod-2', 30, 0, NULL, 90, 10000)", (huge,)),
        ("SELECT * FROM guardedcron.acquire_v1(%s, 'pod-2', 30, 0, NULL, 90, 10000)", (long_lock,)),
        ("SELECT * FROM guardedcron.acquire_v2('team-a/new', %s, 30, 0, NULL, 90, 10000)", (long_holder,)),
        ("SELECT * FROM guardedcron.acquire_v2('team-a/job', %s, 30, 0, NULL, 90, 10000)", (huge,)),
        ("SELECT * FROM guardedcron.renew_v2(%s, 'pod', %s, 30)", (long_lock, fence)),
        ("SELECT * FROM guardedcron.renew_v2('team-a/job', %s, %s, 30)", (long_holder, fence)),
        ("SELECT * FROM guardedcron.release_v2('team-a/job', 'pod', %s, 'failed', %s)", (fence, long_reason)),
        ("SELECT * FROM guardedcron.release_v1('team-a/job', 'pod', 'failed', %s)", (huge,)),
        ("SELECT guardedcron.record_skip_v1('team-a/job', 'pod-2', NULL, %s)", (huge,)),
        ("SELECT guardedcron.record_skip_v1('team-a/job', %s, NULL, 'x')", (long_holder,)),
        ("SELECT guardedcron.record_skip_v1(%s, 'pod-2', NULL, 'x')", (huge,)),
        ("SELECT guardedcron.mark_lost_v1('team-a/job', 'pod', %s, %s)", (fence, long_reason)),
        ("SELECT guardedcron.mark_abandoned_v1(%s)", (long_lock,)),
        ("SELECT guardedcron.check_fence(%s, 1)", (long_lock,)),
    ]
    for statement, arguments in calls:
        with psycopg.connect(a.dsn, autocommit=True) as conn, pytest.raises(psycopg.Error) as refused:
            conn.execute(statement, arguments)
        assert refused.value.sqlstate == ARGUMENT_TOO_LONG_SQLSTATE, statement
        message = str(refused.value.diag.message_primary)
        assert "at most" in message and len(message) < 200, message  # the text is never echoed
    assert stored(cluster) == before
    # At the bounds, everything works as before.
    longest = "team-a/" + "y" * 246
    with psycopg.connect(a.dsn, autocommit=True) as conn:
        result = lease_ops.acquire(conn, lease_ops.AcquireRequest(longest, "z" * 253, 30))
        assert result.acquired
        assert lease_ops.release(conn, longest, "z" * 253, result.fence, "failed", "r" * 4096).ok
        # The library says it as bad input (the CLI's exit 64), naming the bound only.
        with pytest.raises(BadInput, match="at most 4096"):
            lease_ops.release(conn, "team-a/job", "pod", fence, "failed", long_reason)
        with pytest.raises(BadInput, match="at most 253"):
            lease_ops.acquire(conn, lease_ops.AcquireRequest(long_lock, "pod-2", 30))


def test_one_statement_cannot_add_a_row_per_row_of_a_query(tenant: tuple[Cluster, Login]) -> None:
    """A set-returning query called the entry points once per row: 200,000 history rows or
    20,000 lease rows in one statement. Past 4 writing calls a transaction is refused whole."""
    cluster, a = tenant
    won = acquire(a.dsn, "team-a/job", "pod", "--lease-seconds", "3600")
    assert_ok(won, a)
    fence = int(str(won.json["fence"]))
    before = stored(cluster)
    bulk = [
        "SELECT guardedcron.record_skip_v1('team-a/job', 'h', g, 'r') FROM generate_series(1, 1000) g",
        "SELECT (guardedcron.acquire_v2('team-a/' || g, 'h', 30, 0, g, 90, 10000)).fence"
        "  FROM generate_series(1, 1000) g",
        "SELECT (guardedcron.acquire_v1('team-a/job', 'h' || g, 30, 0, g, 90, 10000)).fence"
        "  FROM generate_series(1, 1000) g",
        f"SELECT guardedcron.mark_lost_v1('team-a/job', 'pod', {fence}, 'r' || g)"
        "  FROM generate_series(1, 100) g",
        f"SELECT (guardedcron.renew_v2('team-a/job', 'pod', {fence}, 30)).renewed"
        "  FROM generate_series(1, 100) g",
        # A PL/pgSQL loop is one transaction too.
        "DO $$ BEGIN FOR i IN 1..100 LOOP"
        " PERFORM guardedcron.record_skip_v1('team-a/job', 'h', i, 'r'); END LOOP; END $$",
    ]
    for statement in bulk:
        started = time.monotonic()
        assert sqlstate_of(a.dsn, statement) == TOO_MANY_CALLS_SQLSTATE, statement
        assert time.monotonic() - started < 5
    assert stored(cluster) == before
    # A handful in one transaction is fine: a fence check, a renewal and a release.
    with psycopg.connect(a.dsn) as conn, conn.transaction():
        check_fence(conn, "team-a/job", fence)
        assert lease_ops.renew(conn, "team-a/job", "pod", fence, 30).ok
        conn.execute("SELECT guardedcron.record_skip_v1('team-a/job', 'h', 1, 'r')")
        assert lease_ops.release(conn, "team-a/job", "pod", fence).ok
    # And one call per transaction is never counted, however many transactions.
    with psycopg.connect(a.dsn, autocommit=True) as conn:
        for number in range(8):
            conn.execute("SELECT guardedcron.record_skip_v1('team-a/job', 'h', %s, 'r')", (number,))
    assert stored(cluster)[1] == before[1] + 1 + 8


def age_lock(cluster: Cluster, lock: str, days: int) -> None:
    """Move everything of `lock` `days` days into the past, as if nobody had used it since."""
    shift = f"interval '{days} days'"
    with psycopg.connect(cluster.admin_dsn) as conn:
        conn.execute(
            f"UPDATE guardedcron.leases SET acquired_at = acquired_at - {shift},"
            f" locked_until = locked_until - {shift}, min_hold_until = min_hold_until - {shift},"
            f" released_at = released_at - {shift} WHERE lock_name = %s",
            (lock,),
        )
        if conn.execute("SELECT to_regclass('guardedcron.leases_reclaim_after')").fetchone() != (None,):
            conn.execute(
                f"UPDATE guardedcron.leases SET reclaim_after = reclaim_after - {shift} WHERE lock_name = %s",
                (lock,),
            )
        conn.execute(
            f"UPDATE guardedcron.runs SET started_at = started_at - {shift},"
            f" finished_at = finished_at - {shift} WHERE lock_name = %s",
            (lock,),
        )
        conn.execute(
            f"UPDATE guardedcron.slot_claims SET claimed_at = claimed_at - {shift} WHERE lock_name = %s",
            (lock,),
        )


def rows_of(cluster: Cluster, lock: str) -> tuple[int, int, int]:
    with psycopg.connect(cluster.admin_dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM guardedcron.leases WHERE lock_name = %(l)s),"
            " (SELECT count(*) FROM guardedcron.runs WHERE lock_name = %(l)s),"
            " (SELECT count(*) FROM guardedcron.slot_claims WHERE lock_name = %(l)s)",
            {"l": lock},
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def test_a_lock_nobody_uses_past_its_retention_is_reclaimed_in_bounded_batches(
    tenant: tuple[Cluster, Login],
) -> None:
    cluster, a = tenant
    dead, kept, busy = "team-a/dead", "team-a/kept", "team-a/other"
    # The dead lock: 20 runs (10 wins with their slots, 10 losses), kept 2 days.
    fences = []
    with psycopg.connect(a.dsn, autocommit=True) as conn:
        for slot in range(10):
            won = lease_ops.acquire(
                conn, lease_ops.AcquireRequest(dead, f"p{slot}", 30, slot=slot, retain_days=2)
            )
            assert won.acquired
            fences.append(won.fence)
            assert not lease_ops.acquire(
                conn, lease_ops.AcquireRequest(dead, "loser", 30, slot=slot)
            ).acquired
            assert lease_ops.release(conn, dead, f"p{slot}", won.fence).ok
        kept_won = lease_ops.acquire(conn, lease_ops.AcquireRequest(kept, "k", 30, retain_days=30))
        assert kept_won.acquired
    assert rows_of(cluster, dead) == (1, 20, 10)
    age_lock(cluster, dead, 3)  # past its 2 days
    age_lock(cluster, kept, 3)  # within its 30
    with psycopg.connect(a.dsn, autocommit=True) as conn:

        def win_another() -> None:
            holder = uuid.uuid4().hex
            result = lease_ops.acquire(conn, lease_ops.AcquireRequest(busy, holder, 30))
            assert result.acquired
            assert lease_ops.release(conn, busy, holder, result.fence).ok

        win_another()  # one win reclaims at most 16 runs and 16 claims
        assert rows_of(cluster, dead) == (1, 4, 0)
        win_another()
        assert rows_of(cluster, dead) == (0, 0, 0)
        for _ in range(3):
            win_another()
        assert rows_of(cluster, kept) == (1, 1, 0)
        # A stale holder of the reclaimed lock fails its fence check; the lock starts again
        # with a fence above every one it had.
        with pytest.raises(psycopg.Error) as stale, conn.transaction():
            conn.execute("SELECT guardedcron.check_fence(%s, %s)", (dead, fences[-1]))
        assert stale.value.sqlstate == STALE_FENCE
        again = lease_ops.acquire(conn, lease_ops.AcquireRequest(dead, "new", 30))
        assert again.acquired and again.fence > max(fences)


# --- locks on the guard's tables, the migration's old advisory key -------------------------
def test_a_tenant_holding_the_old_migration_key_does_not_hold_up_db_migrate(
    postgres: ThrowawayPostgres,
) -> None:
    cluster = owned_database(postgres, versions=LATEST_VERSION - 1)
    tenant_login = cluster.login("tenant_key")
    with psycopg.connect(tenant_login.dsn, autocommit=True) as blocker:
        blocker.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        for _ in range(2):  # one migration to apply, then none
            started = time.monotonic()
            migrated = run_cli(["db", "migrate"], dsn=cluster.owner.dsn, timeout=20)
            assert_ok(migrated, cluster.owner)
            assert time.monotonic() - started < 10
        assert schema_version(cluster) == LATEST_VERSION


def test_a_tenant_locking_the_runs_table_stalls_neither_db_migrate_nor_the_fleet(
    postgres: ThrowawayPostgres,
) -> None:
    """Version 6's DDL needs ACCESS EXCLUSIVE on runs; a tenant's LOCK TABLE (its SELECT
    allows ACCESS SHARE) made the migration wait, and every acquisition queued behind it."""
    cluster = owned_database(postgres, versions=5)
    a = cluster.login("tenant_a")
    b = cluster.login("tenant_b")
    grant(cluster, a.role, "team-a/")
    grant(cluster, b.role, "team-b/")
    blocker = psycopg.connect(a.dsn)
    try:
        blocker.execute("LOCK TABLE guardedcron.runs IN ACCESS SHARE MODE")
        migrate = subprocess.Popen(
            [GUARDEDCRON, "db", "migrate"],
            env={**subprocess_env(), "GUARDEDCRON_DSN": cluster.owner.dsn},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(0.5)
            # The fleet goes on meanwhile: each acquisition waits at most the migration's
            # lock timeout (1 s) behind it.
            for number in range(4):
                started = time.monotonic()
                answer = acquire(b.dsn, f"team-b/job-{number}", "pod", timeout=10)
                assert answer.code == EXIT_OK, answer
                assert time.monotonic() - started < 4, answer
            out, err = migrate.communicate(timeout=20)
        finally:
            if migrate.poll() is None:
                migrate.kill()
                migrate.communicate()
        assert migrate.returncode == EXIT_UNAVAILABLE, err
        assert (
            f'role "{a.role}" (pid {blocker.info.backend_pid}, AccessShareLock on guardedcron.runs)' in err
        ), err
        assert "nothing was changed" in err and "Traceback" not in err
        assert cluster.owner.password not in out + err
        assert schema_version(cluster) == 5  # nothing half-applied
    finally:
        blocker.rollback()
        blocker.close()
    migrated = run_cli(["db", "migrate"], dsn=cluster.owner.dsn)
    assert_ok(migrated, cluster.owner)
    assert migrated.json["applied"] == list(range(6, LATEST_VERSION + 1))


def subprocess_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "GUARDEDCRON_DSN"}


# --- an open fence check, a prefix without its separator --------------------------------------
def test_an_open_fence_check_delays_a_takeover_by_at_most_the_lock_timeout(
    tenant: tuple[Cluster, Login],
) -> None:
    """The stale holder's transaction keeps its KEY SHARE lock on the lease row; the next
    acquirer waits acquire_v2's lock_timeout (5 s), then skips (row-busy), never hangs."""
    _, a = tenant
    won = acquire(a.dsn, "team-a/job", "old", "--lease-seconds", "1")
    assert_ok(won, a)
    with psycopg.connect(a.dsn) as holder:
        check_fence(holder, "team-a/job", int(str(won.json["fence"])))  # the transaction stays open
        time.sleep(1.2)  # the lease has run out
        started = time.monotonic()
        takeover = acquire(a.dsn, "team-a/job", "new", timeout=30)
        took = time.monotonic() - started
        holder.rollback()
    assert takeover.code == EXIT_NOT_ACQUIRED, takeover
    assert takeover.json["reason"] == "row-busy"
    assert 4.5 < took < 5 + 3, took
    assert_ok(acquire(a.dsn, "team-a/job", "new"), a)  # once the transaction ends


def test_a_lock_prefix_must_end_with_its_separator(tenant: tuple[Cluster, Login]) -> None:
    cluster, a = tenant
    owner = cluster.owner.dsn
    refused = run_cli(["db", "grant", "--role", a.role, "--lock-prefix", "team-b"], dsn=owner)
    assert refused.code == EXIT_USAGE, refused
    assert "--lock-prefix team-b/" in refused.stderr and "Traceback" not in refused.stderr
    listed = run_cli(["db", "grants", "--role", a.role], dsn=owner)
    assert [g["lock_prefix"] for g in listed.json["grants"]] == ["team-a/"]  # type: ignore[index, union-attr]
    assert acquire(a.dsn, "team-bb/job", "pod").code != EXIT_OK
    # A namespace's prefix, a shared lock by name and every shared lock are fine.
    assert_ok(
        run_cli(
            [
                "db",
                "grant",
                "--role",
                a.role,
                "--lock-prefix",
                "team-c/",
                "--lock-prefix",
                "shared:ledger",
                "--lock-prefix",
                "shared:",
            ],
            dsn=owner,
        ),
        cluster.owner,
    )
