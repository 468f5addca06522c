"""Errors of the guard, each carrying the exit code the CLI turns it into."""

from __future__ import annotations

from guardedcron.contract import EXIT_SCHEMA, EXIT_UNAVAILABLE, EXIT_USAGE


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


class StaleFenceError(Exception):
    """The fencing token a workload holds is no longer the lock's current one."""
