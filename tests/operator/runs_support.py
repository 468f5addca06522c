"""Runs in the emulator: Jobs and Pods shaped as the API server returns them (from
tests/support/status_objects.py), stored through the API, and a pass that sees them the
way the operator's indexes do (every owned Job and Pod of the GuardedCronJob)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from guardedcron import contract
from guardedcron.handlers.context import OperatorContext, PassMemory
from guardedcron.handlers.observe import Observed, trimmed
from guardedcron.handlers.reconcile import PassResult, reconcile
from guardedcron.kube import JOBS, PODS, KubeClient
from guardedcron.spec import Settings
from tests.operator.passes import SETTINGS, observe_api

OWNED_SELECTOR = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY_VALUE}"


async def store_run(client: KubeClient, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
    """POST a crafted Job and its pods (status included, as the controllers would leave it)."""
    namespace = job["metadata"]["namespace"]
    await client.create(JOBS, namespace, _without_server_fields(job))
    for pod in pods:
        await client.create(PODS, namespace, _without_server_fields(pod))


async def observe_everything(client: KubeClient, namespace: str, name: str) -> Observed:
    base = await observe_api(client, namespace, name)
    selector = f"{OWNED_SELECTOR},{contract.LABEL_NAME}={name}"
    jobs = [trimmed(j) for j in await client.list(JOBS, namespace, label_selector=selector)]
    by_job: dict[str, list[dict[str, Any]]] = {}
    for pod in await client.list(PODS, namespace, label_selector=selector):
        by_job.setdefault(pod["metadata"]["labels"][contract.LABEL_JOB_NAME], []).append(trimmed(pod))
    return Observed(gcj=base.gcj, cronjob=base.cronjob, jobs=jobs, pods_by_job=by_job)


async def full_pass(client: KubeClient, namespace: str, name: str, *, now: datetime,
                    memory: PassMemory, stop_workload: bool = False,
                    outcome_recording: bool = False) -> PassResult:
    settings = Settings(build=SETTINGS, stop_workload=stop_workload, outcome_recording=outcome_recording)
    context = OperatorContext(client=client, settings=settings, memory=memory)
    return await reconcile(await observe_everything(client, namespace, name), context, now,
                           logging.getLogger("tests.operator"))


def _without_server_fields(body: dict[str, Any]) -> dict[str, Any]:
    metadata = {k: v for k, v in body["metadata"].items()
                if k not in ("resourceVersion", "generation", "creationTimestamp")}
    return {**body, "metadata": metadata}
