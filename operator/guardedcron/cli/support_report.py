"""`kubectl gcj report [NAME] [-n NS] [--output-file FILE]`: a support bundle for a bug
report, as one JSON document (stdout, or FILE written with mode 0600).

It holds: the plugin's and the API server's versions; the GuardedCronJob NAME (else
every one in the namespace) with its metadata, spec and status; the CronJobs, Jobs and
pods labelled with their names (pods: containers' names and images, and status, not
their specs); the namespace's Events about any of those; the operator Deployment(s)
(labelled part-of=guardedcron, component=operator: image and replicas) and their pods'
last log lines. What could not be read is one line each in `notes`; only a GuardedCronJob
that is not there (1) or an API server that cannot be reached (69) fails the command.

Never in it: a Secret's data (no Secret is read), an env `value` (each becomes
"<redacted>"), kubectl's last-applied-configuration annotation (a copy of the spec's
env), managedFields, and in every string anything shaped like a PostgreSQL URI, a
`password=` setting or a URL with a user and password.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections.abc import Awaitable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from guardedcron import __version__, contract
from guardedcron.cli.cluster_options import add_cluster_options, reported_name_problems
from guardedcron.cli.gcj_common import PROG, PluginFailed, cluster, get_guarded_cronjob, where_of
from guardedcron.contract import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from guardedcron.guard import redaction
from guardedcron.kube import CRONJOBS, EVENTS, GUARDED_CRONJOBS, JOBS, PODS, ApiError, Resource

DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
OPERATOR_SELECTOR = "app.kubernetes.io/part-of=guardedcron,app.kubernetes.io/component=operator"
LOG_LINES = 50
EVENTS_KEPT = 200
REDACTED = "<redacted>"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# scheme://user:password@ : the userinfo of any URL that carries a password.
_URL_CREDENTIALS = re.compile(r"\b([a-z][a-z0-9+.-]*://)[^/\s:@]*:[^@\s/]*@", re.IGNORECASE)
# A command-line flag whose value is a secret (`--password x`, `--api-token=x`, `-dsn x`).
_SECRET_FLAG = re.compile(
    r"^--?[\w.-]*(?:password|passwd|pwd|secret|token|api[-_]?key|credential|dsn)[\w.-]*$", re.IGNORECASE)


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "report", help="a support bundle (one JSON document) for a bug report",
        description="A support bundle for a bug report: versions, the GuardedCronJob(s), their "
                    "CronJobs, Jobs, pods' statuses and Events, the operator's image and last "
                    "log lines. No Secret data, env values or passwords.")
    parser.add_argument("name", metavar="NAME", nargs="?",
                        help="the GuardedCronJob (default: every one in the namespace)")
    add_cluster_options(parser)
    parser.add_argument("--output-file", metavar="FILE", help="write it there (mode 0600), not to stdout")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    prog = f"{PROG} report"
    if reported_name_problems(prog, args.name, args.namespace):
        return EXIT_USAGE
    try:
        report = asyncio.run(collect(args.name, args.namespace, args.kubeconfig, args.context))
    except PluginFailed as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return error.code
    document = json.dumps(report, indent=2, sort_keys=True) + "\n"
    if args.output_file is None:
        sys.stdout.write(document)
        return EXIT_OK
    try:
        descriptor = os.open(args.output_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(document)
    except OSError as error:
        print(f"{prog}: cannot write {args.output_file}: {error.strerror or error}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"support report written to {Path(args.output_file)}", file=sys.stderr)
    return EXIT_OK


async def collect(name: str | None, namespace: str | None, kubeconfig: str | None,
                  context: str | None) -> dict[str, Any]:
    notes: list[str] = []

    async def best_effort(what: str, call: Awaitable[Any]) -> Any:
        try:
            return await call
        except ApiError as error:
            notes.append(f"{what} not read: {error.code} {error.reason}: {redacted_text(error.message)}")
            return None

    async with cluster(kubeconfig, context, namespace) as (client, chosen):
        version = await best_effort("server version", client.server_version())
        if name is not None:
            gcjs = [await get_guarded_cronjob(client, chosen, name)]
        else:
            gcjs = await client.list(GUARDED_CRONJOBS, chosen)
        owned: dict[str, list[dict[str, Any]]] = {}
        for resource in (CRONJOBS, JOBS, PODS):
            owned[resource.plural] = await best_effort(f"{resource.plural} in {chosen}", client.list(
                resource, chosen, label_selector=contract.LABEL_NAME)) or []
        events = await best_effort(f"events in {chosen}", client.list(EVENTS, chosen)) or []
        deployments = await best_effort(f"the operator Deployment ({OPERATOR_SELECTOR}, all namespaces)",
                                        client.list(DEPLOYMENTS, None, label_selector=OPERATOR_SELECTOR))
        if deployments == []:
            notes.append(f"no operator Deployment labelled {OPERATOR_SELECTOR} was found")
        logs: dict[str, list[str]] = {}
        for deployment in deployments or ():
            where = where_of(deployment)[0]
            match_labels = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            selector = ",".join(f"{key}={value}" for key, value in match_labels.items())
            for pod in await best_effort(f"the operator's pods in {where}",
                                         client.list(PODS, where, label_selector=selector)) or ():
                pod_name = where_of(pod)[1]
                text = await best_effort(f"the log of pod {where}/{pod_name}",
                                         client.pod_log(where, pod_name, tail_lines=LOG_LINES))
                if text is not None:
                    logs[f"{where}/{pod_name}"] = text.splitlines()
    return build_report(namespace=chosen, plugin_version=__version__, server_version=version,
                        guarded_cronjobs=gcjs, cronjobs=owned["cronjobs"], jobs=owned["jobs"],
                        pods=owned["pods"], events=events, deployments=deployments or [], logs=logs,
                        notes=notes, generated_at=datetime.now(UTC))


# --- pure: the report from what was read

def redacted_text(text: str) -> str:
    """`text` without PostgreSQL URIs, password settings or URLs' user:password@."""
    return _URL_CREDENTIALS.sub(r"\1" + REDACTED + "@", redaction.redact(text))


