"""`guardedcron trigger NAME [-n NAMESPACE]`: start a manual run of a GuardedCronJob now.

Like `kubectl create job --from=cronjob/NAME`: a Job from the CronJob the operator
made, so the guard init container is in it and the run is guarded like any other
(it takes the lease; no slot, so it does not stand for a scheduled run). The Job is
named `<name>-manual-<5 random characters>` and marked manual.

Credentials: the kubeconfig's context (`--kubeconfig`, else `$KUBECONFIG`, else
`~/.kube/config`; `--context`, else the current one), loaded by the official
`kubernetes` client's loader (exec credential plugins, OIDC, tokens, certificates), else
the pod's service account; the calls go through the operator's own API client, so errors
carry the API server's words (see guardedcron.cli.kubeconfig).

Answer: one JSON line on stdout (`namespace`, `guarded_cronjob`, `job`). Exit 0 when
the Job was created; 1 when the API server refused or something is missing (nothing
created); 64 bad input; 69 the API server could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
from typing import Any

from guardedcron import contract
from guardedcron.builders.manual import (
    STARTED_BY_CLI,
    ManualRunError,
    build_manual_job,
    manual_job_name,
    suffix_from_bytes,
)
from guardedcron.cli.cluster_options import add_cluster_options, reported_name_problems
from guardedcron.cli.kubeconfig import KubeconfigError, connection_info
from guardedcron.contract import EXIT_FAILURE, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from guardedcron.kube import (
    CRONJOBS,
    GUARDED_CRONJOBS,
    JOBS,
    ApiError,
    ApiUnreachable,
    Conflict,
    KubeClient,
    NotFound,
)
from guardedcron.objects import controlled_by, uid_of

FIELD_MANAGER = "guardedcron-trigger"
# A random suffix already taken (one in millions) gets another; more is not chance.
CREATE_ATTEMPTS = 3


class TriggerFailed(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


def add_parser(sub: Any, name: str, help_text: str) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help_text, description=help_text,
        epilog="Uses the current kubeconfig context ($KUBECONFIG or ~/.kube/config; exec "
               "credential plugins and OIDC included), else the pod's service account. "
               "GitOps alternative: set the annotation guardedcron.io/trigger on the "
               "GuardedCronJob to a new value.")
    parser.add_argument("name", metavar="NAME", help="the GuardedCronJob")
    add_cluster_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if reported_name_problems(getattr(args, "prog", "guardedcron trigger"), args.name, args.namespace):
        return EXIT_USAGE
    try:
        answer = asyncio.run(trigger(args.name, args.namespace, args.kubeconfig, args.context))
    except TriggerFailed as error:
        print(f"{getattr(args, 'prog', 'guardedcron trigger')}: {error}", file=sys.stderr)
        return error.code
    if getattr(args, "output", "json") == "json":
        print(json.dumps(answer, separators=(",", ":")))
    else:  # kubectl's words for a created object
        print(f"job.batch/{answer['job']} created")
    return EXIT_OK


async def trigger(name: str, namespace: str | None, kubeconfig: str | None = None,
                  context: str | None = None) -> dict[str, str]:
    """Create the manual Job; the answer names it. Raises TriggerFailed with the reason."""
    try:
        info = await asyncio.to_thread(connection_info, kubeconfig, context)
    except KubeconfigError as error:
        raise TriggerFailed(str(error), error.code) from None
    namespace = namespace or info.default_namespace or "default"
    client = KubeClient(info)
    try:
        job = await _create(client, namespace, name)
    finally:
        await client.close()
    return {"namespace": namespace, "guarded_cronjob": name, "job": job}


async def _create(client: KubeClient, namespace: str, name: str) -> str:
    where = f"{namespace}/{name}"
    try:
        try:
            gcj = await client.get(GUARDED_CRONJOBS, namespace, name)
        except NotFound as error:
            if error.details.get("name") != name and "could not find the requested resource" in error.message:
                # The API server's words when the type itself is not served.
                raise TriggerFailed(f"the API server does not serve {contract.PLURAL}."
                                    f"{contract.API_GROUP}: is the GuardedCronJob CRD installed?") from None
            raise TriggerFailed(f"GuardedCronJob {where} not found") from None
        try:
            cronjob = await client.get(CRONJOBS, namespace, name)
        except NotFound:
            raise TriggerFailed(f"CronJob {where} does not exist: is the operator running? "
                                f"({_ready_message(gcj)})") from None
        if not controlled_by(cronjob, uid_of(gcj)):
            raise TriggerFailed(f"CronJob {where} is not controlled by GuardedCronJob {where}; "
                                "refusing to run a job guardedcron did not build") from None
        for _ in range(CREATE_ATTEMPTS):
            job_name = manual_job_name(name, suffix_from_bytes(secrets.token_bytes(5)))
            try:
                job = build_manual_job(cronjob, job_name=job_name, started_by=STARTED_BY_CLI)
            except ManualRunError as error:
                raise TriggerFailed(f"CronJob {where} cannot give a guarded run: {error} "
                                    "(is the operator up to date?)") from None
            try:
                await client.create(JOBS, namespace, job, field_manager=FIELD_MANAGER)
            except Conflict:
                continue
            return job_name
        raise TriggerFailed(f"{CREATE_ATTEMPTS} random Job names for {where} were all taken")
    except ApiUnreachable as error:
        raise TriggerFailed(f"cannot reach the API server: {error}", EXIT_UNAVAILABLE) from None
    except ApiError as error:
        raise TriggerFailed(_refusal(error)) from None


def _refusal(error: ApiError) -> str:
    if error.code == 401:
        return f"the API server refused the kubeconfig context's credentials ({error.message})"
    if error.code == 403:
        return (f"not allowed: {error.message} (a manual run needs get on guardedcronjobs and "
                "cronjobs and create on jobs in the namespace)")
    return f"the API server refused: {error}"


def _ready_message(gcj: dict[str, Any]) -> str:
    for condition in (gcj.get("status") or {}).get("conditions") or ():
        if isinstance(condition, dict) and condition.get("type") == "Ready":
            return f"Ready is {condition.get('status')}: {condition.get('message')}"
    return "the GuardedCronJob has no status yet"
