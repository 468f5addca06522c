"""The operator's caches and its queue of passes (handlers/caches.py): what a watch event
stores, how often a key is queued, and when a pass runs again."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kopf
import pytest

from guardedcron import contract
from guardedcron.handlers import caches as caches_module
from guardedcron.handlers.caches import Caches, ObjectCache, PassQueue, prime, run_workers
from guardedcron.handlers.context import OperatorContext
from guardedcron.handlers.observe import index_job, lookup
from guardedcron.handlers.reconcile import run_queued_pass
from guardedcron.kube import GUARDED_CRONJOBS, KubeClient
from guardedcron.spec import Settings
from tests.operator.passes import SETTINGS, create_gcj
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj

NS, NAME = "billing", "nightly-invoices"


def job(name: str, owner: str, uid: str = "job-uid") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "uid": uid,
                         "labels": {contract.LABEL_NAME: owner, contract.LABEL_JOB_NAME: name}}}


def test_an_object_is_cached_under_its_owner_and_moves_or_goes_with_its_events() -> None:
    jobs = ObjectCache(index_job)
    jobs.store(job("a-1", "a"))
    assert [p.unpack()["metadata"]["name"] for p in jobs.get((NS, "a"))] == ["a-1"]
    jobs.store(job("a-1", "b"))  # relabelled: it belongs to another GuardedCronJob now
    assert list(jobs.get((NS, "a"))) == [] and len(list(jobs.get((NS, "b")))) == 1
    jobs.delete(job("a-1", "b"))
    assert list(jobs.get((NS, "b"))) == [] and len(jobs) == 0
    jobs.store({"metadata": {"name": "stray", "namespace": NS, "uid": "u"}})  # no owner label
    assert len(jobs) == 0


async def test_a_key_is_queued_once_until_its_pass_takes_it() -> None:
    queue = PassQueue()
    for _ in range(3):
        queue.add((NS, "a"))
    queue.add((NS, "b"))
    assert len(queue) == 2
    assert await queue.next() == (NS, "a")
    queue.add((NS, "a"))  # an event after its pass started: it runs again
    assert [await queue.next(), await queue.next()] == [(NS, "b"), (NS, "a")]


async def test_a_pass_runs_again_after_the_delay_it_returns_or_after_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(caches_module, "RETRY_SECONDS", 0.05)
    queue, runs = PassQueue(), []

    async def run(key: tuple[str, str]) -> float | None:
        runs.append(key)
        if len(runs) == 1:
            raise RuntimeError("the API server hiccupped")
        return 0.05 if len(runs) == 2 else None

    workers = asyncio.create_task(run_workers(queue, run, count=2))
    queue.add((NS, "a"))
    for _ in range(100):
        if len(runs) >= 3:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)  # the third said "not again": no fourth
    workers.cancel()
    await asyncio.gather(workers, return_exceptions=True)
    assert runs == [(NS, "a")] * 3


async def test_priming_lists_every_cached_resource_in_pages(api: GuardedEmulator, client: KubeClient,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from guardedcron.kube import client as kube_client
    monkeypatch.setattr(kube_client, "LIST_PAGE_SIZE", 2)
    for index in range(5):
        body = copy.deepcopy(base_gcj())
        body["metadata"]["name"] = f"job-{index}"
        await create_gcj(client, body)
    caches = Caches()
    await prime(caches, client, (NS,))
    assert len(caches.guarded_cronjobs) == 5
    assert lookup(caches.guarded_cronjobs, (NS, "job-3")) is not None


async def test_a_queued_pass_for_a_guardedcronjob_gone_unseen_forgets_it(
        api: GuardedEmulator, client: KubeClient) -> None:
    context = OperatorContext(client=client, settings=Settings(build=SETTINGS))
    caches = Caches()
    stored = await create_gcj(client, base_gcj())
    caches.guarded_cronjobs.store(stored)
    await client.delete(GUARDED_CRONJOBS, NS, NAME)  # no watch tells the caches
    again = await run_queued_pass((NS, NAME), context=context, caches=caches,
                                  settings=kopf.OperatorSettings())
    assert again is None
    assert lookup(caches.guarded_cronjobs, (NS, NAME)) is None
