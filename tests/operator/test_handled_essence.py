"""A create writes the CronJob and the status, nothing of kopf's: kopf's record of the
last handled spec stays in the operator's memory (guardedcron.handlers.handled), not in
an annotation (a third write per object on the 5,000-object benchmark). Changes still
reach the CronJob: while the operator runs, across a restart, and after one."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from guardedcron import contract
from guardedcron.kube import GUARDED_CRONJOBS, KubeClient
from tests.operator.passes import create_gcj, eventually
from tests.operator.test_idle_restart import GCJ_RES, NS, operator, ready
from tests.support.clock import FakeClock
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj, put

NAME = "nightly"
SCHEDULES = ("0 3 * * *", "0 4 * * *", "0 5 * * *", "0 6 * * *")


def cronjob_schedule(api: GuardedEmulator) -> str | None:
    cronjob = api.object("batch/v1/cronjobs", NS, NAME) or {}
    return (cronjob.get("spec") or {}).get("schedule")


async def change_schedule(client: KubeClient, schedule: str) -> None:
    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME, {"spec": {"schedule": schedule}})


async def test_a_create_writes_two_objects_and_every_change_still_reaches_the_cronjob(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = FakeClock()
    runner = operator(clock)
    runner.__enter__()
    try:
        since = len(api.requests_list())
        await create_gcj(client, put(put(base_gcj(), "metadata.name", NAME), "spec.schedule", SCHEDULES[0]))
        await eventually(lambda: ready(api, NAME), "the status Ready")
        await asyncio.sleep(0.5)  # let a late write show
        writes = sorted((w.method.value, w.url.path.split("/namespaces/")[1]) for w in api.writes(since))
        assert writes == [
            ("PATCH", f"{NS}/cronjobs/{NAME}"),  # the server-side apply
            ("PATCH", f"{NS}/guardedcronjobs/{NAME}/status"),
            ("POST", f"{NS}/guardedcronjobs"),  # the test's own create
        ], writes
        annotations = (api.object(GCJ_RES, NS, NAME) or {})["metadata"].get("annotations") or {}
        assert not [key for key in annotations if key.startswith(contract.KOPF_ANNOTATION_PREFIX)]

        await change_schedule(client, SCHEDULES[1])
        await eventually(lambda: cronjob_schedule(api) == SCHEDULES[1], "the change applied")
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)

    # Changed while no operator ran: the restart's resume pass applies it ...
    await change_schedule(client, SCHEDULES[2])
    runner = operator(clock)
    runner.__enter__()
    try:
        await eventually(lambda: cronjob_schedule(api) == SCHEDULES[2], "the change made while down")
        # ... and the essence it resumed is the base for the next change.
        await change_schedule(client, SCHEDULES[3])
        await eventually(lambda: cronjob_schedule(api) == SCHEDULES[3], "a change after the restart")
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)
