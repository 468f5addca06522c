"""`kubectl gcj …`: guardedcron as a kubectl plugin (the `kubectl-gcj` command).

kubectl runs an executable named `kubectl-gcj` found on PATH for `kubectl gcj`, with
the words that follow; pip installs one with guardedcron. The commands read the way
kubectl's do: the namespace is the kubeconfig context's unless `-n` says otherwise,
`-A` reads every namespace where a list makes sense, and `--kubeconfig`/`--context`
choose the login (guardedcron.cli.kubeconfig: exec plugins and OIDC included).

    kubectl gcj trigger NAME [-n NS] [-o name|json]   a manual, guarded run now
    kubectl gcj runs [NAME] [-n NS | -A] [-o json]    recent runs from the status
    kubectl gcj render -f FILE [-n NS]                 the CronJob the operator would make

`runs` reads the GuardedCronJobs' status (status.recentRuns, kept by the operator);
the database's full history of a lock is `guardedcron runs --lock …`.
Exit codes are guardedcron's: 0 done, 1 refused or not found, 64 bad input, 69 the
API server could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from guardedcron import contract
from guardedcron.cli import render, trigger
from guardedcron.cli.cluster_options import add_cluster_options, name_problems
from guardedcron.cli.kubeconfig import KubeconfigError, connection_info, context_namespace
from guardedcron.cli.main import Parser, PrintVersion, report_internal_error
from guardedcron.contract import EXIT_FAILURE, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from guardedcron.kube import GUARDED_CRONJOBS, ApiError, ApiUnreachable, KubeClient, NotFound

PROG = "kubectl gcj"
RUN_COLUMNS = ("JOB", "OUTCOME", "FENCE", "MANUAL", "STARTED", "FINISHED", "REASON")


class PluginFailed(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="guardedcron as a kubectl plugin: scheduled jobs "
                                           "that run once, guarded by a PostgreSQL lease.")
    parser.add_argument("--version", action=PrintVersion)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    trigger.add_parser(sub, "trigger", "start a manual, guarded run of a GuardedCronJob now")
    trigger_parser = sub.choices["trigger"]
    trigger_parser.add_argument("-o", "--output", choices=("name", "json"), default="name",
                                help="name: kubectl's 'job.batch/NAME created' (default); json: one line")
    trigger_parser.set_defaults(prog=f"{PROG} trigger")

    runs = sub.add_parser("runs", help="recent runs of GuardedCronJobs (from their status)",
                          description="Recent runs of a GuardedCronJob, or of every one in the "
                                      "namespace (all namespaces with -A), newest first, from "
                                      "status.recentRuns. The database's full history of a lock: "
                                      "guardedcron runs --lock ...")
    runs.add_argument("name", metavar="NAME", nargs="?", help="the GuardedCronJob (default: all)")
    add_cluster_options(runs)
    runs.add_argument("-A", "--all-namespaces", action="store_true",
                      help="every namespace (not with NAME)")
    runs.add_argument("-o", "--output", choices=("table", "json"), default="table")
    runs.set_defaults(run=run_runs)

    render.add_parser(sub, "render", "print the CronJob the operator would create for a GuardedCronJob")
    render_parser = sub.choices["render"]
    # Manifests without a namespace get the context's, as `kubectl apply` would give them.
    render_parser.set_defaults(namespace=None, run=run_render)
    for option, help_text in (("--kubeconfig", "kubeconfig file, for its context's namespace"),
                              ("--context", "kubeconfig context, for its namespace")):
        render_parser.add_argument(option, help=help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        try:
            args = parser.parse_args(args_list)
        except SystemExit as exc:  # --help (0), or bad usage (Parser.error: 64)
            return EXIT_USAGE if exc.code not in (0, None) else 0
        result: int = args.run(args)
        return result
    except Exception as exc:  # the last resort: one line, no traceback
        return report_internal_error("", args_list, exc)


def run_render(args: argparse.Namespace) -> int:
    if args.namespace is None:
        try:
            args.namespace = context_namespace(args.kubeconfig, args.context)
        except KubeconfigError as error:
            print(f"{PROG} render: {error}", file=sys.stderr)
            return error.code
    return render.run(args)


def run_runs(args: argparse.Namespace) -> int:
    if args.all_namespaces and args.name:
        print(f"{PROG} runs: a GuardedCronJob cannot be read by name across all namespaces "
              "(-A): give -n instead", file=sys.stderr)
        return EXIT_USAGE
    problems = name_problems(args.name, args.namespace)
    for problem in problems:
        print(f"{PROG} runs: {problem}", file=sys.stderr)
    if problems:
        return EXIT_USAGE
    try:
        where, rows = asyncio.run(recent_runs(args.name, args.namespace, args.all_namespaces,
                                       args.kubeconfig, args.context))
    except PluginFailed as error:
        print(f"{PROG} runs: {error}", file=sys.stderr)
        return error.code
    if args.output == "json":
        print(json.dumps({"items": rows}, indent=2))
    elif rows:
        print_table(rows, with_namespace=args.all_namespaces)
    else:
        print(f"No runs found in {where or 'any'} namespace.", file=sys.stderr)
    return EXIT_OK


async def recent_runs(name: str | None, namespace: str | None, all_namespaces: bool,
                      kubeconfig: str | None, context: str | None
                      ) -> tuple[str | None, list[dict[str, Any]]]:
    """The namespace read (None: all) and one row per run, newest first within each
    GuardedCronJob."""
    try:
        info = await asyncio.to_thread(connection_info, kubeconfig, context)
    except KubeconfigError as error:
        raise PluginFailed(str(error), error.code) from None
    where = None if all_namespaces else (namespace or info.default_namespace or "default")
    client = KubeClient(info)
    try:
        if name is not None:
            try:
                objects = [await client.get(GUARDED_CRONJOBS, where, name)]
            except NotFound:
                raise PluginFailed(f"GuardedCronJob {where}/{name} not found") from None
        else:
            objects = await client.list(GUARDED_CRONJOBS, where)
    except ApiUnreachable as error:
        raise PluginFailed(f"cannot reach the API server: {error}", EXIT_UNAVAILABLE) from None
    except ApiError as error:
        raise PluginFailed(f"the API server refused: {error}") from None
    finally:
        await client.close()
    return where, [row for gcj in sorted(objects, key=_where) for row in runs_of(gcj)]


def _where(gcj: dict[str, Any]) -> tuple[str, str]:
    metadata = gcj.get("metadata") or {}
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


def runs_of(gcj: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs a GuardedCronJob's status lists (its last run when the list is empty)."""
    namespace, name = _where(gcj)
    status = gcj.get("status") or {}
    runs = status.get("recentRuns") or ([status["lastRun"]] if status.get("lastRun") else [])
    return [{"namespace": namespace, "guardedCronJob": name, **run} for run in runs
            if isinstance(run, dict)]


def print_table(rows: list[dict[str, Any]], *, with_namespace: bool) -> None:
    heads = (("NAMESPACE",) if with_namespace else ()) + (contract.KIND.upper(),) + RUN_COLUMNS
    table = [heads]
    for row in rows:
        cells = ((row["namespace"],) if with_namespace else ()) + (
            row["guardedCronJob"], str(row.get("job", "")), str(row.get("outcome", "")),
            "" if row.get("fence") is None else str(row["fence"]),
            "yes" if row.get("manual") else "no", str(row.get("startedAt", "")),
            str(row.get("finishedAt", "")), " ".join(str(row.get("reason", "")).split()))
        table.append(cells)
    widths = [max(len(line[i]) for line in table) for i in range(len(heads))]
    for line in table:
        print("   ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
