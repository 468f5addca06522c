"""Catch-up under kopf (KopfRunner, the emulator, an injected clock): a missed slot makes
no event, so a GuardedCronJob using catch-up gets a timer pass that notices it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kmock
import pytest

from guardedcron import contract, planner
from guardedcron.kube import KubeClient
from tests.operator.passes import create_gcj, eventually, start_kopf
from tests.support.clock import FakeClock
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj, put

NS, NAME = "billing", "nightly-invoices"
GCJ_RES, JOB_RES = "guardedcron.io/v1alpha1/guardedcronjobs", "batch/v1/jobs"


def jobs(api: GuardedEmulator) -> list[dict[str, Any]]:
    return [obj.raw for key, obj in api.objects.items()
            if key[0] == kmock.resource(JOB_RES) and not obj.deleted]


def ready(api: GuardedEmulator) -> bool:
    status = (api.object(GCJ_RES, NS, NAME) or {}).get("status") or {}
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", ()))


async def test_a_missed_slot_is_made_up_with_no_event_to_wake_the_operator(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planner, "TIMER_SECONDS", 0.5)
    body = put(put(base_gcj(), "spec.schedule", "*/10 * * * *"), "spec.timeZone", "UTC")
    await create_gcj(client, put(body, "spec.catchUp", {"policy": "Latest", "windowSeconds": 3600}))
    clock = FakeClock(datetime.now(UTC))
    runner = start_kopf(NS, clock)
    try:
        await eventually(lambda: ready(api), "the GuardedCronJob is Ready")
        await asyncio.sleep(3)  # the passes its creation started are over
        assert jobs(api) == []  # nothing due yet
        # Slots pass with no run (no CronJob controller here) and nothing changes in the
        # API: only the timer's pass can see them.
        clock.advance(minutes=40)
        [job] = await eventually(lambda: jobs(api), "a make-up Job")
        assert job["metadata"]["annotations"][contract.ANNOTATION_RUN_KIND] == contract.RUN_KIND_CATCH_UP
        assert contract.attempt_of(job["metadata"]["name"]) is not None
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)
    assert runner.exit_code == 0, runner.output
