"""One reconcile pass the way the operator runs it (the objects read from the API server,
not from the test's memory), and the calls that set up a GuardedCronJob on the emulator."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kopf.testing import KopfRunner

from guardedcron.handlers.context import Clock, OperatorContext, PassMemory
from guardedcron.handlers.observe import Observed, trimmed
from guardedcron.handlers.reconcile import PassResult, reconcile
from guardedcron.handlers.registry import build_registry
from guardedcron.kube import CRONJOBS, GUARDED_CRONJOBS, KubeClient, NotFound
from guardedcron.spec import OperatorSettings, Settings, settings_from_env
from guardedcron.spec.locks import SharedLock
from tests.support.emulator import GuardedEmulator

SETTINGS: OperatorSettings = settings_from_env({})
WAIT_SECONDS = 20  # for `eventually`: what a running operator does, on a loaded machine


def server_url(api: GuardedEmulator) -> str:
    return str(api.url).rstrip("/")


async def create_gcj(client: KubeClient, obj: dict[str, Any]) -> dict[str, Any]:
    """POST the GuardedCronJob; the emulator gives it a uid and generation 1."""
    body = {k: v for k, v in obj.items() if k != "status"}
    body["metadata"] = {k: v for k, v in obj["metadata"].items() if k not in ("uid", "generation")}
    return await client.create(GUARDED_CRONJOBS, obj["metadata"]["namespace"], body)


async def observe_api(client: KubeClient, namespace: str, name: str) -> Observed:
    gcj = await client.get(GUARDED_CRONJOBS, namespace, name)
    try:
        cronjob: dict[str, Any] | None = trimmed(await client.get(CRONJOBS, namespace, name))
    except NotFound:
        cronjob = None
    return Observed(gcj=trimmed(gcj), cronjob=cronjob)


async def one_pass(client: KubeClient, namespace: str, name: str, *, now: datetime,
                   memory: PassMemory | None = None,
                   settings: OperatorSettings = SETTINGS,
                   shared_locks: tuple[SharedLock, ...] = ()) -> PassResult:
    """A pass as the operator runs it; a new PassMemory is an operator just started;
    `shared_locks` is the cluster admin's allow-list."""
    context = OperatorContext(client=client,
                              settings=Settings(build=settings, shared_locks=shared_locks),
                              memory=memory or PassMemory())
    return await reconcile(await observe_api(client, namespace, name), context, now,
                           logging.getLogger("tests.operator"))


async def eventually(check: Callable[[], Any], what: str) -> Any:
    """`check()`'s first truthy answer, polled while the operator runs; fails after WAIT_SECONDS."""
    deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
    while True:
        result = check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def start_kopf(namespace: str, clock: Clock, *, timeout: float = 60) -> KopfRunner:
    """kopf with guardedcron's handlers over `namespace` (KopfRunner: its own thread and
    loop), `clock` injected; started, for the caller to exit."""
    context = OperatorContext(client=KubeClient(), clock=clock,
                              settings=Settings(build=SETTINGS, namespaces=(namespace,)))
    runner = KopfRunner(["run", "--standalone", "--namespace", namespace],
                        registry=build_registry(context), timeout=timeout)
    runner.__enter__()
    return runner
