"""Versioned schema migrations, safe to run from many processes at once, and not to be
held up by tenants.

`CREATE TABLE IF NOT EXISTS` alone races in PostgreSQL (two sessions can both pass the
existence check), so migrations are serialised by one lock: concurrent callers queue, and
each sees what the first applied. The lock is a table lock on `guardedcron.lock_grants`,
which only the schema owner may touch: an advisory key can be taken by any role, so a
tenant holding it stalled every migration. Only before that table exists (no schema yet,
or one older than version 4) is the advisory key used.

Every other lock the migration takes is waited for at most MIGRATION_LOCK_TIMEOUT: its
DDL's ACCESS EXCLUSIVE locks queue behind any reader of the table (a tenant may `LOCK
TABLE guardedcron.runs IN ACCESS SHARE MODE`, its SELECT allows it), and every acquisition
would queue behind the migration for as long as it waited. A migration that cannot get a
lock in time rolls back whole (one transaction), tries again a few times, then fails with
DatabaseUnavailable (exit 69) naming the sessions in its way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

SCHEMA = "guardedcron"
# An arbitrary constant, the same in every version of the tool: the lock before the
# schema (version 4's lock_grants) exists, and the one older versions of the tool take.
MIGRATION_LOCK_KEY = 0x6763_726F_6E5F_6D69  # "gcron_mi"
# How long the migration may keep everyone queued behind one of its lock requests.
MIGRATION_LOCK_TIMEOUT = 1.0
# How long it waits for another migration (the serialising lock).
MIGRATION_QUEUE_TIMEOUT = 15.0
MIGRATION_TRIES = 3
MIGRATION_RETRY_PAUSE = 0.5


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations() -> list[Migration]:
    folder = resources.files("guardedcron.guard").joinpath("sql")
    found = []
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        number, _, rest = entry.name.partition("_")
        found.append(Migration(int(number), rest.removesuffix(".sql"), entry.read_text()))
    return sorted(found, key=lambda m: m.version)


# The schema this tool needs: version 4's grant-checked functions (record_skip_v1,
# check_grant_v1) and the runs policy; version 5's retention in bounded batches (on
# version 4 the same calls work, with the count cut-off walking the history every time);
# version 6's cheaper calls; version 7's losses committed without waiting for a flush;
# version 8's losses that say whether their slot ran; version 9's exact role identity,
# bounded arguments and calls, and reclaimed dead locks; version 10's wins and renewals
# durable whatever the session's synchronous_commit, and fences above every earlier
# timeline's.
LATEST_VERSION = 10
LEAST_PRIVILEGE_VERSION = 4  # from here on, no function is PUBLIC's


def migrate(
    conn: psycopg.Connection[tuple[Any, ...]], on_notice: Callable[[str], None] | None = None
) -> list[Migration]:
    """Apply every migration not yet applied; return the ones this call applied.

    A migration says what it did to existing roles and grants in NOTICEs (version 4 does);
    `on_notice` gets each one's text, so that `db migrate` can print it.
    """
    if on_notice is None:
        return _migrate(conn)
    report = on_notice

    def forward(diagnostic: psycopg.errors.Diagnostic) -> None:
        if diagnostic.message_primary and diagnostic.message_primary.startswith(f"{SCHEMA}: "):
            report(diagnostic.message_primary)

    conn.add_notice_handler(forward)
    try:
        return _migrate(conn)
    finally:
        conn.remove_notice_handler(forward)


def _migrate(conn: psycopg.Connection[tuple[Any, ...]]) -> list[Migration]:
    import psycopg

    try:
        return _apply(conn)
    except psycopg.errors.InsufficientPrivilege:
        from guardedcron.guard.errors import NotPermitted

        row = conn.execute(
            "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = %s", (SCHEMA,)
        ).fetchone()
        who = f'its owner "{row[0]}"' if row else "a role with CREATE on the database"
        raise NotPermitted(
            f'role "{conn.info.user}" may not change the guardedcron schema: run `guardedcron db migrate` '
            f"as {who} or a superuser"
        ) from None


def _apply(conn: psycopg.Connection[tuple[Any, ...]]) -> list[Migration]:
    import psycopg

    from guardedcron.guard.errors import DatabaseUnavailable

    for attempt in range(1, MIGRATION_TRIES + 1):
        try:
            return _apply_once(conn)
        except psycopg.errors.LockNotAvailable:
            # Rolled back whole; nobody queues behind this session any more.
            if attempt == MIGRATION_TRIES:
                in_the_way = _sessions_in_the_way(conn)
                raise DatabaseUnavailable(
                    f"db migrate could not lock the guardedcron schema's tables in {attempt} tries "
                    f"(waiting at most {MIGRATION_LOCK_TIMEOUT:g} s each time, so that guards do not queue "
                    f"behind it); nothing was changed. Holding locks on them: {in_the_way}. "
                    "End those transactions, or run db migrate again when they are over"
                ) from None
            time.sleep(MIGRATION_RETRY_PAUSE * attempt)
    raise AssertionError("unreachable: the last try returns or raises")


def _sessions_in_the_way(conn: psycopg.Connection[tuple[Any, ...]]) -> str:
    """Other sessions holding locks on the schema's tables or the old advisory key, seen in
    two samples a moment apart (a guard's call holds its locks for milliseconds; what is in
    the way holds them across both): role, pid and what they hold. pg_stat_activity shows
    every session's role and pid to every role (not its query or its times)."""
    query = (
        "SELECT a.usename, l.pid, l.mode,"
        "       CASE WHEN l.locktype = 'relation' THEN l.relation::regclass::text ELSE 'the advisory key' END"
        "  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.granted AND l.pid <> pg_backend_pid()"
        "   AND ((l.locktype = 'relation' AND l.database = (SELECT oid FROM pg_database"
        "                                                  WHERE datname = current_database())"
        "         AND l.relation IN (SELECT c.oid FROM pg_class c JOIN pg_namespace n"
        "                              ON n.oid = c.relnamespace WHERE n.nspname = %s))"
        "        OR (l.locktype = 'advisory' AND l.classid::bigint * 4294967296 + l.objid::bigint = %s))"
        " ORDER BY 2, 4"
    )
    arguments = (SCHEMA, MIGRATION_LOCK_KEY)
    first = set(conn.execute(query, arguments).fetchall())
    time.sleep(0.1)
    held = [row for row in conn.execute(query, arguments).fetchall() if row in first]
    if not held:
        return "no session now (the one in the way has ended)"
    return ", ".join(f'role "{role}" (pid {pid}, {mode} on {what})' for role, pid, mode, what in held[:5])


