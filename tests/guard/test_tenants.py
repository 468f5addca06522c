"""Least privilege in PostgreSQL (schema version 4, issue 11): real roles, created here with
their own passwords, each connecting with its own DSN.

The schema is owned by a dedicated (non-superuser) owner role, as docs/design.md advises.
Tenant A is granted "team-a/", tenant B "team-b/". Every refusal must be the contract's
exit code (77) through the CLI, name the lock and the role, and never show a password.
"""

from __future__ import annotations

import secrets
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from guardedcron.contract import EXIT_NOT_ACQUIRED, EXIT_NOT_GRANTED, EXIT_OK, SQLSTATE_NOT_GRANTED
from guardedcron.guard import lease as lease_ops
from guardedcron.guard.connection import connect
from guardedcron.guard.errors import LockNotGranted
from guardedcron.guard.fence import check_fence
from guardedcron.guard.migrations import LATEST_VERSION
from guardedcron_devenv.pgbouncer import PgBouncer
from guardedcron_devenv.postgres import ThrowawayPostgres
from tests.support import GUARDEDCRON, CliResult, run_cli
from tests.support.schema import apply_up_to

Connection = psycopg.Connection[tuple[Any, ...]]
INSUFFICIENT_PRIVILEGE = "42501"
TABLES = ("leases", "runs", "slot_claims", "lock_grants", "schema_migrations")


@dataclass(frozen=True)
class Login:
    role: str
    password: str
    dsn: str


@dataclass(frozen=True)
class Cluster:
    postgres: ThrowawayPostgres
    database: str
    admin_dsn: str  # the superuser: plays the DBA, and checks what really happened
    owner: Login

    def login(self, prefix: str, *, extra: str = "") -> Login:
        """A new LOGIN role with a password of its own (roles are cluster-wide: unique names)."""
        role = f"{prefix}_{uuid.uuid4().hex[:8]}"
        password = secrets.token_urlsafe(16)
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}' {extra}")
        return Login(role, password, self.dsn_of(role, password))

    def dsn_of(self, role: str, password: str) -> str:
        return (
            f"postgresql://{quote(role)}:{quote(password, safe='')}@127.0.0.1:{self.postgres.port}/"
            f"{self.database}"
        )


def owned_database(postgres: ThrowawayPostgres, versions: int | None = None) -> Cluster:
    """A fresh database owned by a fresh non-superuser owner role, migrated by that role
    (all of it through the CLI, or up to `versions` by hand to play an older deployment)."""
    name = f"g_{uuid.uuid4().hex[:12]}"
    admin_dsn = postgres.create_database(name)
    probe = Cluster(postgres, name, admin_dsn, Login("", "", ""))
    owner = probe.login("owner")
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" OWNER TO {owner.role}')
    cluster = Cluster(postgres, name, admin_dsn, owner)
    if versions is None:
        assert_ok(run_cli(["db", "migrate"], dsn=owner.dsn), owner)
    else:
        apply_up_to(owner.dsn, versions)
    return cluster


def assert_ok(result: CliResult, *logins: Login) -> None:
    assert result.code == EXIT_OK, result
    assert_no_password(result, *logins)


def assert_no_password(result: CliResult, *logins: Login) -> None:
    for login in logins:
        assert login.password not in result.stdout + result.stderr


def assert_refused(result: CliResult, lock: str, login: Login) -> None:
    """Exit 77, one line on stderr naming the lock and the role, and no password."""
    assert result.code == EXIT_NOT_GRANTED, result
    lines = result.stderr.strip().splitlines()
    refusal = [line for line in lines if "not granted" in line]
    assert len(refusal) == 1, result.stderr
    assert f'"{lock}"' in refusal[0] and f'"{login.role}"' in refusal[0], refusal[0]
    assert "Traceback" not in result.stderr
    assert_no_password(result, login)


def grant(cluster: Cluster, role: str, *prefixes: str) -> CliResult:
    options = [a for p in prefixes for a in ("--lock-prefix", p)] or ["--all-locks"]
    result = run_cli(["db", "grant", "--role", role, *options], dsn=cluster.owner.dsn)
    assert_ok(result, cluster.owner)
    return result


def acquire(dsn: str, lock: str, holder: str, *extra: str, timeout: float = 60) -> CliResult:
    arguments = ["acquire", "--lock", lock, "--holder", holder, "--lease-seconds", "30", *extra]
    return run_cli(arguments, dsn=dsn, timeout=timeout)


