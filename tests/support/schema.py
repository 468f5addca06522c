"""A database at an older schema version, as that version of the tool left it."""

from __future__ import annotations

import psycopg

from guardedcron.guard.migrations import load_migrations


def apply_up_to(dsn: str, version: int) -> None:
    """The migrations up to `version`, as that version of the tool applied them."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("CREATE SCHEMA guardedcron")
        conn.execute(
            "CREATE TABLE guardedcron.schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
        for migration in load_migrations():
            if migration.version <= version:
                conn.execute(migration.sql.encode())
                conn.execute(
                    "INSERT INTO guardedcron.schema_migrations (version, name) VALUES (%s, %s)",
                    (migration.version, migration.name),
                )
