"""Which writes a restart makes over up-to-date objects: none, unless time moved a status.

The 5,000-object benchmark of issue 3 counted 42 writes on a restart meant to be idle.
They were its schedules, not the operator: `M H * * *` over 5,000 objects makes 120
distinct fire times (41 or 42 objects each), the restart lasted 408 s, and one fire
time (05:17 Europe/Stockholm, holding 42 objects) fell inside it. With no CronJob
controller in the emulator nothing ran, but each of those 42 statuses had to say that
the next fire time is now a day later: 42 status writes, each needed. These tests hold
both halves: a restart over up-to-date objects writes nothing, and a restart after a
fire time writes exactly one status patch for each object whose fire time passed,
changing `nextScheduleTime` alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner

from guardedcron.handlers.context import OperatorContext
from guardedcron.handlers.registry import build_registry
from guardedcron.kube import KubeClient
from guardedcron.spec import Settings
from tests.operator.passes import SETTINGS, create_gcj, eventually
from tests.support.clock import FakeClock
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj, put

NS = "billing"
GCJ_RES = "guardedcron.io/v1alpha1/guardedcronjobs"
QUIET = [f"yearly-{i}" for i in range(8)]  # fire on the 1st of January only
DUE = ["lunch-a", "lunch-b"]  # 13:05 in Europe/Stockholm: 12:05Z, five minutes after T0
RESUMED = "Resuming is processed"


def ready(api: GuardedEmulator, name: str) -> bool:
    status = (api.object(GCJ_RES, NS, name) or {}).get("status") or {}
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", ()))


@contextmanager
def operator(clock: FakeClock) -> Iterator[KopfRunner]:
    """A new operator process as far as the handlers know: its own context and memory."""
    context = OperatorContext(client=KubeClient(), clock=clock,
                              settings=Settings(build=SETTINGS, namespaces=(NS,)))
    runner = KopfRunner(["run", "--standalone", "--namespace", NS],
                        registry=build_registry(context), timeout=60)
    with runner:
        yield runner
    assert runner.exit_code == 0, runner.output


async def restart(api: GuardedEmulator, clock: FakeClock, caplog: pytest.LogCaptureFixture) -> list[Any]:
    """Start an operator over the existing objects, wait until each is resumed, stop it;
    the writes it made."""
    since = len(api.requests_list())
    caplog.clear()
    runner = operator(clock)
    runner.__enter__()
    try:
        await eventually(lambda: sum(RESUMED in r.getMessage() for r in caplog.records)
                         >= len(QUIET) + len(DUE), "every GuardedCronJob resumed")
        await asyncio.sleep(0.5)  # let a late write show
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)
    return api.writes(since)


async def test_restart_writes_nothing_but_the_statuses_time_moved(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    for name in QUIET:
        await create_gcj(client, put(put(base_gcj(), "metadata.name", name), "spec.schedule", "0 0 1 1 *"))
    for name in DUE:
        await create_gcj(client, put(put(base_gcj(), "metadata.name", name), "spec.schedule", "5 13 * * *"))
    clock = FakeClock()
    runner = operator(clock)
    runner.__enter__()
    try:
        await eventually(lambda: all(ready(api, n) for n in QUIET + DUE), "every status Ready")
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)

    # Idle: nothing changed, nothing is written (no apply, status, annotation or Event).
    assert await restart(api, clock, caplog) == []

    # Past the DUE objects' fire time (12:05Z), before its start deadline (600 s): no
    # run (no CronJob controller here), no missed run yet; their next fire time moved.
    before = {n: (api.object(GCJ_RES, NS, n) or {})["status"] for n in DUE}
    clock.advance(minutes=10)
    writes = await restart(api, clock, caplog)
    assert sorted((w.method.value, w.url.path.rsplit("/", 2)[-2], w.url.path.rsplit("/", 1)[-1])
                  for w in writes) == [("PATCH", name, "status") for name in DUE]
    for write in writes:
        name = write.url.path.rsplit("/", 2)[-2]
        patch = write.data["status"]
        after = (api.object(GCJ_RES, NS, name) or {})["status"]
        changed = {key for key in set(before[name]) | set(after) if before[name].get(key) != after.get(key)}
        assert changed == {"nextScheduleTime"}, (name, patch)
        assert after["nextScheduleTime"] == "2025-01-11T12:05:00Z"

    # And once that is written, the next restart is idle again.
    assert await restart(api, clock, caplog) == []
