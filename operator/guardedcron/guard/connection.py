"""Opening the database connection, with errors that never carry the password."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from guardedcron.contract import ENV_DSN
from guardedcron.guard.errors import BadInput, DatabaseUnavailable, SchemaOutdated

if TYPE_CHECKING:
    import psycopg

# SQLSTATEs meaning "the schema is not there (or is older than this tool's functions)".
SCHEMA_MISSING_STATES = {"3F000", "42P01", "42883"}


def resolve_dsn(dsn: str | None) -> str:
    value = dsn if dsn is not None else os.environ.get(ENV_DSN, "")
    if not value.strip():
        raise BadInput(f"no database given: set {ENV_DSN} or pass --dsn")
    return value


def describe(dsn: str) -> str:
    """`user@host:port/dbname`, for messages: everything but the password."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(dsn)
    except Exception:  # an unparseable DSN must not be echoed back: it may hold a password
        return "<unparseable DSN>"
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    port = parts.get("port") or "5432"
    dbname = parts.get("dbname") or parts.get("user") or "?"
    user = parts.get("user")
    who = f"{user}@" if user else ""
    return f"{who}{host}:{port}/{dbname}"


def scrub(message: str, dsn: str) -> str:
    """Remove the password (and the raw DSN) from a message, whatever produced it."""
    from psycopg.conninfo import conninfo_to_dict

    secrets = [dsn]
    try:
        password = conninfo_to_dict(dsn).get("password")
        if password:
            secrets.append(str(password))
    except Exception:
        pass
    for secret in secrets:
        if secret:
            message = message.replace(secret, "***")
    return message


def last_line(message: str) -> str:
    """The last non-empty line: libpq puts the server's own reason (FATAL: ...) there."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return lines[-1] if lines else message.strip()


def connect(dsn: str, connect_timeout: float) -> psycopg.Connection[tuple[Any, ...]]:
    """An autocommit connection: each guard call is its own short transaction."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise BadInput("the database DSN cannot be parsed (value not shown)") from None
    try:
        return psycopg.connect(
            dsn,
            autocommit=True,
            connect_timeout=max(1, round(connect_timeout)),
            application_name="guardedcron",
        )
    except psycopg.OperationalError as exc:
        reason = last_line(scrub(str(exc), dsn))
        raise DatabaseUnavailable(f"cannot reach database {describe(dsn)}: {reason}") from None


def raise_for_database(exc: Exception, dsn: str) -> None:
    """Turn a failed call into the guard's errors: schema missing (78), or the connection
    lost in the middle of the call, e.g. the server restarting or the backend cut (69)."""
    import psycopg

    raise_for_schema(exc, dsn)
    if isinstance(exc, psycopg.OperationalError):
        reason = exc.diag.message_primary or str(exc).strip().split("\n")[0]
        raise DatabaseUnavailable(
            f"lost the connection to database {describe(dsn)}: {scrub(reason, dsn)}"
        ) from None


def raise_for_schema(exc: Exception, dsn: str) -> None:
    """Turn 'function/table does not exist' into the schema exit code."""
    import psycopg

    if isinstance(exc, psycopg.Error) and exc.sqlstate in SCHEMA_MISSING_STATES:
        raise SchemaOutdated(
            f"the guardedcron schema in {describe(dsn)} is missing or older than this tool; "
            "run `guardedcron db migrate`"
        ) from None
