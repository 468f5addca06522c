"""Which database role may use which locks: `guardedcron db grant | revoke | grants`.

A grant is a lock-name prefix: the role may use every lock whose name starts with it.
The empty prefix is the all-locks grant. The SQL functions check it on every call
(schema version 4, docs/design.md "Least privilege in PostgreSQL"). Granting also gives
the role what it needs to call them: usage of the schema, EXECUTE on the entry points,
SELECT on `runs` (row-level security shows it its own locks' rows) and on
`schema_migrations`; never a table write. When a role's last grant is revoked, those
privileges go too. Only the schema owner (or a superuser) can grant.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from guardedcron.guard.errors import BadInput, NotPermitted

if TYPE_CHECKING:
    import psycopg

    Connection = psycopg.Connection[tuple[Any, ...]]

ALL_LOCKS = ""  # the prefix every lock name starts with
PG_NAME_MAX = 63  # NAMEDATALEN - 1: PostgreSQL cuts longer role names


@dataclass(frozen=True)
class Grant:
    role: str
    prefix: str
    granted_at: datetime
    note: str

    def as_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "lock_prefix": self.prefix,
            "all_locks": self.prefix == ALL_LOCKS,
            "granted_at": self.granted_at.isoformat(),
            "note": self.note,
        }


@dataclass(frozen=True)
class Role:
    oid: int
    name: str
    uses_every_lock: bool  # the schema owner, a role with its privileges, or a superuser


def find_role(conn: Connection, name: str) -> Role:
    row = conn.execute(
        "SELECT r.oid, r.rolname, coalesce(pg_has_role(r.oid,"
        " (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'guardedcron'), 'USAGE'), false)"
        "  FROM pg_roles r WHERE r.rolname = %s",
        (name,),
    ).fetchone()
    if row is None:
        raise BadInput(f'no role named "{name}" in this database cluster; create it first')
    return Role(int(row[0]), str(row[1]), bool(row[2]))


def grant(conn: Connection, role_name: str, prefixes: list[str]) -> list[str]:
    """Give `role_name` the locks under `prefixes`; return the prefixes that are new."""
    with conn.transaction(), _OwnerOnly(conn, "grant"):
        role = find_role(conn, role_name)
        conn.execute("SELECT guardedcron._grant_runtime_privileges(%s)", (role.oid,))
        rows = conn.execute(
            "INSERT INTO guardedcron.lock_grants (role, prefix, note)"
            " SELECT %s, p, format('db grant by %%s', session_user) FROM unnest(%s::text[]) p"
            " ON CONFLICT DO NOTHING RETURNING prefix",
            (role.oid, prefixes),
        ).fetchall()
    return sorted(str(r[0]) for r in rows)


def revoke(conn: Connection, role_name: str, prefixes: list[str] | None) -> list[str]:
    """Take back `prefixes` (None: every grant) from `role_name`; return what went. A prefix
    the role was not granted is bad input, and nothing changes."""
    from psycopg import sql

    with conn.transaction(), _OwnerOnly(conn, "revoke"):
        role = find_role(conn, role_name)
        held = {str(r[0]) for r in conn.execute(
            "SELECT prefix FROM guardedcron.lock_grants WHERE role = %s", (role.oid,))}
        wanted = held if prefixes is None else set(prefixes)
        missing = sorted(wanted - held)
        if missing:
            shown = ", ".join("all locks" if p == ALL_LOCKS else f'"{p}"' for p in missing)
            raise BadInput(f'role "{role.name}" holds no grant for {shown}; nothing changed')
        conn.execute(
            "DELETE FROM guardedcron.lock_grants WHERE role = %s AND prefix = ANY(%s::text[])",
            (role.oid, sorted(wanted)),
        )
        if held == wanted:
            # Its last grant: back to a role that was never granted anything.
            who = sql.Identifier(role.name)
            for statement in (
                "REVOKE USAGE ON SCHEMA guardedcron FROM {}",
                "REVOKE ALL ON ALL FUNCTIONS IN SCHEMA guardedcron FROM {}",
                "REVOKE ALL ON ALL TABLES IN SCHEMA guardedcron FROM {}",
            ):
                conn.execute(sql.SQL(statement).format(who))
    return sorted(wanted)


def list_grants(conn: Connection, role_name: str | None = None) -> list[Grant]:
    from guardedcron.guard.timestamps import reading

    with _OwnerOnly(conn, "list the grants"):
        rows = reading(conn).execute(
            "SELECT pg_get_userbyid(g.role), g.prefix, g.granted_at, g.note"
            "  FROM guardedcron.lock_grants g"
            " WHERE %s::text IS NULL OR g.role = (SELECT oid FROM pg_roles WHERE rolname = %s)"
            " ORDER BY 1, 2",
            (role_name, role_name),
        ).fetchall()
    return [Grant(str(r[0]), str(r[1]), r[2], str(r[3])) for r in rows]


class _OwnerOnly:
    """Turns "permission denied" into one line saying who may do this."""

    def __init__(self, conn: Connection, what: str) -> None:
        self._conn = conn
        self._what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _tb: Any) -> None:
        from guardedcron.guard.errors import INSUFFICIENT_PRIVILEGE_SQLSTATE

        if getattr(exc, "sqlstate", None) == INSUFFICIENT_PRIVILEGE_SQLSTATE:
            raise NotPermitted(
                f'role "{self._conn.info.user}" may not {self._what}: only the owner of the '
                "guardedcron schema (the role that ran `guardedcron db migrate`) or a superuser can"
            ) from None
