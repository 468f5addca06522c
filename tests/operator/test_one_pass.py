"""One pass reads each run record of each status once: the previous status's runs and
the new status's runs are parsed by compute_status, and everything after it (counts,
Events, metrics, outcome recording, onLost: StopWorkload) uses that one reading."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from guardedcron.handlers.context import PassMemory
from guardedcron.kube import GUARDED_CRONJOBS, JOBS, PODS, KubeClient
from guardedcron.status import RunRecord
from tests.operator.passes import create_gcj, one_pass
from tests.operator.runs_support import full_pass, store_run
from tests.support import status_objects as k
from tests.support.clock import T0
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj, put
from tests.support.status_world import Runs

NS, NAME = k.NAMESPACE, k.CRONJOB
AT = T0 - timedelta(minutes=20)


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Runs:
    return Runs(tmp_path, monkeypatch)


def run_items(status: Mapping[str, Any]) -> int:
    return len(status.get("recentRuns") or []) + (1 if status.get("lastRun") else 0)


async def test_a_pass_over_a_finishing_run_parses_each_record_once(
        api: GuardedEmulator, client: KubeClient, runs: Runs, monkeypatch: pytest.MonkeyPatch) -> None:
    # StopWorkload, so the lease-loss step is on the path too.
    await create_gcj(client, put(base_gcj(), "spec.lease.onLost", "StopWorkload"))
    await one_pass(client, NS, NAME, now=T0)  # the CronJob
    earlier_job, earlier_pods = runs.succeeded(AT - timedelta(days=1), 40)
    job, pods = runs.running(AT, 41)
    for stored in ((earlier_job, earlier_pods), (job, pods)):
        await store_run(client, *stored)
    await full_pass(client, NS, NAME, now=T0, memory=PassMemory(), stop_workload=True)

    # The run ends: its Job and pod as the controllers leave them.
    await client.delete(PODS, NS, k.pod_name(job))
    await client.delete(JOBS, NS, job["metadata"]["name"])
    await store_run(client, *runs.succeeded(AT, 41, minutes=15))
    previous = (await client.get(GUARDED_CRONJOBS, NS, NAME))["status"]

    parsed: Counter[int] = Counter()
    original = RunRecord.from_status

    def counting(cls: type[RunRecord], item: object) -> RunRecord | None:
        if isinstance(item, Mapping):
            parsed[id(item)] += 1
        return original(item)

    monkeypatch.setattr(RunRecord, "from_status", classmethod(counting))
    result = await full_pass(client, NS, NAME, now=T0 + timedelta(minutes=20), memory=PassMemory(),
                             stop_workload=True)
    monkeypatch.undo()

    status = (await client.get(GUARDED_CRONJOBS, NS, NAME))["status"]
    assert result.status_written
    assert status["lastRun"]["outcome"] == "Succeeded" and status["runCounts"]["succeeded"] == 2
    assert max(parsed.values()) == 1, "a run record was parsed more than once"
    assert sum(parsed.values()) == run_items(previous) + run_items(status)
