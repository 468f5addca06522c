"""What the operator keeps per object is made in a jemalloc arena of its own
(guardedcron.arenas), so the start-up's flood of short-lived objects leaves no page
pinned by a long-lived record (the figures are in docs/benchmarks.md).

jemalloc serves a process only if it is preloaded when the process starts, so each test
that needs it runs a fresh interpreter with the chart's environment; `arenas.arena_of`
asks jemalloc which arena holds an object. Without jemalloc (this test process) every
part of it does nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from guardedcron import arenas
from guardedcron.cli.operator_memory import ALLOCATOR_ENV
from guardedcron.kube import KubeClient
from tests.operator.passes import create_gcj
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj

NS = "billing"
OBJECTS = 20
# A bound on the whole script (an operator start over OBJECTS included), not a timing.
SCRIPT_SECONDS = 120


def run_with_jemalloc(script: str, env: dict[str, str] | None = None) -> dict[str, object]:
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=SCRIPT_SECONDS, env={**os.environ, **ALLOCATOR_ENV, **(env or {})})
    assert result.returncode == 0, result.stderr[-4000:]
    found: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def test_without_jemalloc_a_section_changes_nothing() -> None:
    assert arenas.enable() is None  # pytest runs on glibc's malloc (no LD_PRELOAD)
    assert arenas.arena_of(object()) is None
    with arenas.kept():
        made = {"a": [1, 2]}
    assert made == {"a": [1, 2]}
    assert arenas.fresh("uid-1") == "uid-1" and arenas.fresh_bytes(b"\x00d") == b"\x00d"
    assert arenas.fresh_tuple(("ns", "name")) == ("ns", "name")


SECTIONS = """
import ctypes, json
from guardedcron import arenas
mallctl = arenas._mallctl()

def read(name, kind):
    value = kind(); size = ctypes.c_size_t(ctypes.sizeof(value))
    assert mallctl(name, ctypes.byref(value), ctypes.byref(size), None, 0) == 0
    return value.value

default = read(b"thread.arena", ctypes.c_uint)
kept = arenas.enable()
assert arenas.enable() == kept  # once per process
outside_before = [object() for _ in range(200)]
with arenas.kept():
    inside = [object() for _ in range(200)]
    with arenas.kept():  # nested: still the same section
        nested = [object() for _ in range(200)]
    after_nested = [object() for _ in range(200)]
    uid = arenas.fresh("2f1c6a3e-0000-4000-8000-000000000001")
# CPython's free lists, filled with tuples, dicts and floats made outside: a plain tuple
# made in a section comes from there; a fresh tuple, a dict and a float made in one do not.
freed = [(i, str(i), None) for i in range(5000)] + [{"k": i} for i in range(500)] + [
    i + 0.25 for i in range(500)]
del freed
with arenas.kept():
    plain_tuples = [(i, "a", None) for i in range(100)]
    fresh_tuples = [arenas.fresh_tuple((i, "a", None)) for i in range(100)]
    dicts = [{"k": i} for i in range(100)]
    floats = [arenas.fresh_float(i + 0.5) for i in range(100)]
try:
    with arenas.kept():
        raise ValueError("left through an exception")
except ValueError:
    pass
outside_after = [object() for _ in range(200)]
where = lambda objects: sorted({arenas.arena_of(o) for o in objects})

def dict_tables(dicts):  # the arenas of their tables, each a malloc of its own (ma_keys, CPython 3.11)
    return sorted({arenas.arena_at(ctypes.c_void_p.from_address(id(d) + 32).value) for d in dicts})

print(json.dumps({
    "kept": kept, "default": default,
    "inside": where(inside + nested + after_nested + [uid]),
    "outside": where(outside_before + outside_after),
    "plain tuples": where(plain_tuples), "fresh tuples": where(fresh_tuples),
    "dicts": where(dicts), "dict tables": dict_tables(dicts), "floats": where(floats),
    "fresh equal": fresh_tuples[5] == (5, "a", None) and hash(fresh_tuples[5]) == hash((5, "a", None)),
    "arena_after": read(b"thread.arena", ctypes.c_uint),
    "tcache_after": read(b"thread.tcache.enabled", ctypes.c_bool),
}))
"""


def test_a_section_allocates_in_the_kept_arena_and_nothing_else_does() -> None:
    found = run_with_jemalloc(SECTIONS)
    assert found["kept"] != found["default"], found
    assert found["inside"] == [found["kept"]], found
    assert found["kept"] not in found["outside"], found  # type: ignore[operator]
    # Free lists: the premise (a plain small tuple is an old one), and what beats them.
    assert found["kept"] not in found["plain tuples"], found  # type: ignore[operator]
    assert found["fresh tuples"] == [found["kept"]] and found["fresh equal"] is True, found
    assert found["dicts"] == [found["kept"]] and found["dict tables"] == [found["kept"]], found
    assert found["floats"] == [found["kept"]], found
    # Left as it was, after a nested section and after an exception.
    assert found["arena_after"] == found["default"], found
    assert found["tcache_after"] is True, found


SUSPENDING = """
import asyncio, json
from guardedcron import arenas
kept = arenas.enable()
where = lambda objects: sorted({arenas.arena_of(o) for o in objects})
made = {}

async def record(name):
    made[name] = [object() for _ in range(100)]
    await asyncio.sleep(0)  # suspends: the section ends here
    made[name + " after"] = [object() for _ in range(100)]
    return name

