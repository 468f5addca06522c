"""`kubectl gcj suspend NAME` / `kubectl gcj resume NAME`: set spec.suspend (a merge
patch), printing kubectl's `guardedcronjob.guardedcron.io/NAME suspended` line, or that
nothing changed when it already was.

A GuardedCronJob a GitOps controller applies (Argo CD, Flux) gets its manifest back at
the next sync: the edit is made, and stderr says it may be reverted, when the object
shows such a manager (its labels, annotations or managedFields).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from guardedcron.cli.cluster_options import add_cluster_options, reported_name_problems
from guardedcron.cli.gcj_common import PROG, RESOURCE_NAME, PluginFailed, cluster, get_guarded_cronjob
from guardedcron.contract import EXIT_OK, EXIT_USAGE
from guardedcron.kube import GUARDED_CRONJOBS

FIELD_MANAGER = "kubectl-gcj"
# What marks an object a GitOps controller applies: the key, and the tool it stands for.
GITOPS_MARKS = {
    "argocd.argoproj.io/instance": "Argo CD",
    "argocd.argoproj.io/tracking-id": "Argo CD",
    "kustomize.toolkit.fluxcd.io/name": "Flux",
    "helm.toolkit.fluxcd.io/name": "Flux",
}
GITOPS_MANAGERS = {
    "argocd-controller": "Argo CD",
    "argocd-application-controller": "Argo CD",
    "kustomize-controller": "Flux",
    "helm-controller": "Flux",
}


def add_parsers(sub: Any) -> None:
    for command, suspend, what in (("suspend", True, "stop scheduling runs of a GuardedCronJob"),
                                   ("resume", False, "schedule runs of a suspended GuardedCronJob again")):
        parser: argparse.ArgumentParser = sub.add_parser(
            command, help=what, description=f"{what[0].upper()}{what[1:]} (sets spec.suspend to "
                                            f"{str(suspend).lower()}). A run already started goes on.")
        parser.add_argument("name", metavar="NAME", help="the GuardedCronJob")
        add_cluster_options(parser)
        parser.add_argument("-o", "--output", choices=("name", "json"), default="name")
        parser.set_defaults(run=run, suspend=suspend, command=command)


def run(args: argparse.Namespace) -> int:
    prog = f"{PROG} {args.command}"
    if reported_name_problems(prog, args.name, args.namespace):
        return EXIT_USAGE
    try:
        answer, manager = asyncio.run(set_suspend(args.name, args.namespace, args.suspend,
                                                  args.kubeconfig, args.context))
    except PluginFailed as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return error.code
    if manager is not None and answer["changed"]:
        print(f"{prog}: warning: {gitops_warning(manager)}", file=sys.stderr)
    print(json.dumps(answer, separators=(",", ":")) if args.output == "json" else result_line(answer))
    return EXIT_OK


async def set_suspend(name: str, namespace: str | None, suspend: bool, kubeconfig: str | None,
                      context: str | None) -> tuple[dict[str, Any], str | None]:
    """The answer (`changed` false when spec.suspend already was `suspend`) and the GitOps
    tool that seems to manage the object, if any."""
    async with cluster(kubeconfig, context, namespace) as (client, chosen):
        gcj = await get_guarded_cronjob(client, chosen, name)
        changed = bool((gcj.get("spec") or {}).get("suspend")) != suspend
        if changed:
            await client.merge_patch(GUARDED_CRONJOBS, chosen, name, {"spec": {"suspend": suspend}},
                                     field_manager=FIELD_MANAGER)
    answer = {"namespace": chosen, "guarded_cronjob": name, "suspended": suspend, "changed": changed}
    return answer, gitops_manager(gcj)


def result_line(answer: dict[str, Any]) -> str:
    state = "suspended" if answer["suspended"] else "resumed"
    if answer["changed"]:
        return f"{RESOURCE_NAME}/{answer['guarded_cronjob']} {state}"
    already = "suspended" if answer["suspended"] else "not suspended"
    return f"{RESOURCE_NAME}/{answer['guarded_cronjob']} was already {already} (no change)"


def gitops_manager(gcj: dict[str, Any]) -> str | None:
    """`Argo CD (label argocd.argoproj.io/instance)` or the like, when the object shows a
    GitOps controller applies it; None when it shows none."""
    metadata = gcj.get("metadata") or {}
    for kind in ("labels", "annotations"):
        for key in metadata.get(kind) or {}:
            if key in GITOPS_MARKS:
                return f"{GITOPS_MARKS[key]} ({kind[:-1]} {key})"
    for entry in metadata.get("managedFields") or ():
        manager = str(entry.get("manager", "")) if isinstance(entry, dict) else ""
        if manager in GITOPS_MANAGERS:
            return f"{GITOPS_MANAGERS[manager]} (field manager {manager})"
    return None


def gitops_warning(manager: str) -> str:
    return (f"this GuardedCronJob seems applied by {manager}, which may revert a hand edit at "
            "its next sync; set spec.suspend in its source too")