def _serialise(conn: psycopg.Connection[tuple[Any, ...]]) -> None:
    """Queue behind any other migration. SHARE ROW EXCLUSIVE conflicts with itself and
    with `db grant`, not with the grant checks' reads: guards go on meanwhile."""
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{MIGRATION_QUEUE_TIMEOUT * 1000:.0f}ms",))
    row = conn.execute(f"SELECT to_regclass('{SCHEMA}.lock_grants') IS NOT NULL").fetchone()
    if row is not None and row[0]:
        conn.execute(f"LOCK TABLE {SCHEMA}.lock_grants IN SHARE ROW EXCLUSIVE MODE")
    else:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{MIGRATION_LOCK_TIMEOUT * 1000:.0f}ms",))


def _apply_once(conn: psycopg.Connection[tuple[Any, ...]]) -> list[Migration]:
    applied_now: list[Migration] = []
    with conn.transaction():
        _serialise(conn)
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        conn.execute(
            f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.schema_migrations (
                    version    integer     PRIMARY KEY,
                    name       text        NOT NULL,
                    applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"""
        )
        done = {row[0] for row in conn.execute(f"SELECT version FROM {SCHEMA}.schema_migrations")}
        for migration in load_migrations():
            if migration.version in done:
                continue
            conn.execute(migration.sql.encode())
            conn.execute(
                f"INSERT INTO {SCHEMA}.schema_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied_now.append(migration)
        if applied_now and max(m.version for m in applied_now) >= LEAST_PRIVILEGE_VERSION:
            # PostgreSQL gives PUBLIC EXECUTE on every new function (and per-schema default
            # privileges cannot take that back): a migration's new functions are nobody's
            # but the owner's until the grants name them (_grant_runtime_privileges).
            conn.execute(f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {SCHEMA} FROM PUBLIC")
    return applied_now


def current_version(conn: psycopg.Connection[tuple[Any, ...]]) -> int:
    row = conn.execute("SELECT to_regclass('guardedcron.schema_migrations') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return 0
    version = conn.execute(f"SELECT coalesce(max(version), 0) FROM {SCHEMA}.schema_migrations").fetchone()
    return int(version[0]) if version else 0


@dataclass(frozen=True)
class SchemaOwner:
    name: str
    superuser: bool


def schema_owner(conn: psycopg.Connection[tuple[Any, ...]]) -> SchemaOwner:
    """The role that owns the schema, and so every guardedcron object (version 4)."""
    row = conn.execute(
        "SELECT r.rolname, r.rolsuper FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner"
        " WHERE n.nspname = %s",
        (SCHEMA,),
    ).fetchone()
    assert row is not None, "called after migrate(), which creates the schema"
    return SchemaOwner(str(row[0]), bool(row[1]))