def sqlstate_of(dsn: str, statement: str, arguments: tuple[Any, ...] = ()) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            with conn.transaction():
                conn.execute(statement.encode(), arguments)
        except psycopg.Error as exc:
            return exc.sqlstate
    return None


@pytest.fixture
def tenants(postgres: ThrowawayPostgres) -> Iterator[tuple[Cluster, Login, Login]]:
    cluster = owned_database(postgres)
    a = cluster.login("tenant_a")
    b = cluster.login("tenant_b")
    grant(cluster, a.role, "team-a/")
    grant(cluster, b.role, "team-b/")
    yield cluster, a, b


# --- a granted tenant works, and can write nothing -------------------------------------------
def test_a_granted_tenant_works_normally_through_every_command(tenants: tuple[Cluster, Login, Login]) -> None:
    _, a, _ = tenants
    first = acquire(a.dsn, "team-a/nightly", "pod-1", "--slot", "100")
    assert_ok(first, a)
    fence = str(first.json["fence"])
    assert acquire(a.dsn, "team-a/nightly", "pod-2", "--slot", "100").code == EXIT_NOT_ACQUIRED
    renew = ["--lock", "team-a/nightly", "--holder", "pod-1", "--fence", fence]
    assert_ok(run_cli(["renew", *renew, "--lease-seconds", "30"], dsn=a.dsn), a)
    with psycopg.connect(a.dsn) as conn, conn.transaction():
        check_fence(conn, "team-a/nightly", int(fence))
    # The keeper renews with the tenant's DSN and releases on SIGTERM.
    keeper = subprocess.Popen(
        [GUARDEDCRON, "keep", *renew, "--lease-seconds", "3", "--dsn", a.dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.5)
    keeper.send_signal(signal.SIGTERM)
    _, keeper_err = keeper.communicate(timeout=10)
    assert keeper.returncode == EXIT_OK, keeper_err
    assert "released lock team-a/nightly" in keeper_err
    history = run_cli(["runs", "--lock", "team-a/nightly", "--json", "--mark-abandoned"], dsn=a.dsn)
    assert_ok(history, a)
    outcomes = [run["outcome"] for run in history.json["runs"]]  # type: ignore[index, union-attr]
    assert outcomes == ["skipped", "finished"]


def test_a_tenant_can_write_no_table_and_cannot_forge_a_fence(tenants: tuple[Cluster, Login, Login]) -> None:
    cluster, a, b = tenants
    assert_ok(acquire(b.dsn, "team-b/job", "b-pod"), b)
    assert_ok(acquire(a.dsn, "team-a/job", "a-pod"), a)  # a works through the functions...
    writes = [
        "INSERT INTO guardedcron.leases VALUES ('team-a/job', 'me', 999, now(), 'infinity', now())",
        "UPDATE guardedcron.leases SET fence = fence - 1, locked_until = 'infinity'",
        "DELETE FROM guardedcron.leases",
        "INSERT INTO guardedcron.runs (lock_name, holder, started_at, outcome)"
        " VALUES ('team-a/job', 'me', now(), 'running')",
        "UPDATE guardedcron.runs SET fence = fence + 1000",
        "DELETE FROM guardedcron.runs",
        "INSERT INTO guardedcron.slot_claims VALUES ('team-b/job', 1, 'me', 1, now())",
        "UPDATE guardedcron.slot_claims SET slot = slot + 1",
        "DELETE FROM guardedcron.slot_claims",
        f"INSERT INTO guardedcron.lock_grants (role, prefix) SELECT oid, '' FROM pg_roles"
        f" WHERE rolname = '{a.role}'",
        "UPDATE guardedcron.lock_grants SET prefix = ''",
        "DELETE FROM guardedcron.lock_grants",
        "INSERT INTO guardedcron.schema_migrations (version, name) VALUES (99, 'x')",
        "DELETE FROM guardedcron.schema_migrations",
        *(f"TRUNCATE guardedcron.{table}" for table in TABLES),
        "SELECT * FROM guardedcron.leases",
        "SELECT * FROM guardedcron.slot_claims",
        "SELECT * FROM guardedcron.lock_grants",
        # ...and no path to a fence but acquiring: the sequence and the helpers are the owner's.
        "SELECT setval('guardedcron.fences', 1)",
        "SELECT nextval('guardedcron.fences')",
        "ALTER SEQUENCE guardedcron.fences RESTART WITH 1",
        "SELECT * FROM guardedcron._renew_v2('team-b/job', 'b-pod', 1, 30)",
        "SELECT guardedcron._record_skip('team-b/job', 'a', NULL, 'x', now())",
        "SELECT guardedcron._require_grant('team-b/job')",
        f"SELECT guardedcron._grant_runtime_privileges("
        f"(SELECT oid FROM pg_roles WHERE rolname = '{a.role}'))",
        "CREATE TABLE guardedcron.mine (x int)",
        "CREATE FUNCTION guardedcron.starts_with(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true'",
        "ALTER TABLE guardedcron.runs DISABLE ROW LEVEL SECURITY",
        "DROP POLICY runs_of_granted_locks ON guardedcron.runs",
    ]
    refused = {statement: sqlstate_of(a.dsn, statement) for statement in writes}
    assert refused == dict.fromkeys(writes, INSUFFICIENT_PRIVILEGE)
    # The tenant cannot grant itself more, nor migrate the schema.
    assert run_cli(["db", "grant", "--role", a.role, "--all-locks"], dsn=a.dsn).code == EXIT_NOT_GRANTED
    migrate = run_cli(["db", "migrate"], dsn=a.dsn)
    assert migrate.code == EXIT_NOT_GRANTED, migrate
    assert f'role "{a.role}" may not change the guardedcron schema' in migrate.stderr
    assert f'its owner "{cluster.owner.role}"' in migrate.stderr
    with psycopg.connect(cluster.admin_dsn) as conn:
        public = conn.execute(
            "SELECT p.oid::regprocedure::text"
            "  FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a"
            " WHERE p.pronamespace = 'guardedcron'::regnamespace AND a.grantee = 0"
        ).fetchall()
        assert public == []  # no function is PUBLIC's
        rows = conn.execute("SELECT lock_name, holder FROM guardedcron.leases ORDER BY 1").fetchall()
        fences = conn.execute("SELECT fence FROM guardedcron.leases ORDER BY fence").fetchall()
    assert rows == [("team-a/job", "a-pod"), ("team-b/job", "b-pod")]
    assert [f for (f,) in fences] == [1, 2]


# --- outside its prefixes, every function refuses ------------------------------------------
def test_a_lock_outside_the_prefix_is_refused_by_every_command(tenants: tuple[Cluster, Login, Login]) -> None:
    cluster, a, b = tenants
    # A lease that outlives the test, however loaded the machine.
    taken = acquire(b.dsn, "team-b/job", "b-pod", "--slot", "7", "--lease-seconds", "3600")
    assert_ok(taken, b)
    fence = str(taken.json["fence"])
    lock = "team-b/job"
    holder = ["--lock", lock, "--holder", "b-pod", "--fence", fence]
    assert_refused(acquire(a.dsn, lock, "a-pod", "--slot", "7"), lock, a)
    # Prefixes are prefixes of the whole name: "team-a/" does not cover "team-ab/..." nor "team-a".
    assert_refused(acquire(a.dsn, "team-ab/x", "a-pod"), "team-ab/x", a)
    assert_refused(acquire(a.dsn, "team-a", "a-pod"), "team-a", a)
    assert_refused(run_cli(["renew", *holder, "--lease-seconds", "30"], dsn=a.dsn), lock, a)
    assert_refused(run_cli(["release", *holder], dsn=a.dsn), lock, a)
    assert_refused(run_cli(["keep", *holder, "--lease-seconds", "30"], dsn=a.dsn, timeout=20), lock, a)
    assert_refused(run_cli(["runs", "--lock", lock], dsn=a.dsn), lock, a)
    assert_refused(run_cli(["runs", "--lock", lock, "--mark-abandoned", "--overlaps"], dsn=a.dsn), lock, a)
    with psycopg.connect(a.dsn, autocommit=True) as conn:
        refused = f'"{lock}" is not granted to role "{a.role}"'
        with pytest.raises(LockNotGranted, match=refused), conn.transaction():
            check_fence(conn, lock, int(fence))
        with pytest.raises(LockNotGranted):
            lease_ops.mark_lost(conn, lock, "b-pod", int(fence), "forged loss")
        # Row-level security: a direct read shows none of B's history.
        assert conn.execute("SELECT count(*) FROM guardedcron.runs").fetchone() == (0,)
    for statement, arguments in [
        ("SELECT guardedcron.check_fence(%s, %s)", (lock, int(fence))),
        ("SELECT * FROM guardedcron.acquire_v1(%s, 'a', 30, 0, NULL, 90, 10000)", (lock,)),
        ("SELECT * FROM guardedcron.renew_v1(%s, 'b-pod', %s, 30)", (lock, int(fence))),
        ("SELECT * FROM guardedcron.release_v1(%s, 'b-pod', 'finished', '')", (lock,)),
        ("SELECT * FROM guardedcron.release_v2(%s, 'b-pod', %s, 'finished', '')", (lock, int(fence))),
        ("SELECT guardedcron.mark_lost_v1(%s, 'b-pod', %s, '')", (lock, int(fence))),
        ("SELECT guardedcron.mark_abandoned_v1(%s)", (lock,)),
        ("SELECT guardedcron.record_skip_v1(%s, 'a', NULL, 'x')", (lock,)),
        ("SELECT guardedcron.check_grant_v1(%s)", (lock,)),
    ]:
        assert sqlstate_of(a.dsn, statement, arguments) == SQLSTATE_NOT_GRANTED, statement
    # B's lease, run and slot are as B left them.
    with psycopg.connect(cluster.admin_dsn) as conn:
        lease = conn.execute(
            "SELECT holder, fence, locked_until > clock_timestamp(), released_at FROM guardedcron.leases"
        ).fetchall()
        runs = conn.execute("SELECT lock_name, holder, outcome FROM guardedcron.runs").fetchall()
    assert lease == [("b-pod", int(fence), True, None)]
    assert runs == [(lock, "b-pod", "running")]


# --- roles without a grant, grants by membership, SET ROLE ----------------------------------
def test_a_role_without_a_grant_is_refused_until_the_admin_grants_it(postgres: ThrowawayPostgres) -> None:
    cluster = owned_database(postgres)
    stranger = cluster.login("stranger")
    assert_refused(acquire(stranger.dsn, "team-a/job", "s"), "team-a/job", stranger)
    assert_refused(run_cli(["runs", "--lock", "team-a/job"], dsn=stranger.dsn), "team-a/job", stranger)
    # The all-locks grant is the admin's explicit choice of the schema-3 behaviour...
    granted = grant(cluster, stranger.role)
    assert granted.json["granted"] == [""]
    assert_ok(acquire(stranger.dsn, "anything/at-all", "s"), stranger)
    # ...and revoking the last grant takes the schema away again.
    assert_ok(run_cli(["db", "revoke", "--role", stranger.role, "--all-locks"], dsn=cluster.owner.dsn))
    assert_refused(acquire(stranger.dsn, "anything/else", "s"), "anything/else", stranger)
    assert sqlstate_of(stranger.dsn, "SELECT 1 FROM guardedcron.runs") == INSUFFICIENT_PRIVILEGE


def test_grants_follow_inheritance_and_set_role_adds_nothing(tenants: tuple[Cluster, Login, Login]) -> None:
    cluster, a, b = tenants
    # A login role that inherits tenant A's privileges has A's locks.
    member = cluster.login("member", extra=f"IN ROLE {a.role}")
    assert_ok(acquire(member.dsn, "team-a/inherited", "m"), member)
    # A login role that may SET ROLE to B but does not inherit it: session_user decides.
    switcher = cluster.login("switcher", extra=f"NOINHERIT IN ROLE {b.role}")
    with psycopg.connect(switcher.dsn, autocommit=True) as conn:
        conn.execute(f"SET ROLE {b.role}")
        with pytest.raises(LockNotGranted, match=f'role "{switcher.role}"'):
            lease_ops.acquire(conn, lease_ops.AcquireRequest("team-b/job", "x", 30))


def test_db_grant_revoke_and_grants_say_what_they_did(tenants: tuple[Cluster, Login, Login]) -> None:
    cluster, a, _ = tenants
    owner = cluster.owner.dsn
    again = run_cli(
        ["db", "grant", "--role", a.role, "--lock-prefix", "team-a/", "--lock-prefix", "shared:x"], dsn=owner
    )
    assert_ok(again)
    assert again.json["new"] == ["shared:x"]
    listed = run_cli(["db", "grants", "--role", a.role], dsn=owner)
    assert_ok(listed)
    assert [g["lock_prefix"] for g in listed.json["grants"]] == ["shared:x", "team-a/"]  # type: ignore[index, union-attr]
    assert_ok(acquire(a.dsn, "shared:x", "a-pod"), a)
    unknown = run_cli(["db", "revoke", "--role", a.role, "--lock-prefix", "team-z/"], dsn=owner)
    assert unknown.code == 64 and 'no grant for "team-z/"' in unknown.stderr
    nobody = run_cli(["db", "grant", "--role", "no_such_role_here", "--all-locks"], dsn=owner)
    assert nobody.code == 64 and 'no role named "no_such_role_here"' in nobody.stderr
    assert run_cli(["db", "grant", "--role", a.role, "--lock-prefix", ""], dsn=owner).code == 64
    assert_ok(run_cli(["db", "revoke", "--role", a.role, "--lock-prefix", "shared:x"], dsn=owner))
    assert_refused(acquire(a.dsn, "shared:x", "a-pod"), "shared:x", a)
    assert_ok(acquire(a.dsn, "team-a/still", "a-pod"), a)


# --- upgrading a schema-3 deployment -------------------------------------------------------
def test_migrating_from_schema_3_keeps_deployed_guards_working_and_says_so(
    postgres: ThrowawayPostgres,
) -> None:
    cluster = owned_database(postgres, versions=3)
    runtime = cluster.login("runtime")
    reader = cluster.login("reader")
    with psycopg.connect(cluster.owner.dsn, autocommit=True) as conn:
        # What a schema-3 guard needed: its functions ran with the caller's rights.
        conn.execute(f"GRANT USAGE ON SCHEMA guardedcron TO {runtime.role}, {reader.role}")
        conn.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA guardedcron TO {runtime.role}"
        )
        conn.execute(f"GRANT USAGE, UPDATE ON SEQUENCE guardedcron.fences TO {runtime.role}")
        conn.execute(f"GRANT SELECT ON guardedcron.runs TO {reader.role}")
    with psycopg.connect(runtime.dsn, autocommit=True) as conn:
        before = conn.execute(
            "SELECT acquired, fence FROM guardedcron.acquire_v2('any/lock', 'old', 30, 0, NULL, 90, 10000)"
        ).fetchone()
    assert before == (True, 1)

    migrated = run_cli(["db", "migrate"], dsn=cluster.owner.dsn)
    assert_ok(migrated, cluster.owner)
    assert migrated.json["applied"] == list(range(4, LATEST_VERSION + 1))
    assert f"role {runtime.role} could use the schema-3 functions: it keeps every lock" in migrated.stderr
    assert f"role {reader.role} lost its privileges on guardedcron tables" in migrated.stderr
    # The deployed guard keeps its locks, through the functions only.
    assert_ok(acquire(runtime.dsn, "other/lock", "new"), runtime)
    assert sqlstate_of(runtime.dsn, "UPDATE guardedcron.leases SET fence = 0") == INSUFFICIENT_PRIVILEGE
    listed = run_cli(["db", "grants"], dsn=cluster.owner.dsn)
    assert [(g["role"], g["lock_prefix"]) for g in listed.json["grants"]] == [(runtime.role, "")]  # type: ignore[index, union-attr]
    assert "migration 4" in listed.json["grants"][0]["note"]  # type: ignore[index]
    assert_refused(acquire(reader.dsn, "other/lock", "r"), "other/lock", reader)


