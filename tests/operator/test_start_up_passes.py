"""What the operator does per object when it starts over many: passes in flight are
bounded, and a listed child (CronJob, Job, Pod) gets no pass of its own when its
GuardedCronJob's pass reads it from the cache anyway."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from typing import Any

from guardedcron.handlers.caches import ObjectCache
from guardedcron.handlers.context import OperatorContext
from guardedcron.handlers.observe import index_by_name
from guardedcron.handlers.reconcile import _listed_and_seen, run_pass
from guardedcron.kube import KubeClient, Resource
from guardedcron.spec import Settings
from tests.operator.passes import SETTINGS, create_gcj, observe_api
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj, put

NS = "billing"
KEY = (NS, "nightly")
UID = "gcj-uid"


class CountingClient(KubeClient):
    """The real client, counting the applies in flight at once."""

    in_flight = 0
    most = 0

    async def apply(self, resource: Resource, body: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
        CountingClient.in_flight += 1
        CountingClient.most = max(CountingClient.most, CountingClient.in_flight)
        try:
            await asyncio.sleep(0.05)  # an API server under load: passes overlap
            return await super().apply(resource, body, **kw)
        finally:
            CountingClient.in_flight -= 1


async def test_passes_in_flight_are_bounded(api: GuardedEmulator, client: KubeClient) -> None:
    names = [f"job-{i}" for i in range(8)]
    for name in names:
        await create_gcj(client, put(base_gcj(), "metadata.name", name))
    observed = [await observe_api(client, NS, name) for name in names]
    counting = CountingClient(client._info)
    context = OperatorContext(client=counting, settings=Settings(build=SETTINGS),
                              passes=asyncio.Semaphore(3))
    logger = logging.getLogger("tests.operator")
    try:
        await asyncio.gather(*(run_pass(functools.partial(lambda o: o, o), uid=o.gcj["metadata"]["uid"],
                                        context=context, logger=logger) for o in observed))
    finally:
        await counting.close()
    assert all(api.object("batch/v1/cronjobs", NS, name) for name in names)
    assert CountingClient.most == 3  # unbounded, all 8 applied at once


def cache_with(body: dict[str, Any]) -> ObjectCache:
    cache = ObjectCache(index_by_name)
    cache.store({**body, "metadata": {**body["metadata"], "uid": "cronjob-uid"}})
    return cache


def test_a_listed_child_is_left_to_its_guardedcronjobs_pass() -> None:
    context = OperatorContext(client=KubeClient(), settings=Settings(build=SETTINGS))
    cronjobs = cache_with({"metadata": {"name": "nightly", "namespace": NS}})

    # Start-up: its GuardedCronJob's first pass is still to come (kopf's resume), and
    # reads the cache: no pass for the listed CronJob.
    assert _listed_and_seen(None, UID, context, (cronjobs,), KEY)
    # A watch event (not a listing) always gets its pass.
    assert not _listed_and_seen("MODIFIED", UID, context, (cronjobs,), KEY)
    # The GuardedCronJob's pass started after the CronJob was cached: it saw it.
    context.memory.pass_starting(UID)
    assert _listed_and_seen(None, UID, context, (cronjobs,), KEY)

    # A watch that started over lists the CronJob again, after the last pass: the pass
    # has not seen this version (it may have been edited in the gap), so it gets one.
    cronjobs.store({"metadata": {"name": "nightly", "namespace": NS, "uid": "cronjob-uid",
                                 "resourceVersion": "9"}})
    assert not _listed_and_seen(None, UID, context, (cronjobs,), KEY)
