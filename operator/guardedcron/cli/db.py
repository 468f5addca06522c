"""`guardedcron db migrate | status | grant | revoke | grants`: the guard's schema and who
may use which locks in it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from guardedcron.cli.guard_commands import (
    add_connection_options,
    check_name_argument,
    checked_dsn,
    connect_timeout,
    emit,
    say,
)
from guardedcron.contract import ADMIN_CALL_SECONDS, EXIT_OK, EXIT_SCHEMA
from guardedcron.guard.errors import BadInput, GuardError


def add_parser(sub: Any, name: str, help_text: str) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    migrate = actions.add_parser("migrate", help="create or upgrade the schema (safe to run concurrently)")
    add_connection_options(migrate)
    migrate.set_defaults(run=run_migrate)
    status = actions.add_parser("status", help="print the schema version; exit 78 if behind this tool")
    add_connection_options(status)
    status.set_defaults(run=run_status)

    grant = actions.add_parser(
        "grant", help="let a database role use the locks under some prefixes (schema owner only)"
    )
    grant.add_argument("--role", required=True, help="the PostgreSQL role a guard's DSN logs in as")
    which = grant.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--lock-prefix",
        action="append",
        help="lock names starting with this: NAMESPACE/, or a shared lock by name, shared:NAME (repeatable)",
    )
    which.add_argument("--all-locks", action="store_true", help="every lock (the schema-3 behaviour)")
    add_connection_options(grant)
    grant.set_defaults(run=run_grant)

    revoke = actions.add_parser("revoke", help="take grants back from a role (schema owner only)")
    revoke.add_argument("--role", required=True, help="the PostgreSQL role")
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("--lock-prefix", action="append", help="a granted prefix (repeatable)")
    which.add_argument("--all-locks", action="store_true", help="the all-locks grant")
    which.add_argument(
        "--every-grant", action="store_true", help="every grant of the role, and its access to the schema"
    )
    add_connection_options(revoke)
    revoke.set_defaults(run=run_revoke)

    grants = actions.add_parser("grants", help="list the grants (schema owner only)")
    grants.add_argument("--role", help="only this role's")
    add_connection_options(grants)
    grants.set_defaults(run=run_grants)


def run_migrate(args: argparse.Namespace) -> int:
    from guardedcron.guard.connection import call_with_deadline, connect, describe
    from guardedcron.guard.migrations import current_version, migrate, schema_owner

    notices: list[str] = []
    try:
        timeout = connect_timeout(args)
        dsn = checked_dsn(args)
        with connect(dsn, timeout) as conn:
            applied, version, owner = call_with_deadline(
                conn,
                dsn,
                ADMIN_CALL_SECONDS,
                lambda c: (migrate(c, notices.append), current_version(c), schema_owner(c)),
            )
    except GuardError as exc:
        say("db migrate", str(exc))
        return exc.exit_code
    for migration in applied:
        print(f"applied migration {migration.version} ({migration.name})", file=sys.stderr)
    for notice in notices:
        say("db migrate", notice)
    if owner.superuser:
        say(
            "db migrate",
            f'the schema owner "{owner.name}" is a superuser: the guardedcron functions run with '
            "its rights; a dedicated owner role is safer (docs/design.md, least privilege)",
        )
    emit(
        {
            "database": describe(dsn),
            "schema_version": version,
            "applied": [m.version for m in applied],
            "owner": owner.name,
            "notices": notices,
        }
    )
    return EXIT_OK


def run_status(args: argparse.Namespace) -> int:
    from guardedcron.guard.connection import call_with_deadline, connect, describe
    from guardedcron.guard.migrations import LATEST_VERSION, current_version
    from guardedcron.guard.replication import replication_of

    try:
        timeout = connect_timeout(args)
        dsn = checked_dsn(args)
        with connect(dsn, timeout) as conn:
            version, replication = call_with_deadline(
                conn, dsn, ADMIN_CALL_SECONDS, lambda c: (current_version(c), replication_of(c))
            )
    except GuardError as exc:
        say("db status", str(exc))
        return exc.exit_code
    emit(
        {
            "database": describe(dsn),
            "schema_version": version,
            "tool_needs": LATEST_VERSION,
            "replication": None if replication is None else replication.fields(),
        }
    )
    if replication is not None and replication.warning():
        say("db status", str(replication.warning()))
    if replication is not None and replication.in_recovery:
        say("db status", "this server is a standby (in recovery): guards cannot acquire leases on it")
    if version < LATEST_VERSION:
        say(
            "db status",
            f"schema version {version} is older than this tool needs "
            f"({LATEST_VERSION}); run `guardedcron db migrate`",
        )
        return EXIT_SCHEMA
    return EXIT_OK


def lock_prefixes(args: argparse.Namespace) -> list[str] | None:
    """The prefixes named (--all-locks is the empty one, as in the JSON answers); None for
    --every-grant."""
    from guardedcron.guard.grants import ALL_LOCKS

    if getattr(args, "every_grant", False):
        return None
    if args.all_locks:
        return [ALL_LOCKS]
    for prefix in args.lock_prefix:
        check_name_argument("--lock-prefix", prefix)
    return sorted(set(args.lock_prefix))


def check_prefix_ends_a_name_part(prefix: str) -> None:
    """A grant covers every lock name that starts with its prefix, so "team-a" would cover
    "team-ab/..." too: a prefix must end where a part of a lock name ends, at the namespace
    separator. A shared lock is granted by its full name (shared:NAME), or all of them by
    "shared:"."""
    from guardedcron.contract import NAMESPACE_LOCK_SEPARATOR, SHARED_LOCK_PREFIX

    if prefix.endswith(NAMESPACE_LOCK_SEPARATOR) or prefix.startswith(SHARED_LOCK_PREFIX):
        return
    raise BadInput(
        f'--lock-prefix "{prefix}" would also grant every lock whose name merely starts with it '
        f'(e.g. "{prefix}x{NAMESPACE_LOCK_SEPARATOR}..."): end it with "{NAMESPACE_LOCK_SEPARATOR}" '
        f'(--lock-prefix {prefix}{NAMESPACE_LOCK_SEPARATOR}), name a shared lock in full '
        f"({SHARED_LOCK_PREFIX}NAME), or give --all-locks"
    )


def checked_role(args: argparse.Namespace) -> str:
    from guardedcron.guard.grants import PG_NAME_MAX

    check_name_argument("--role", args.role)
    if len(args.role.encode("utf-8")) > PG_NAME_MAX:
        raise BadInput(f"--role is longer than PostgreSQL's {PG_NAME_MAX}-byte names")
    return str(args.role)


def run_grant(args: argparse.Namespace) -> int:
    from guardedcron.guard import grants
    from guardedcron.guard.connection import call_with_deadline, connect, describe

    try:
        role = checked_role(args)
        prefixes = lock_prefixes(args)
        assert prefixes is not None
        for prefix in prefixes:
            if prefix:  # "" is --all-locks
                check_prefix_ends_a_name_part(prefix)
        timeout = connect_timeout(args)
        dsn = checked_dsn(args)
        with connect(dsn, timeout) as conn:
            added, found = call_with_deadline(
                conn,
                dsn,
                ADMIN_CALL_SECONDS,
                lambda c: (grants.grant(c, role, prefixes), grants.find_role(c, role)),
            )
    except GuardError as exc:
        say("db grant", str(exc))
        return exc.exit_code
    if found.uses_every_lock:
        say("db grant", f'role "{role}" has the schema owner\'s privileges: it uses every lock anyway')
    emit(
        {
            "database": describe(dsn),
            "role": role,
            "granted": prefixes,
            "new": added,
        }
    )
    return EXIT_OK


def run_revoke(args: argparse.Namespace) -> int:
    from guardedcron.guard import grants
    from guardedcron.guard.connection import call_with_deadline, connect, describe

    try:
        role = checked_role(args)
        prefixes = lock_prefixes(args)
        timeout = connect_timeout(args)
        dsn = checked_dsn(args)
        with connect(dsn, timeout) as conn:
            gone = call_with_deadline(
                conn, dsn, ADMIN_CALL_SECONDS, lambda c: grants.revoke(c, role, prefixes)
            )
    except GuardError as exc:
        say("db revoke", str(exc))
        return exc.exit_code
    emit({"database": describe(dsn), "role": role, "revoked": gone})
    return EXIT_OK


def run_grants(args: argparse.Namespace) -> int:
    from guardedcron.guard import grants
    from guardedcron.guard.connection import call_with_deadline, connect, describe

    try:
        role = checked_role(args) if args.role is not None else None
        timeout = connect_timeout(args)
        dsn = checked_dsn(args)
        with connect(dsn, timeout) as conn:
            found = call_with_deadline(
                conn, dsn, ADMIN_CALL_SECONDS, lambda c: grants.list_grants(c, role)
            )
    except GuardError as exc:
        say("db grants", str(exc))
        return exc.exit_code
    emit({"database": describe(dsn), "grants": [g.as_json() for g in found]})
    return EXIT_OK

