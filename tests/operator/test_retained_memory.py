"""Bytes the operator keeps per GuardedCronJob for as long as it runs, bounded.

What a running operator holds for each GuardedCronJob once its start-up is over: the
entries of its indexes (the GuardedCronJob and its CronJob, packed) and the status it
wrote last (PassMemory). The objects here are the ones a real pass makes on the
emulator (the CronJob the operator applied, the status it wrote); OBJECTS copies of
them are kept the way the operator keeps them, and tracemalloc counts the bytes still
allocated. A bound on bytes, not on time: parsed dicts (what was kept before) take
about ten times their JSON, and the 10,000-object target (200 MiB) leaves about
20 KiB per object for everything, kopf's own records included.
"""

from __future__ import annotations

import copy
import gc
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

from guardedcron.handlers import observe
from guardedcron.handlers.context import PassMemory
from guardedcron.kube import CRONJOBS, GUARDED_CRONJOBS, KubeClient
from tests.operator.passes import create_gcj, one_pass
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj

NS = "billing"
OBJECTS = 300
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
INDEX_BYTES_PER_OBJECT = 4 * 1024  # both entries: 3.1 KiB now, 8.2 KiB as plain JSON
STATUS_BYTES_PER_OBJECT = 1024


def retained_per_object(keep: Callable[[int], object]) -> tuple[float, list[object]]:
    """Bytes still allocated per object after `keep(i)` for OBJECTS objects."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [keep(i) for i in range(OBJECTS)]
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return (after - before) / OBJECTS, kept


def renamed(body: dict[str, Any], i: int) -> dict[str, Any]:
    copied = copy.deepcopy(body)
    copied["metadata"]["name"] = f"{body['metadata']['name']}-{i:04d}"
    copied["metadata"]["uid"] = f"uid-{i:04d}"
    return copied


async def test_indexes_and_written_statuses_keep_a_few_kib_per_object(
        api: GuardedEmulator, client: KubeClient) -> None:
    gcj = base_gcj()
    await create_gcj(client, gcj)
    name = gcj["metadata"]["name"]
    result = await one_pass(client, NS, name, now=T0)
    assert result.applied and result.status_written, result
    stored_gcj = await client.get(GUARDED_CRONJOBS, NS, name)
    cronjob = await client.get(CRONJOBS, NS, name)
    status = stored_gcj["status"]
    assert status.get("conditions"), status  # a real pass's status, not an empty one
    gcjs = [renamed(stored_gcj, i) for i in range(OBJECTS)]
    cronjobs = [renamed(cronjob, i) for i in range(OBJECTS)]

    Entries = tuple[dict[observe.Key, observe.Packed], dict[observe.Key, observe.Packed]]

    def index(i: int) -> Entries:  # what kopf keeps from the two index functions
        return observe.index_by_name(gcjs[i]), observe.index_by_name(cronjobs[i])

    index_bytes, kept = retained_per_object(index)
    assert index_bytes <= INDEX_BYTES_PER_OBJECT, f"{index_bytes:.0f} bytes per object in the indexes"
    # What was kept is what a pass reads back.
    gcj_entry, cronjob_entry = cast(Entries, kept[7])
    assert next(iter(cronjob_entry.values())).unpack()["spec"] == cronjob["spec"]
    assert next(iter(gcj_entry.values())).unpack()["status"] == status

    memory = PassMemory()
    # Each pass makes its own status (a copy here), and PassMemory is what keeps it.
    status_bytes, _ = retained_per_object(
        lambda i: memory.remember_status(f"uid-{i}", copy.deepcopy(status)))
    assert status_bytes <= STATUS_BYTES_PER_OBJECT, f"{status_bytes:.0f} bytes per object of written status"
    assert memory.written_status("uid-7") == status