def redacted(value: Any) -> Any:
    """A copy of an API object (or any part) safe to share: env values, last-applied
    annotations and managedFields left out, every string passed through redacted_text."""
    if isinstance(value, str):
        return redacted_text(value)
    if isinstance(value, list):
        return [redacted(item) for item in value]
    if not isinstance(value, dict):
        return value
    copy: dict[str, Any] = {}
    for key, item in value.items():
        if key == "managedFields":
            continue
        if key == "env" and isinstance(item, list):
            item = [{**entry, "value": REDACTED} if isinstance(entry, dict) and "value" in entry else entry
                    for entry in item]
        elif key == "annotations" and isinstance(item, dict) and LAST_APPLIED in item:
            item = {**item, LAST_APPLIED: REDACTED}
        elif key in ("args", "command") and isinstance(item, list):
            item = redacted_arguments(item)
        copy[key] = redacted(item)
    return copy


def redacted_arguments(arguments: list[Any]) -> list[Any]:
    """A container's command or args with the value of every flag named like a secret
    hidden, given as the next argument or after `=`."""
    result: list[Any] = []
    hide_next = False
    for argument in arguments:
        if hide_next and isinstance(argument, str):
            result.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        flag, equals, _ = argument.partition("=") if isinstance(argument, str) else ("", "", "")
        if _SECRET_FLAG.match(flag):
            result.append(f"{flag}={REDACTED}" if equals else argument)
            hide_next = not equals
        else:
            result.append(argument)
    return result


def object_summary(obj: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = redacted({key: obj.get(key) for key in ("metadata", "spec", "status")})
    return summary


def pod_summary(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod without its spec: which containers ran which image, where, and its status."""
    spec = pod.get("spec") or {}
    containers = [{"name": c.get("name"), "image": c.get("image")}
                  for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]]
    summary: dict[str, Any] = redacted({"metadata": pod.get("metadata"), "nodeName": spec.get("nodeName"),
                                        "containers": containers, "status": pod.get("status")})
    return summary


def event_summary(event: dict[str, Any]) -> dict[str, Any]:
    involved = event.get("involvedObject") or {}
    summary: dict[str, Any] = redacted({
        "type": event.get("type"), "reason": event.get("reason"), "message": event.get("message"),
        "object": f"{involved.get('kind')}/{involved.get('name')}", "count": event.get("count"),
        "firstTimestamp": event.get("firstTimestamp"),
        "lastTimestamp": event.get("lastTimestamp") or event.get("eventTime")})
    return summary


def operator_summary(deployment: dict[str, Any]) -> dict[str, Any]:
    namespace, name = where_of(deployment)
    template = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {})
    return {"namespace": namespace, "name": name,
            "images": [c.get("image") for c in template.get("containers") or ()],
            "status": redacted(deployment.get("status"))}


def _labelled_for(objects: Iterable[dict[str, Any]], names: set[str]) -> list[dict[str, Any]]:
    return [obj for obj in objects
            if ((obj.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_NAME) in names]


def build_report(*, namespace: str, plugin_version: str, server_version: dict[str, Any] | None,
                 guarded_cronjobs: list[dict[str, Any]], cronjobs: list[dict[str, Any]],
                 jobs: list[dict[str, Any]], pods: list[dict[str, Any]], events: list[dict[str, Any]],
                 deployments: list[dict[str, Any]], logs: dict[str, list[str]], notes: list[str],
                 generated_at: datetime) -> dict[str, Any]:
    """The bundle: the objects that belong to the GuardedCronJobs, and the Events about
    any of them, the newest EVENTS_KEPT."""
    names = {where_of(gcj)[1] for gcj in guarded_cronjobs}
    cronjobs, jobs, pods = (_labelled_for(objects, names) for objects in (cronjobs, jobs, pods))
    involved = {(kind, where_of(obj)[1]) for kind, group in (
        (contract.KIND, guarded_cronjobs), ("CronJob", cronjobs), ("Job", jobs), ("Pod", pods))
        for obj in group}
    related = [event for event in events if (
        (event.get("involvedObject") or {}).get("kind"), (event.get("involvedObject") or {}).get("name"),
    ) in involved]
    related.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return {
        "kind": "GuardedCronJobSupportReport",
        "generatedAt": generated_at.isoformat(timespec="seconds"),
        "pluginVersion": plugin_version,
        "serverVersion": server_version,
        "namespace": namespace,
        "guardedCronJobs": [object_summary(gcj) for gcj in guarded_cronjobs],
        "cronJobs": [object_summary(cronjob) for cronjob in cronjobs],
        "jobs": [object_summary(job) for job in jobs],
        "pods": [pod_summary(pod) for pod in pods],
        "events": [event_summary(event) for event in related[-EVENTS_KEPT:]],
        "operator": {"deployments": [operator_summary(d) for d in deployments],
                     "logs": {pod: [redacted_text(line) for line in lines] for pod, lines in logs.items()}},
        "notes": notes,
    }
