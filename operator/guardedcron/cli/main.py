"""Entry point of the `guardedcron` command.

The guard runs on the critical path of every scheduled run, so start-up is kept
short: only the module of the chosen sub-command is imported.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from guardedcron.contract import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    KEY_EXIT_CODE,
    KEY_HOLDER,
    KEY_LOCK,
    KEY_OUTCOME,
    KEY_REASON,
    GuardOutcome,
)
from guardedcron.guard import redaction

DISTRIBUTION = "guardedcron"  # the name pip knows it by, for --version
# How much of an unexpected exception's message the last-resort line shows.
INTERNAL_REASON_MAX = 300

# The guard's one-shot commands: a process on the critical path of every scheduled run that
# lives well under a second. Importing psycopg allocates enough objects to set off dozens of
# cyclic collections that find nothing to free (docs/benchmarks.md, "Guard cold start").
ONE_SHOT_COMMANDS = frozenset({"acquire", "renew", "release"})

# sub-command -> (module under guardedcron.cli, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "acquire": ("guard_commands", "win the lease (and slot) before a run; exit 75 if someone else has it"),
    "renew": ("guard_commands", "extend a lease you hold"),
    "release": ("guard_commands", "end a lease you hold and record the run's outcome"),
    "keep": ("guard_commands", "renew a lease until SIGTERM, then release it (native sidecar mode)"),
    "db": ("db", "database schema: `db migrate`"),
    "runs": ("runs", "run history of a lock: list, gaps against a schedule, overlaps"),
    "demo": ("demo", "two local clusters, one database: watch a guarded job run once per slot"),
    "render": ("render", "print the CronJob the operator would create for a GuardedCronJob"),
    "operator": ("operator", "run the operator: GuardedCronJobs into guarded CronJobs, run status back"),
    "trigger": ("trigger", "start a manual, guarded run of a GuardedCronJob now (a Job from its CronJob)"),
    "backfill": ("backfill", "run the slots of a past time range, one at a time (guardedcron.io/backfill)"),
}


class Parser(argparse.ArgumentParser):
    """argparse, with the guard's exit code for bad usage and no credentials in its errors:
    argparse quotes the offending argument, which may be a misplaced connection string."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {redaction.redact(message)}\n")


class PrintVersion(argparse.Action):
    """`--version`: the installed distribution's version, looked up only when asked (the
    guard builds this parser on every run, and the metadata lookup reads files)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(f"{parser.prog} {installed_version()}")  # stdout, as argparse's own version action
        parser.exit(0)


def installed_version() -> str:
    """The version pip installed (package metadata), else the source tree's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        from guardedcron import __version__

        return __version__


def build_parser(command: str | None) -> argparse.ArgumentParser:
    parser = Parser(
        prog="guardedcron",
        description="Scheduled Kubernetes jobs that run once, guarded by a PostgreSQL lease.",
    )
    parser.add_argument("--version", action=PrintVersion)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        if command is None:  # --help or no known command: list them all
            sub.add_parser(name, help=help_text)
            continue
        if name != command:  # a parser for each other command is start-up time for nothing
            continue
        module = importlib.import_module(f"guardedcron.cli.{module_name}")
        module.add_parser(sub, name, help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    as_process = argv is None  # the `guardedcron` command itself, not a call from Python code
    args_list = list(sys.argv[1:] if argv is None else argv)
    # Before anything can fail: from here on every message hides these connection strings.
    redaction.hide_for_this_run(args_list)
    command = next((a for a in args_list if not a.startswith("-")), None)
    if command not in COMMANDS:
        command = None
    if as_process and command in ONE_SHOT_COMMANDS:
        gc.disable()  # reference counting still frees everything; only the cycle search stops
    try:
        parser = build_parser(command)
        try:
            args = parser.parse_args(args_list)
        except SystemExit as exc:  # --help (0), or bad usage (Parser.error: 64)
            return EXIT_USAGE if exc.code not in (0, None) else 0
        redaction.hide([getattr(args, "dsn", None)])  # whatever it looks like
        result: int = args.run(args)
        return result
    except KeyboardInterrupt:  # SIGINT (Ctrl-C): `keep` handles it itself, to release
        return report_end(command or "", args_list, "interrupted (SIGINT)", EXIT_INTERRUPTED)
    except Exception as exc:  # the last resort: one line, no traceback
        return report_internal_error(command or "", args_list, exc)
    finally:
        if as_process:
            # The process ends next, and interpreter shutdown would run one last cycle search
            # over every object the imports made: tens of milliseconds of CPU per guard run,
            # for nothing. Frozen objects are left out of it; shutdown still flushes output
            # and runs atexit handlers as before.
            gc.freeze()


def report_internal_error(command: str, argv: list[str], exc: Exception) -> int:
    """Neither bad input nor the database (those have their own codes), so a bug or a broken
    environment: say what broke in one line without credentials, and leave the operator a
    termination message."""
    detail = " ".join(str(exc).split())[:INTERNAL_REASON_MAX]
    return report_end(command, argv, f"unexpected error ({type(exc).__name__}): {detail}", EXIT_INTERNAL)


def report_end(command: str, argv: list[str], why: str, code: int) -> int:
    """A command cut short: one redacted line, and for acquire an `error` termination message."""
    reason = redaction.redact(why)
    prefix = f"guardedcron {command}" if command else "guardedcron"
    sys.stderr.write(f"{prefix}: {reason}\n")
    sys.stderr.flush()
    if command == "acquire":
        from guardedcron.guard.outputs import write_termination_message

        write_termination_message(
            {
                KEY_OUTCOME: GuardOutcome.ERROR,
                KEY_EXIT_CODE: code,
                KEY_LOCK: _option(argv, "--lock"),
                KEY_HOLDER: _option(argv, "--holder"),
                KEY_REASON: reason,
            }
        )
    return code


def _option(argv: list[str], name: str) -> str | None:
    """An option's value read straight from the arguments (the parsed ones may not exist)."""
    for index, arg in enumerate(argv):
        if arg == name and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(name + "="):
            return arg[len(name) + 1 :]
    return None
