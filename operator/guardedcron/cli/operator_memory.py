"""The operator's memory after its start-up peak: glibc's allocator, trimmed.

The operator's memory peaks when it starts over all its objects (kopf's worker for each
listed object holds that object's body until every index is filled), then falls. Under
CPython's own small-object allocator most of it stays resident: a pymalloc arena goes
back to the system only once every block in it is free, and the long-lived per-object
records made during the peak are scattered through those arenas (docs/benchmarks.md,
"Memory: what holds it"). So the operator runs on glibc's malloc instead
(`ALLOCATOR_ENV`; the chart's Deployment sets it, since Python reads it only as it
starts), with at most two arenas (otherwise up to one per thread and core, each keeping
its own free memory). glibc returns free pages from inside its heap only when asked,
by `malloc_trim`: `trim_periodically` asks every few seconds while the memory moves
(it grows through a start, then falls as kopf's per-object workers end and drop the
bodies) or a trim still gives some back, and once a minute once it is steady. Each call
runs in a worker thread, so the event loop is not held up while glibc walks its free
lists.

Before a trim, a full collection of reference cycles (`collect_cycles`; once the
memory stopped moving, and at most a minute apart while it moves): kopf wraps every
event's object in a `Body` and a `Patch` whose views point back at them, so each event
leaves a cycle of a whole object's size that only a full collection frees, and CPython
starts one only once the cycles pending reach a quarter of everything long-lived: at
1,000 GuardedCronJobs, one to two thousand dead bodies (37 MB) stayed after a start
(docs/benchmarks.md, "Memory: the bodies kopf keeps and leaves").
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

# The operator's allocator; only the operator's container gets it (the guard, in the
# same image, is a short process that pymalloc serves well).
ALLOCATOR_ENV: Mapping[str, str] = MappingProxyType({"PYTHONMALLOC": "malloc", "MALLOC_ARENA_MAX": "2"})
TRIM_SECONDS = 5.0  # between trims while the memory moves
IDLE_TRIM_SECONDS = 60.0  # between trims once it is steady
STEADY_MIB = 1.0  # moved less than this since the last trim, and a trim gave back less: steady

logger = logging.getLogger("guardedcron.memory")
Trim = Callable[[], object]


def malloc_trim() -> Trim | None:
    """glibc's `malloc_trim(0)`, or None where the C library has none (musl, macOS)."""
    try:
        function = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return lambda: function(0)


def resident_mib(statm: Path = Path("/proc/self/statm")) -> float:
    """This process's resident memory; 0 where /proc is not there."""
    try:
        pages = int(statm.read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def collect_cycles() -> None:
    """A full collection, in the calling thread (it holds the interpreter throughout,
    wherever it runs); what it found and its time are logged."""
    started = time.monotonic()
    found = gc.collect()
    logger.debug("gc: %d unreachable objects collected in %.0f ms", found,
                 (time.monotonic() - started) * 1000)


def wants_collection(resident: float, last: float, since_collection: float,
                     idle_seconds: float) -> bool:
    """Whether a trim collects cycles first: once resident memory stopped moving since
    the last trim (`last`, MiB), or `idle_seconds` after the last collection. Not while it
    moves: a collection walks every live object (about 0.3 s at 10,000 GuardedCronJobs,
    more while a start-up holds its bodies), and a start-up still holds most of them."""
    return abs(resident - last) < STEADY_MIB or since_collection >= idle_seconds


async def trim_once(trim: Trim, *, collect: bool = True) -> tuple[float, float]:
    """Collect cycles if `collect`, then trim in a worker thread; resident MiB before
    and after (logged)."""
    before = resident_mib()
    if collect:
        collect_cycles()
    started = time.monotonic()
    await asyncio.to_thread(trim)
    after = resident_mib()
    logger.debug("malloc_trim: resident %.1f -> %.1f MiB in %.0f ms",
                 before, after, (time.monotonic() - started) * 1000)
    return before, after


async def trim_periodically(trim: Trim, *, busy_seconds: float = TRIM_SECONDS,
                            idle_seconds: float = IDLE_TRIM_SECONDS) -> None:
    """Trim every `busy_seconds` while the memory moves, every `idle_seconds` once it is
    steady; until cancelled. Each trim collects cycles first when `wants_collection`."""
    delay, last = busy_seconds, 0.0
    collected = time.monotonic()
    while True:
        await asyncio.sleep(delay)
        collect = wants_collection(resident_mib(), last, time.monotonic() - collected, idle_seconds)
        before, after = await trim_once(trim, collect=collect)
        if collect:
            collected = time.monotonic()
        steady = abs(before - last) < STEADY_MIB and before - after < STEADY_MIB
        delay, last = (idle_seconds if steady else busy_seconds), after
