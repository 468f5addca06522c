"""Errors of the guard, each carrying the exit code the CLI turns it into."""

from __future__ import annotations

from typing import Any

from guardedcron.contract import (
    EXIT_NOT_GRANTED,
    EXIT_SCHEMA,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    SQLSTATE_NOT_GRANTED,
)

# PostgreSQL's insufficient_privilege: the role was never given the schema or a function.
INSUFFICIENT_PRIVILEGE_SQLSTATE = "42501"
# The SQL functions' bounds (schema version 9): a lock or holder name past 253 characters,
# a reason past 4,096 (GC004); more than 4 writing calls in one transaction (GC005). The
# CLI and the library's callers never send either; a client that does gets BadInput.
ARGUMENT_TOO_LONG_SQLSTATE = "GC004"
TOO_MANY_CALLS_SQLSTATE = "GC005"


class GuardError(Exception):
    """A failure the CLI reports in one line and maps to an exit code."""

    exit_code = 1


class BadInput(GuardError):
    exit_code = EXIT_USAGE


class DatabaseUnavailable(GuardError):
    exit_code = EXIT_UNAVAILABLE


class SchemaOutdated(GuardError):
    exit_code = EXIT_SCHEMA


class FenceExhausted(GuardError):
    """The lock's fences reached the bigint maximum: an administrator must act (exit 78)."""

    exit_code = EXIT_SCHEMA


class NotPermitted(GuardError):
    """The database refused the role what it asked (exit 77, EX_NOPERM)."""

    exit_code = EXIT_NOT_GRANTED


class LockNotGranted(NotPermitted):
    """The database role may not use the lock: `guardedcron db grant` gives it."""


def not_granted(exc: Any, lock: str, role: str | None) -> LockNotGranted | None:
    """The refusal a database error stands for, if it is one: the functions' GC003 (no
    grant covers the lock), or permission denied on the schema or a function (the role was
    never granted anything). Says the lock and the role; nothing of the connection."""
    state = getattr(exc, "sqlstate", None)
    if state not in (SQLSTATE_NOT_GRANTED, INSUFFICIENT_PRIVILEGE_SQLSTATE):
        return None
    who = f'role "{role}"' if role else "this role"
    if state == SQLSTATE_NOT_GRANTED:
        why = "no grant covers it"
    else:
        why = "it has no access to the guardedcron schema"
    return LockNotGranted(
        f'lock "{lock}" is not granted to {who} ({why}); an administrator grants it with '
        f"`guardedcron db grant --role {role or 'ROLE'} --lock-prefix PREFIX`"
    )


class StaleFenceError(Exception):
    """The fencing token a workload holds is no longer the lock's current one."""


def out_of_bounds(exc: Any) -> BadInput | None:
    """The bad input a database error stands for, if it is one of the functions' bounds
    (GC004, GC005): their message says which bound, never the text itself."""
    if getattr(exc, "sqlstate", None) not in (ARGUMENT_TOO_LONG_SQLSTATE, TOO_MANY_CALLS_SQLSTATE):
        return None
    diag = getattr(exc, "diag", None)
    return BadInput(str(getattr(diag, "message_primary", None) or exc))
