"""Fixtures for the operator's tests: the extended API emulator, a client pointed at
it, a clock the test sets, and helpers that run one reconcile pass the way the
operator does (the objects read from the API server, not from the test's memory)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import kmock
import kopf
import pytest

from guardedcron.handlers.context import OperatorContext, PassMemory
from guardedcron.handlers.observe import Observed, trimmed
from guardedcron.handlers.reconcile import PassResult, reconcile
from guardedcron.kube import CRONJOBS, GUARDED_CRONJOBS, KubeClient, NotFound
from guardedcron.spec import OperatorSettings, Settings, settings_from_env
from tests.operator.emulator import GuardedEmulator

SETTINGS: OperatorSettings = settings_from_env({})
# A winter Friday noon: "30 2 * * *" in Europe/Stockholm (UTC+1) fires next at 01:30Z.
T0 = datetime(2025, 1, 10, 12, 0, tzinfo=UTC)


class FakeClock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture
async def api() -> AsyncIterator[GuardedEmulator]:
    async with GuardedEmulator() as emulator, kmock.Server(emulator):
        emulator.declare_resources()
        yield emulator


@pytest.fixture
async def client(api: GuardedEmulator) -> AsyncIterator[KubeClient]:
    kube = KubeClient(kopf.ConnectionInfo(server=server_url(api)))
    yield kube
    await kube.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


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
                   settings: OperatorSettings = SETTINGS) -> PassResult:
    """A pass as the operator runs it; a new PassMemory is an operator just started."""
    context = OperatorContext(client=client, settings=Settings(build=settings),
                              memory=memory or PassMemory())
    return await reconcile(await observe_api(client, namespace, name), context, now,
                           logging.getLogger("tests.operator"))
