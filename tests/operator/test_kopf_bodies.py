"""kopf keeps no body for a GuardedCronJob without a running timer, and the ones it
leaves behind are freed by the operator's own collection (guardedcron.handlers.kopf_startup,
guardedcron.cli.operator_memory; docs/benchmarks.md has the memory it saved).

kopf keeps an object's latest body for its timers and daemons whenever the resource has
any timer registered, and the catch-up timer is registered for every GuardedCronJob.
Here kopf (KopfRunner, the emulator) runs over GuardedCronJobs of which one uses
catch-up; the live kopf bodies are counted in this process's heap."""

from __future__ import annotations

import asyncio
import gc
import weakref
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kmock
import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.clients import watching
from kopf._cogs.structs import bodies
from kopf._core.reactor import processing

from guardedcron import contract, planner
from guardedcron.cli.operator_memory import Trim, trim_once
from guardedcron.handlers import kopf_startup
from guardedcron.kube import KubeClient
from tests.operator.passes import create_gcj, eventually, start_kopf
from tests.support.clock import FakeClock
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj, put

NS = "billing"
PLAIN = ("plain-a", "plain-b", "plain-c")
CATCHING_UP = "catching-up"
GCJ_RES, JOB_RES = "guardedcron.io/v1alpha1/guardedcronjobs", "batch/v1/jobs"
BODIES_LET_GO_SECONDS = 90.0  # a bound on the wait, not a timing


def live_bodies() -> dict[str, int]:
    """kopf bodies still reachable, by object name, after a full collection."""
    gc.collect()
    counts: dict[str, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, bodies.Body):
            name = str((obj.get("metadata") or {}).get("name"))
            counts[name] = counts.get(name, 0) + 1
    return counts


def ready(api: GuardedEmulator, name: str) -> bool:
    status = (api.object(GCJ_RES, NS, name) or {}).get("status") or {}
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", ()))


def make_up_jobs(api: GuardedEmulator) -> list[dict[str, Any]]:
    return [obj.raw for key, obj in api.objects.items()
            if key[0] == kmock.resource(JOB_RES) and not obj.deleted
            and (obj.raw["metadata"].get("annotations") or {}).get(contract.ANNOTATION_RUN_KIND)
            == contract.RUN_KIND_CATCH_UP]


async def test_kopf_keeps_bodies_only_for_objects_with_a_running_timer(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for module, name in ((aiotoggles, "ToggleSet"), (watching, "continuous_watch"),
                         (processing, "process_spawning_cause")):
        monkeypatch.setattr(module, name, getattr(module, name))  # restored afterwards
    kopf_startup.install()
    monkeypatch.setattr(planner, "TIMER_SECONDS", 0.5)
    plain = put(base_gcj(), "spec.schedule", "*/10 * * * *")
    for name in PLAIN:
        await create_gcj(client, put(plain, "metadata.name", name))
    catching_up = put(put(plain, "metadata.name", CATCHING_UP), "spec.timeZone", "UTC")
    await create_gcj(client, put(catching_up, "spec.catchUp", {"policy": "Latest", "windowSeconds": 3600}))
    clock = FakeClock(datetime.now(UTC))
    runner = start_kopf(NS, clock)
    try:
        await eventually(lambda: all(ready(api, name) for name in (*PLAIN, CATCHING_UP)), "all Ready")
        # Once each object's worker has ended (16 or 32 s after Ready here), only the
        # object whose timer runs keeps a body: without the fix, each of the others
        # keeps one for as long as it exists.
        deadline = asyncio.get_running_loop().time() + BODIES_LET_GO_SECONDS
        while set(live_bodies()) & set(PLAIN):
            assert asyncio.get_running_loop().time() < deadline, f"bodies kept: {live_bodies()}"
            await asyncio.sleep(0.5)
        assert live_bodies().get(CATCHING_UP, 0) >= 1  # its timer's body
        # And the timer still runs on it: a missed slot is made up with no event.
        clock.advance(minutes=40)
        [job] = await eventually(lambda: make_up_jobs(api), "a make-up Job")
        assert job["metadata"]["labels"][contract.LABEL_NAME] == CATCHING_UP
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)
    assert runner.exit_code == 0, runner.output


class Node:
    """A stand-in for kopf's Body and its views: an object in a reference cycle."""

    def __init__(self) -> None:
        self.view = [self]


async def test_a_trim_collects_dead_cycles_first() -> None:
    """A cycle no one refers to any more is freed at the next trim, even when CPython's
    own collection would not have started yet (here: not at all)."""
    gc.disable()
    try:
        node = Node()
        dead = weakref.ref(node)
        del node
        assert dead() is not None  # only a collection frees a cycle
        await trim_once(Trim("nothing", lambda: None))  # frees nothing: only the collection can
        assert dead() is None
    finally:
        gc.enable()