# --- through a pooler ---------------------------------------------------------------------
def test_a_tenant_through_pgbouncer_in_transaction_mode(tenants: tuple[Cluster, Login, Login]) -> None:
    """The grant check keeps no session state: a tenant's own PgBouncer pool (transaction
    mode, as `pgbouncer.py` sets it up) serves its guard, keeper calls and refusals alike."""
    _, a, _ = tenants
    with PgBouncer(a.dsn) as pooler:
        pooled = pooler.dsn_for(a.dsn)
        won = acquire(pooled, "team-a/pooled", "p1")
        assert_ok(won, a)
        fence = int(str(won.json["fence"]))
        with connect(pooled, 5) as conn:  # the guard's own settings: no prepared statements
            for _ in range(8):  # past psycopg's default prepare threshold
                assert lease_ops.renew(conn, "team-a/pooled", "p1", fence, 30).ok
            with conn.transaction():
                check_fence(conn, "team-a/pooled", fence)
            with pytest.raises(LockNotGranted):
                lease_ops.renew(conn, "team-b/job", "p1", fence, 30)
            assert lease_ops.renew(conn, "team-a/pooled", "p1", fence, 30).ok  # the pool still serves
        assert_refused(acquire(pooled, "team-b/job", "p1"), "team-b/job", a)
        assert_ok(run_cli(["runs", "--lock", "team-a/pooled"], dsn=pooled), a)
        holder = ["--lock", "team-a/pooled", "--holder", "p1", "--fence", str(fence)]
        assert_ok(run_cli(["release", *holder], dsn=pooled), a)
