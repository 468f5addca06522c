"""The operator gives freed memory back: glibc's malloc keeps freed pages resident until
they are trimmed, and `guardedcron operator` asks for that after collecting cycles
(guardedcron.cli.operator_memory; the figures are in docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

from guardedcron.cli import operator_memory

GUARDEDCRON = str(Path(sys.executable).parent / "guardedcron")
# A bound on the wait for the operator's first trim (5 s after it starts), not a timing.
START_SECONDS = 60.0
# Every allocation through glibc's malloc, as the operator's larger ones are (CPython's
# own allocator serves blocks up to 512 bytes and gives an arena back once it is empty).
ON_MALLOC = {"PYTHONMALLOC": "malloc"}
# 300,000 blocks of 300 bytes (about 100 MiB) and one in 64 kept, as the long-lived
# records made during the start-up peak keep the memory around them. Then, if asked, a
# wait (bounded) for the memory to come back without a trim, else a trim.
FRAGMENT = """
import asyncio, json, sys, time
from guardedcron.cli.operator_memory import allocator_trim, resident_mib, trim_once
trim = allocator_trim()
baseline = resident_mib()
blocks = [bytes(300) for _ in range(300_000)]
kept = blocks[::64]
del blocks
after_free = resident_mib()
figures = {"allocator": trim.allocator, "freed_but_resident": after_free - baseline}
if sys.argv[1] == "wait":
    deadline = time.monotonic() + float(sys.argv[2])
    while resident_mib() > after_free - 30 and time.monotonic() < deadline:
        time.sleep(0.1)
    figures["returned_without_a_trim"] = after_free - resident_mib()
else:
    before, after = asyncio.run(trim_once(trim))
    figures["released"] = before - after
print(json.dumps(figures))
"""


def fragment(env: dict[str, str], *args: str) -> dict[str, float | str]:
    result = subprocess.run([sys.executable, "-c", FRAGMENT, *args], capture_output=True, text=True,
                            timeout=120, check=True, env={**os.environ, **env})
    figures: dict[str, float | str] = json.loads(result.stdout)
    return figures


def test_freed_memory_stays_resident_until_the_trim_gives_it_back() -> None:
    figures = fragment(ON_MALLOC, "trim")
    assert figures["allocator"] == "glibc", figures
    assert float(figures["freed_but_resident"]) > 60, figures  # free() alone returned almost nothing
    assert float(figures["released"]) > 30, figures


async def test_the_operator_says_which_allocator_serves_it_and_trims_it(kubeconfig: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        GUARDEDCRON, "operator", "--standalone", "--metrics-port", "0", "--log-level", "debug",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)})
    assert process.stderr is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(START_SECONDS):
            while not any("trim (glibc): resident" in line for line in seen):
                line = (await process.stderr.readline()).decode(errors="replace")
                assert line, "".join(seen[-20:])  # the operator ended before its first trim
                seen.append(line)
    finally:
        process.kill()
        await process.wait()
    assert any("memory: glibc's allocator, trimmed" in line for line in seen), "".join(seen)


def test_no_collection_while_the_memory_moves() -> None:
    """A collection walks every live object, and while a start-up grows or falls it still
    holds most of them: a trim then skips it (but not for longer than an idle period);
    once the memory stops moving, the trim collects first."""
    wants = operator_memory.wants_collection
    moved = operator_memory.STEADY_MIB
    assert not wants(100 + moved, 100, since_collection=5, idle_seconds=60)  # growing
    assert not wants(100 - moved, 100, since_collection=5, idle_seconds=60)  # falling
    assert wants(100 + moved, 100, since_collection=60, idle_seconds=60)
    assert wants(100.5, 100, since_collection=5, idle_seconds=60)  # steady


# In a fresh interpreter: a million lists that stay alive, the growth of a start-up's
# old generation, with CPython's thresholds and then within own_full_collections; the
# collections of each generation that it caused.
GROWTH = """
import gc, json
from guardedcron.cli.operator_memory import own_full_collections

def grow():
    before = [g["collections"] for g in gc.get_stats()]
    kept = [[] for _ in range(1_000_000)]
    after = [g["collections"] for g in gc.get_stats()]
    del kept
    return [a - b for a, b in zip(after, before)]

cpythons = grow()
with own_full_collections():
    owned = grow()
print(json.dumps({"cpythons": cpythons, "owned": owned, "restored": gc.get_threshold()}))
"""


def test_full_collections_are_the_operators_alone() -> None:
    """A growing old generation makes CPython start full collections of its own (a
    start-up over 10,000 objects: 16 in a restart, each up to 3 s long); within
    `own_full_collections` it starts none, and still collects the young generations."""
    result = subprocess.run([sys.executable, "-c", GROWTH], capture_output=True, text=True,
                            timeout=120, check=True)
    counts = json.loads(result.stdout)
    assert counts["cpythons"][2] >= 1, counts
    assert counts["owned"][2] == 0, counts
    assert counts["owned"][0] >= 1_000 and counts["owned"][1] >= 100, counts
    assert tuple(counts["restored"]) == (700, 10, 10), counts  # CPython's, back afterwards


class Cycle:
    def __init__(self) -> None:
        self.itself = self


# A bound on how long the loop below (trims every 0.05 s) takes to collect, not a timing.
COLLECTED_BOUND_SECONDS = 10.0


async def test_the_trim_loop_collects_without_an_allocator_to_trim() -> None:
    """With no allocator to trim (musl, macOS), `trim_periodically` still runs the full
    collections that `own_full_collections` leaves to it: a cycle that died in the old
    generation, which young collections never free, is freed by the loop."""
    with operator_memory.own_full_collections():
        freed = asyncio.Event()
        cycle = Cycle()
        dead = weakref.ref(cycle, lambda _: freed.set())
        gc.collect(1)  # it survives the young generations: it is in the old one now
        del cycle
        for _ in range(20):
            gc.collect(1)
        assert dead() is not None  # young collections leave it
        loop = asyncio.create_task(operator_memory.trim_periodically(None, busy_seconds=0.05,
                                                                     idle_seconds=0.2))
        try:
            await asyncio.wait_for(freed.wait(), COLLECTED_BOUND_SECONDS)
        finally:
            loop.cancel()
        assert dead() is None
