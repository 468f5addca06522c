"""Entry point of the `guardedcron` command.

The guard runs on the critical path of every scheduled run, so start-up is kept
short: only the module of the chosen sub-command is imported.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from guardedcron.contract import EXIT_USAGE

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
}


def build_parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="guardedcron",
        description="Scheduled Kubernetes jobs that run once, guarded by a PostgreSQL lease.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        if command is None or name != command:
            sub.add_parser(name, help=help_text)
            continue
        module = importlib.import_module(f"guardedcron.cli.{module_name}")
        module.add_parser(sub, name, help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # argparse exits 2 on bad usage; our contract says 64
        return EXIT_USAGE if exc.code not in (0, None) else 0
    result: int = args.run(args)
    return result
