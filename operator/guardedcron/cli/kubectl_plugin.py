"""`kubectl gcj …`: guardedcron as a kubectl plugin (the `kubectl-gcj` command).

kubectl runs an executable named `kubectl-gcj` found on PATH for `kubectl gcj`, with
the words that follow; pip installs one with guardedcron. The commands read the way
kubectl's do: the namespace is the kubeconfig context's unless `-n` says otherwise,
`-A` reads every namespace where a list makes sense, and `--kubeconfig`/`--context`
choose the login (guardedcron.cli.kubeconfig: exec plugins and OIDC included).

    kubectl gcj trigger NAME [-n NS] [-o name|json]   a manual, guarded run now
    kubectl gcj runs [NAME] [-n NS | -A] [-o json]    recent runs from the status
    kubectl gcj status NAME [-n NS] [--no-database] [-o json]
                                                      schedule, conditions, runs, the lease
    kubectl gcj suspend|resume NAME [-n NS] [-o json] set spec.suspend
    kubectl gcj backfill NAME --since T --until T [--token T] [--dry-run] [-n NS]
                                                      as `guardedcron backfill`
    kubectl gcj report [NAME] [-n NS] [--output-file FILE]
                                                      a support bundle (JSON), no secrets
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
from guardedcron.cli import backfill, gcj_status, gcj_suspend, render, support_report, trigger
from guardedcron.cli.cluster_options import add_cluster_options, reported_name_problems
from guardedcron.cli.gcj_common import (
    PROG,
    RUN_COLUMNS,
    PluginFailed,
    cluster,
    get_guarded_cronjob,
    run_cells,
    runs_of,
    table_lines,
    where_of,
)
from guardedcron.cli.kubeconfig import KubeconfigError, context_namespace
from guardedcron.cli.main import Parser, PrintVersion, report_internal_error
from guardedcron.contract import EXIT_OK, EXIT_USAGE
from guardedcron.kube import GUARDED_CRONJOBS


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

    gcj_status.add_parser(sub)
    gcj_suspend.add_parsers(sub)
    backfill.add_parser(sub, "backfill", "run the slots of a past time range, one at a time, oldest first")
    sub.choices["backfill"].set_defaults(prog=f"{PROG} backfill")
    support_report.add_parser(sub)

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
    if reported_name_problems(f"{PROG} runs", args.name, args.namespace):
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
    async with cluster(kubeconfig, context, namespace) as (client, chosen):
        where = None if all_namespaces else chosen
        if name is not None:
            objects = [await get_guarded_cronjob(client, chosen, name)]
        else:
            objects = await client.list(GUARDED_CRONJOBS, where)
    return where, [row for gcj in sorted(objects, key=where_of) for row in runs_of(gcj)]


def print_table(rows: list[dict[str, Any]], *, with_namespace: bool) -> None:
    heads = (("NAMESPACE",) if with_namespace else ()) + (contract.KIND.upper(),) + RUN_COLUMNS
    cells = [((row["namespace"],) if with_namespace else ()) + (row["guardedCronJob"],) + run_cells(row)
             for row in rows]
    for line in table_lines(heads, cells):
        print(line)
