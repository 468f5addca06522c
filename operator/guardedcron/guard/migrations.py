"""Versioned schema migrations, safe to run from many processes at once.

`CREATE TABLE IF NOT EXISTS` alone races in PostgreSQL (two sessions can both
pass the existence check), so every migration runs under one transaction-level
advisory lock: concurrent callers queue, and each sees what the first applied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

SCHEMA = "guardedcron"
# An arbitrary constant, the same in every version of the tool.
MIGRATION_LOCK_KEY = 0x6763_726F_6E5F_6D69  # "gcron_mi"


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
# version 8's losses that say whether their slot ran; version 10's wins and renewals
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
    applied_now: list[Migration] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
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