async def fails():
    await asyncio.sleep(0)
    raise KeyError("the coroutine's own error")

async def waits_forever():
    made["cancelled"] = False
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        made["cancelled"] = True
        raise

async def meanwhile():
    made["other task"] = [object() for _ in range(100)]

async def never_suspends():
    made["whole"] = [object() for _ in range(100)]
    return 7

async def main():
    other = asyncio.create_task(meanwhile())
    result = await arenas.kept_until_suspended(record("first"))
    await other
    whole = await arenas.kept_until_suspended(never_suspends())
    try:
        await arenas.kept_until_suspended(fails())
        error = None
    except KeyError as raised:
        error = str(raised)
    async def kept_waiting():
        await arenas.kept_until_suspended(waits_forever())
    task = asyncio.create_task(kept_waiting())
    await asyncio.sleep(0.05)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    return {"kept": kept, "result": result, "whole": whole, "error": error,
            "cancelled": made["cancelled"],
            "before": where(made["first"]), "after": where(made["first after"]),
            "other": where(made["other task"]), "never": where(made["whole"])}

print(json.dumps(asyncio.run(main())))
"""


def test_a_coroutine_is_kept_until_it_first_suspends() -> None:
    found = run_with_jemalloc(SUSPENDING)
    kept = found["kept"]
    assert found["before"] == [kept] and found["never"] == [kept], found
    assert kept not in found["after"] and kept not in found["other"], found  # type: ignore[operator]
    assert (found["result"], found["whole"]) == ("first", 7), found
    assert found["error"] == "\"the coroutine's own error\"", found
    assert found["cancelled"] is True, found  # the cancellation reached the coroutine


# The operator itself, over OBJECTS GuardedCronJobs on the emulator: once every one has
# had its pass, where kopf's records of each object, their keys, the index entries and
# the operator's own records are.
OPERATOR = """
import asyncio, gc, json, os
from collections import Counter
from guardedcron import arenas
from guardedcron.cli.operator import run_operator, settings_from
from guardedcron.handlers.context import OperatorContext, PassMemory
from guardedcron.handlers.observe import Packed
from kopf._core.engines.indexing import Index, Store
from kopf._core.reactor.inventory import ResourceMemories

OBJECTS = int(os.environ["EXPECTED_OBJECTS"])

def live(kind):
    return [o for o in gc.get_objects() if type(o) is kind]

def everything_seen():
    # Every status written, and kopf has seen every GuardedCronJob and the CronJob it made.
    return (any(sum(r.written is not None for r in m._objects.values()) >= OBJECTS
                for m in live(PassMemory))
            and sum(len(ms._items) for ms in live(ResourceMemories)) >= 2 * OBJECTS)

async def main():
    settings = settings_from({**os.environ, "GUARDEDCRON_METRICS_PORT": "0"})
    stop = asyncio.Event()
    operator = asyncio.create_task(run_operator(settings, stop_flag=stop))
    async with asyncio.timeout(90):
        while not everything_seen():
            await asyncio.sleep(0.2)
    kept = arenas.enable()
    where = lambda objects: {str(a): n for a, n in Counter(arenas.arena_of(o) for o in objects).items()}
    memories = [m for ms in live(ResourceMemories) for m in ms._items.values()]
    keys = [k for ms in live(ResourceMemories) for k in ms._items]
    records = [r for m in memories for r in (m, m.daemons_memory, m.indexing_memory, m.error_throttler)]
    passes = [p for p in live(PassMemory) if p._objects]
    found = {"kept": kept, "memories": len(memories),
             "kopf records": where(records), "kopf keys": where(keys),
             "index entries": where(live(Packed)),
             "pass records": where(r for p in passes for r in p._objects.values()),
             "locks": where(r.lock for p in passes for r in p._objects.values()),
             "pass keys": where(k for p in passes for k in p._objects),
             # kopf's keys of each object in its stores, and the handlers' keys of the indexes
             "index keys": where([k for i in live(Index) for k in (*i._Index__items, *i._Index__reverse)]
                                 + [k for s in live(Store) for k in s._Store__items]),
             # a series and its value, set by the first pass and left alone by the later ones
             "metric series": where(part for c in live(OperatorContext)
                                    for child in c.metrics.next_slot._metrics.values()
                                    for part in (child._kwargs, child._value._value))}
    stop.set()
    await operator
    return found

print(json.dumps(asyncio.run(main())))
"""


async def test_the_operator_keeps_its_per_object_records_in_the_kept_arena(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path) -> None:
    for index in range(OBJECTS):
        gcj = base_gcj()
        gcj["metadata"] = {"name": f"job-{index:02d}", "namespace": NS}
        await create_gcj(client, gcj)
    env = {"EXPECTED_OBJECTS": str(OBJECTS), "GUARDEDCRON_LOG_LEVEL": "warning"}
    found = await asyncio.to_thread(run_with_jemalloc, OPERATOR, env)
    kept = str(found["kept"])
    # A GuardedCronJob and its CronJob each: kopf's memory, with three of its records.
    assert found["memories"] == 2 * OBJECTS, found
    for kind in ("kopf records", "kopf keys", "index entries", "pass records", "locks", "pass keys",
                 "index keys", "metric series"):
        arenas_found = found[kind]
        assert isinstance(arenas_found, dict) and list(arenas_found) == [kept], (kind, found)
