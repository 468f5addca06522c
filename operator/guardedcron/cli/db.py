"""`guardedcron db migrate | status`: the guard's schema."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from guardedcron.cli.guard_commands import (
    add_connection_options,
    checked_dsn,
    connect_timeout,
    emit,
    say,
)
from guardedcron.contract import ADMIN_CALL_SECONDS, EXIT_OK, EXIT_SCHEMA
from guardedcron.guard.errors import GuardError


def add_parser(sub: Any, name: str, help_text: str) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    migrate = actions.add_parser("migrate", help="create or upgrade the schema (safe to run concurrently)")
    add_connection_options(migrate)
    migrate.set_defaults(run=run_migrate)
    status = actions.add_parser("status", help="print the schema version; exit 78 if behind this tool")
    add_connection_options(status)
    status.set_defaults(run=run_status)


def run_migrate(args: argparse.Namespace) -> int:
    from guardedcron.guard.connection import call_with_deadline, connect, describe
    from guardedcron.guard.migrations import current_version, migrate

    try:
        timeout = connect_timeout(args)
        dsn = checked_dsn(args)
        with connect(dsn, timeout) as conn:
            applied, version = call_with_deadline(
                conn, dsn, ADMIN_CALL_SECONDS, lambda c: (migrate(c), current_version(c))
            )
    except GuardError as exc:
        say("db migrate", str(exc))
        return exc.exit_code
    for migration in applied:
        print(f"applied migration {migration.version} ({migration.name})", file=sys.stderr)
    emit({"database": describe(dsn), "schema_version": version, "applied": [m.version for m in applied]})
    return EXIT_OK


def run_status(args: argparse.Namespace) -> int:
    from guardedcron.guard.connection import call_with_deadline, connect, describe
    from guardedcron.guard.migrations import LATEST_VERSION, current_version

    try:
        timeout = connect_timeout(args)
        dsn = checked_dsn(args)
        with connect(dsn, timeout) as conn:
            version = call_with_deadline(conn, dsn, ADMIN_CALL_SECONDS, current_version)
    except GuardError as exc:
        say("db status", str(exc))
        return exc.exit_code
    emit({"database": describe(dsn), "schema_version": version, "tool_needs": LATEST_VERSION})
    if version < LATEST_VERSION:
        say(
            "db status",
            f"schema version {version} is older than this tool needs "
            f"({LATEST_VERSION}); run `guardedcron db migrate`",
        )
        return EXIT_SCHEMA
    return EXIT_OK
