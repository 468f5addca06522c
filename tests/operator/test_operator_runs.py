"""The whole operator (kopf, its watches and indexes, the handlers) against the
extended API emulator: once under kopf's own `KopfRunner`, once as `guardedcron
operator` runs it (`run_operator`), restarted over up-to-date objects.

kopf reaches the emulator the way it reaches a cluster from a laptop: through a
kubeconfig (`$KUBECONFIG`) read by the operator's login handler.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kopf.testing import KopfRunner

from guardedcron import contract
from guardedcron.cli.operator import run_operator
from guardedcron.handlers.context import OperatorContext
from guardedcron.handlers.registry import build_registry
from guardedcron.kube import CRONJOBS, GUARDED_CRONJOBS, KubeClient
from guardedcron.spec import Settings
from tests.operator.passes import SETTINGS, create_gcj, eventually
from tests.support.clock import FakeClock
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj, put

NS = "billing"
GCJ_RES, CJ_RES = "guardedcron.io/v1alpha1/guardedcronjobs", "batch/v1/cronjobs"


def ready(api: GuardedEmulator, name: str) -> bool:
    obj = api.object(GCJ_RES, NS, name) or {}
    return any(c["type"] == "Ready" and c["status"] == "True" and
               c["observedGeneration"] == obj["metadata"]["generation"]
               for c in obj.get("status", {}).get("conditions", ()))


def guard_first(cronjob: dict[str, Any] | None) -> bool:
    if cronjob is None:
        return False
    init = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"].get("initContainers") or []
    return bool(init) and init[0]["name"] == contract.GUARD_CONTAINER


async def test_kopf_runner_creates_repairs_and_updates(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path) -> None:
    await create_gcj(client, put(base_gcj(), "metadata.name", "invoices"))
    await create_gcj(client, put(put(base_gcj(), "metadata.name", "broken"), "spec.schedule", "61 * * * *"))
    context = OperatorContext(client=KubeClient(), clock=FakeClock(),
                              settings=Settings(build=SETTINGS, namespaces=(NS,)))
    runner = KopfRunner(["run", "--standalone", "--namespace", NS], registry=build_registry(context),
                        timeout=30)
    runner.__enter__()
    try:
        await eventually(lambda: ready(api, "invoices"), "the CronJob applied and Ready")
        owner = api.object(GCJ_RES, NS, "invoices")
        cronjob = api.object(CJ_RES, NS, "invoices")
        assert cronjob is not None and owner is not None
        assert cronjob["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
        broken = await eventually(lambda: (api.object(GCJ_RES, NS, "broken") or {}).get("status"),
                                  "the invalid one's status")
        assert [c["status"] for c in broken["conditions"] if c["type"] == "Invalid"] == ["True"]
        assert api.object(CJ_RES, NS, "broken") is None

        # Edited by hand: the watch on owned CronJobs brings the guard back.
        await client.merge_patch(CRONJOBS, NS, "invoices", {"spec": {"jobTemplate": {"spec": {
            "template": {"spec": {"initContainers": []}}}}}})
        await eventually(lambda: guard_first(api.object(CJ_RES, NS, "invoices")), "the guard restored")

        # Deleted by hand: applied again.
        await client.delete(CRONJOBS, NS, "invoices")
        await eventually(lambda: api.object(CJ_RES, NS, "invoices"), "the CronJob created again")

        # The spec changes: the CronJob follows.
        await client.merge_patch(GUARDED_CRONJOBS, NS, "invoices", {"spec": {"schedule": "*/5 * * * *"}})
        await eventually(lambda: (api.object(CJ_RES, NS, "invoices") or {})
                         .get("spec", {}).get("schedule") == "*/5 * * * *", "the schedule updated")
        await eventually(lambda: ready(api, "invoices"), "Ready at generation 2")
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_guardedcron_operator_restarted_over_up_to_date_objects_writes_nothing(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    names = [f"job-{i}" for i in range(5)]
    for name in names:
        await create_gcj(client, put(base_gcj(), "metadata.name", name))
    # Still invalid after the restart: its SpecInvalid Event is not posted again.
    await create_gcj(client, put(put(base_gcj(), "metadata.name", "broken"), "spec.timeZone", "Mars/Base"))
    metrics_port, health_port = free_port(), free_port()
    settings = Settings(build=SETTINGS, namespaces=(), peering=None, priority=0, metrics_port=metrics_port,
                        log_level="info", liveness=f"http://127.0.0.1:{health_port}/healthz")

    async def run_until(check: Callable[[], Any], what: str) -> None:
        stop, started = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(run_operator(settings, stop_flag=stop, ready_flag=started))
        try:
            await eventually(lambda: started.is_set() or task.done(), "the operator started")
            await eventually(check, what)
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{health_port}/healthz") as health:
                    assert health.status == 200
                async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as scrape:
                    assert "guardedcron_reconcile_duration_seconds_count" in await scrape.text()
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)

    await run_until(lambda: all(ready(api, n) for n in names)
                    and (api.object(GCJ_RES, NS, "broken") or {}).get("status"), "every status written")
    first_run_writes = api.writes()
    since = len(api.requests_list())
    caplog.clear()

    await run_until(lambda: sum("Resuming is processed" in r.getMessage() for r in caplog.records)
                    >= len(names) + 1, "every GuardedCronJob resumed")
    await asyncio.sleep(0.5)  # let any late write show

    assert api.writes(since) == []
    # On create: per object one apply and one status write; nothing else (kopf's record
    # of the spec it handled stays in memory: handlers/handled.py).
    per_object = {n: [r for r in first_run_writes if n in r.url.path] for n in names}
    for name, writes in per_object.items():
        assert sorted((r.method.value, r.url.path.rsplit("/", 1)[-1]) for r in writes) == sorted([
            ("PATCH", name), ("PATCH", "status")]), name
