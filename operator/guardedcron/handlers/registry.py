"""kopf's handlers for the operator: each a one-liner calling a plain function.

`build_registry(context)` registers them into a fresh registry with the context
bound, so the operator, kopf's test runner and the tests each get their own, with
their own client, clock, caches and queue, and nothing is registered at import time.

Watches feed the caches (handlers/caches.py): every GuardedCronJob, and the CronJobs,
Jobs and Pods labelled as guardedcron's; a handler stores the object and queues its
GuardedCronJob's pass, and the queue's workers run the passes. Deletion needs no
handler: the CronJob's controller owner reference lets the garbage collector delete it
(and its Jobs and Pods) after the GuardedCronJob, so no finalizer holds it back.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import kopf

from guardedcron import contract, planner
from guardedcron.handlers import reconcile
from guardedcron.handlers.caches import Caches, PassQueue, prime, run_workers
from guardedcron.handlers.context import OperatorContext
from guardedcron.handlers.handled import HandledEssences

GCJ = (contract.API_GROUP, contract.API_VERSION, contract.PLURAL)
OWNED = {contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE}


def build_registry(context: OperatorContext) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    client = context.client
    handled = HandledEssences()  # kopf's last handled essences, this registry's own

    caches, queue = Caches(), PassQueue()
    workers: list[asyncio.Task[None]] = []

    @kopf.on.login(id="login", registry=registry)
    async def login(*, settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo | None:
        info = await reconcile.login(client, settings)
        if info is not None and not workers:  # once: before kopf's watches start
            await prime(caches, client, context.settings.namespaces or (None,))
            workers.append(asyncio.create_task(run_workers(queue, partial(
                reconcile.run_queued_pass, context=context, caches=caches, settings=settings))))
        return info

    @kopf.on.startup(id="configure", registry=registry)
    async def configure(*, settings: kopf.OperatorSettings, **_: Any) -> None:
        reconcile.configure_kopf(settings, namespaced=bool(context.settings.namespaces), handled=handled)

    @kopf.on.cleanup(id="close", registry=registry)
    async def close(**_: Any) -> None:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await client.close()

    @kopf.on.event(*GCJ, id="cache_guarded_cronjob", registry=registry)
    async def cache_guarded_cronjob(*, event: kopf.RawEvent, **_: Any) -> None:
        reconcile.store_guarded_cronjob(event, context=context, caches=caches, handled=handled)

    @kopf.on.resume(*GCJ, id="reconcile", registry=registry)
    @kopf.on.create(*GCJ, id="reconcile", registry=registry)
    @kopf.on.update(*GCJ, id="reconcile", registry=registry)
    async def reconcile_guarded_cronjob(*, body: kopf.Body, **_: Any) -> None:
        reconcile.queue_pass(body, queue=queue)

    # Catch-up and backfill need a pass when nothing else happens: a slot missed while
    # the CronJob controller was down, or an attempt due for its retry, makes no event.
    # Only GuardedCronJobs that use them get this timer.
    @kopf.timer(*GCJ, id="past_slots", registry=registry, interval=planner.TIMER_SECONDS,
                initial_delay=planner.TIMER_SECONDS, when=planner.wants_timer)
    async def past_slots(*, body: kopf.Body, **_: Any) -> None:
        reconcile.queue_pass(body, queue=queue)

    @kopf.on.event("batch", "v1", "cronjobs", id="repair_cronjob", labels=OWNED, registry=registry)
    async def repair_cronjob(*, event: kopf.RawEvent, **_: Any) -> None:
        await reconcile.repair_cronjob(event, context=context, caches=caches, queue=queue)

    # Runs start, end and get skipped without the CronJob changing (manual runs, failed
    # runs outside the CronJob controller's active list), so their Jobs and Pods queue a
    # pass too. The pass reads the caches and writes status only when it changed.
    @kopf.on.event("batch", "v1", "jobs", id="observe_job", labels=OWNED, registry=registry)
    async def observe_job(*, event: kopf.RawEvent, **_: Any) -> None:
        reconcile.refresh_run_status(event, caches.jobs, context=context, caches=caches, queue=queue)

    @kopf.on.event("", "v1", "pods", id="observe_pod", labels=OWNED, registry=registry)
    async def observe_pod(*, event: kopf.RawEvent, **_: Any) -> None:
        reconcile.refresh_run_status(event, caches.pods, context=context, caches=caches, queue=queue)

    return registry
