"""kopf's handlers for the operator: each a one-liner calling a plain function.

`build_registry(context)` registers them into a fresh registry with the context
bound, so the operator, kopf's test runner and the tests each get their own, with
their own client and clock, and nothing is registered at import time.

Indexes (kopf keeps them in memory from its watches, and starts handlers only once
each is filled): every GuardedCronJob, and the CronJobs, Jobs and Pods labelled as
guardedcron's. Deletion needs no handler: the CronJob's controller owner reference
lets the garbage collector delete it (and its Jobs and Pods) after the GuardedCronJob,
so no finalizer holds the GuardedCronJob back.
"""

from __future__ import annotations

from typing import Any

import kopf

from guardedcron import contract, planner
from guardedcron.handlers import observe, reconcile
from guardedcron.handlers.context import OperatorContext
from guardedcron.handlers.handled import HandledEssences
from guardedcron.handlers.observe import Key, Packed

GCJ = (contract.API_GROUP, contract.API_VERSION, contract.PLURAL)
OWNED = {contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE}
RETRY_BACKOFF_SECONDS = 15  # kopf's default (60 s) is long for an API server hiccup


def _deleted(*, event: kopf.RawEvent, **_: Any) -> bool:
    return event.get("type") == "DELETED"


def build_registry(context: OperatorContext) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    client = context.client
    handled = HandledEssences()  # kopf's last handled essences, this registry's own

    @kopf.on.login(id="login", registry=registry)
    async def login(*, settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo | None:
        return await reconcile.login(client, settings)

    @kopf.on.startup(id="configure", registry=registry)
    async def configure(*, settings: kopf.OperatorSettings, **_: Any) -> None:
        reconcile.configure_kopf(settings, namespaced=bool(context.settings.namespaces), handled=handled)

    @kopf.on.cleanup(id="close", registry=registry)
    async def close(**_: Any) -> None:
        await client.close()

    @kopf.index(*GCJ, id="guarded_cronjobs", registry=registry)
    async def guarded_cronjobs(*, body: kopf.Body, **_: Any) -> dict[Key, Packed]:
        return observe.index_by_name(body)

    @kopf.index("batch", "v1", "cronjobs", id="owned_cronjobs", labels=OWNED, registry=registry)
    async def owned_cronjobs(*, body: kopf.Body, **_: Any) -> dict[Key, Packed]:
        # By its own name, the GuardedCronJob's: another CronJob carrying the labels
        # under another name must not stand in for it.
        return observe.index_by_name(body)

    @kopf.index("batch", "v1", "jobs", id="owned_jobs", labels=OWNED, registry=registry)
    async def owned_jobs(*, body: kopf.Body, **_: Any) -> dict[Key, Packed]:
        return observe.index_job(body)

    @kopf.index("", "v1", "pods", id="owned_pods", labels=OWNED, registry=registry)
    async def owned_pods(*, body: kopf.Body, **_: Any) -> dict[Key, Packed]:
        return observe.index_pod(body)

    @kopf.on.resume(*GCJ, id="reconcile", registry=registry, backoff=RETRY_BACKOFF_SECONDS)
    @kopf.on.create(*GCJ, id="reconcile", registry=registry, backoff=RETRY_BACKOFF_SECONDS)
    @kopf.on.update(*GCJ, id="reconcile", registry=registry, backoff=RETRY_BACKOFF_SECONDS)
    async def reconcile_guarded_cronjob(*, body: kopf.Body, logger: kopf.Logger, **kw: Any) -> None:
        # kopf passes each index as a keyword named after its id.
        await reconcile.reconcile_guarded_cronjob(body, context=context, cronjobs=kw["owned_cronjobs"],
                                                  jobs=kw["owned_jobs"], pods=kw["owned_pods"], logger=logger)

    # Catch-up and backfill need a pass when nothing else happens: a slot
    # missed while the CronJob controller was down, or an attempt due for its retry,
    # makes no event. Only GuardedCronJobs that use them get this timer.
    @kopf.timer(*GCJ, id="past_slots", registry=registry, interval=planner.TIMER_SECONDS,
                initial_delay=planner.TIMER_SECONDS, when=planner.wants_timer)
    async def past_slots(*, body: kopf.Body, logger: kopf.Logger, **kw: Any) -> None:
        await reconcile.reconcile_guarded_cronjob(body, context=context, cronjobs=kw["owned_cronjobs"],
                                                  jobs=kw["owned_jobs"], pods=kw["owned_pods"], logger=logger)

    @kopf.on.event(*GCJ, id="forget_deleted", registry=registry, when=_deleted)
    async def forget_deleted(*, event: kopf.RawEvent, **_: Any) -> None:
        reconcile.forget_deleted(event, context=context, handled=handled)

    @kopf.on.event("batch", "v1", "cronjobs", id="repair_cronjob", labels=OWNED, registry=registry)
    async def repair_cronjob(*, event: kopf.RawEvent, logger: kopf.Logger, **kw: Any) -> None:
        await reconcile.repair_cronjob(event, context=context, guarded_cronjobs=kw["guarded_cronjobs"],
                                       cronjobs=kw["owned_cronjobs"], jobs=kw["owned_jobs"],
                                       pods=kw["owned_pods"], logger=logger)

    # Runs start, end and get skipped without the CronJob changing (manual runs, failed
    # runs outside the CronJob controller's active list), so their Jobs and Pods wake a
    # pass too. The pass reads the indexes and writes status only when it changed.
    @kopf.on.event("batch", "v1", "jobs", id="observe_job", labels=OWNED, registry=registry)
    @kopf.on.event("", "v1", "pods", id="observe_pod", labels=OWNED, registry=registry)
    async def observe_run(*, body: kopf.Body, event: kopf.RawEvent, logger: kopf.Logger, **kw: Any) -> None:
        await reconcile.refresh_run_status(body, context=context, guarded_cronjobs=kw["guarded_cronjobs"],
                                           cronjobs=kw["owned_cronjobs"], jobs=kw["owned_jobs"],
                                           pods=kw["owned_pods"], logger=logger,
                                           event_type=event.get("type"))

    return registry
