"""`guardedcron demo`: see a guarded job run once across two clusters, with no cluster at hand.

With `--current-context` (or when a kubeconfig is found and `--local` is not given) it
runs the operator against that cluster instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any, Final

from guardedcron.contract import EXIT_FAILURE

DEVENV_MISSING: Final = (
    "the local clusters come with the development environment, which this installation lacks; "
    "in a checkout of the repository run `make demo` (or `pip install ./operator/devenv`)"
)


def add_parser(sub: Any, name: str, help_text: str) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=__doc__)
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--local", action="store_true", help="always start the local clusters, even if a kubeconfig exists"
    )
    where.add_argument(
        "--current-context",
        action="store_true",
        help="run the operator against the cluster of the current kubeconfig",
    )
    parser.add_argument(
        "--slots",
        type=int,
        default=None,
        help="stop after this many scheduled minutes (default: run until Ctrl-C)",
    )
    parser.set_defaults(run=run)


def kubeconfig_present() -> bool:
    configured = os.environ.get("KUBECONFIG")
    if configured:
        return any(Path(p).is_file() for p in configured.split(os.pathsep) if p)
    return (Path.home() / ".kube" / "config").is_file()


def run(args: argparse.Namespace) -> int:
    if args.current_context or (not args.local and kubeconfig_present()):
        print(
            "guardedcron demo: a kubeconfig was found; running the operator against its current "
            "context (`guardedcron demo --local` starts the local clusters instead)"
        )
        from guardedcron.cli.main import main

        return main(["operator"])
    try:
        # By name: the runtime package never depends on the development environment.
        demo = importlib.import_module("guardedcron_devenv.demo")
    except ModuleNotFoundError as missing:
        if missing.name is None or not missing.name.startswith("guardedcron_devenv"):
            raise
        print(f"guardedcron demo: {DEVENV_MISSING}", file=sys.stderr)
        return EXIT_FAILURE
    result: int = demo.main(args.slots)
    return result
