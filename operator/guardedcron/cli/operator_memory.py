"""The operator's memory after its start-up peak: jemalloc, purged after collections.

The operator's memory peaks when it starts over all its objects (kopf's worker for each
listed object holds that object's body until every index is filled), then falls. What
stays is mostly free memory the allocator cannot give back: the long-lived per-object
records made during the peak are scattered through the pages the peak used, and a page
with one live record stays resident (113 MiB live of 527 resident under glibc after a
restart over 10,000 GuardedCronJobs). Under
CPython's own small-object allocator it is worse: a pymalloc arena goes back only once
every block in it is free. So the operator's container runs Python on `malloc`
(`ALLOCATOR_ENV`; the chart's Deployment sets it, since the dynamic loader and Python read
it only as the process starts) and that `malloc` is jemalloc, preloaded from the image:
it keeps each size class on pages of its own, so pages of short-lived objects empty
whole and go back, and its background thread returns them over the ten seconds after
they were freed (`JEMALLOC_CONF`). Without the library (a developer's machine) the loader says so on
stderr and glibc's malloc serves (`GLIBC_ENV`: at most two arenas, otherwise up to one
per thread and core, each keeping its own free memory).

`allocator_trim` finds which allocator serves this process and how to ask it to give
free pages back now (a trim): jemalloc's purge of every arena, or glibc's `malloc_trim(0)`.
`trim_periodically` asks every few seconds while the memory moves (it grows through a
start, then falls as kopf's per-object workers end and drop the bodies) or a trim still
gives some back, and once a minute once it is steady. Each call runs in a worker
thread, so the event loop is not held up while the allocator walks its free lists.

Before a trim, a full collection of reference cycles (`collect_cycles`; once the
memory stopped moving, and at most a minute apart while it moves): kopf wraps every
event's object in a `Body` and a `Patch` whose views point back at them, so each event
leaves a cycle of a whole object's size that only a full collection frees, and CPython
starts one only once the cycles pending reach a quarter of everything long-lived: at
1,000 GuardedCronJobs, one to two thousand dead bodies (37 MB) stayed after a start
(docs/benchmarks.md, "Memory: the bodies kopf keeps and leaves").

Those trims' collections are the operator's only full ones (`own_full_collections`):
CPython's own start each time the old generation grew by a quarter, and a start-up grows
it from a few hundred thousand objects to two million, so it ran 28 of them in a first
start over 10,000 GuardedCronJobs (36 s of 158 s of CPU) and 16 in a restart (12 s of
80 s), each holding the event loop for up to 3 s. The young generations stay CPython's.
Without an allocator to trim, the same loop still collects (`trim` None).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

# jemalloc's settings (MALLOC_CONF): its background thread returns freed pages over the
# next ten seconds (dirty_decay_ms, jemalloc's default: a start-up reuses them meanwhile
# rather than fault them in again; 1 s cost more CPU at 10,000 objects and kept about as much,
# docs/benchmarks.md "memory, fifth round"), with MADV_DONTNEED (muzzy_decay_ms 0), which
# lowers the resident memory the kubelet counts at once, not MADV_FREE, which the kernel
# takes back only when it needs to; and two arenas, as many as the operator's busy threads.
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:10000,muzzy_decay_ms:0,narenas:2"
# The operator's allocator; only the operator's container gets it (the guard, in the
# same image, is a short process that pymalloc serves well). LD_PRELOAD names the
# library by its soname: the loader finds it in the system's library folders on any
# architecture.
GLIBC_ENV: Mapping[str, str] = MappingProxyType({"PYTHONMALLOC": "malloc", "MALLOC_ARENA_MAX": "2"})
ALLOCATOR_ENV: Mapping[str, str] = MappingProxyType({
    **GLIBC_ENV, "LD_PRELOAD": "libjemalloc.so.2", "MALLOC_CONF": JEMALLOC_CONF})
# jemalloc's MALLCTL_ARENAS_ALL: "arena.<this>.purge" purges every arena.
JEMALLOC_PURGE_ALL = b"arena.4096.purge"
TRIM_SECONDS = 5.0  # between trims while the memory moves
IDLE_TRIM_SECONDS = 60.0  # between trims once it is steady
STEADY_MIB = 1.0  # moved less than this since the last trim, and a trim gave back less: steady
# gc's third threshold: full collections (gen2) after this many collections of the middle
# generation. CPython stores it in a C int; at this value it never starts one itself.
NEVER = 2**31 - 1

logger = logging.getLogger("guardedcron.memory")


@dataclass(frozen=True)
class Trim:
    """How to ask this process's allocator to give its free pages back now."""

    allocator: str  # "jemalloc" or "glibc"
    call: Callable[[], object]

    def __call__(self) -> object:
        return self.call()


def allocator_trim() -> Trim | None:
    """jemalloc's purge of every arena when jemalloc serves this process (preloaded), else
    glibc's `malloc_trim(0)`; None where the C library has neither (musl, macOS)."""
    try:
        process = ctypes.CDLL(None)
    except OSError:
        return None
    mallctl = getattr(process, "mallctl", None)
    if mallctl is not None:
        mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_size_t]
        mallctl.restype = ctypes.c_int
        return Trim("jemalloc", lambda: mallctl(JEMALLOC_PURGE_ALL, None, None, None, 0))
    trim = getattr(process, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return Trim("glibc", lambda: trim(0))


def log_allocator(trim: Trim | None, environ: Mapping[str, str]) -> None:
    """Say which allocator serves the operator; warn when jemalloc was asked for and did
    not load (the loader's own message went to stderr before any logging was set up)."""
    allocator = f"{trim.allocator}'s allocator" if trim is not None else "an allocator it cannot trim"
    if "jemalloc" in environ.get("LD_PRELOAD", "") and (trim is None or trim.allocator != "jemalloc"):
        logger.warning("memory: LD_PRELOAD names jemalloc but it did not load; %s serves instead"
                       " and keeps more of the start-up peak resident", allocator)
    else:
        logger.info("memory: %s", allocator)


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


@contextlib.contextmanager
def own_full_collections() -> Iterator[None]:
    """Within: full collections are `trim_periodically`'s alone (at most IDLE_TRIM_SECONDS +
    TRIM_SECONDS apart; the module's docstring says why); CPython keeps collecting the
    young generations. The thresholds before come back on the way out."""
    before = gc.get_threshold()
    gc.set_threshold(before[0], before[1], NEVER)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def wants_collection(resident: float, last: float, since_collection: float,
                     idle_seconds: float) -> bool:
    """Whether a trim collects cycles first: once resident memory stopped moving since
    the last trim (`last`, MiB), or `idle_seconds` after the last collection. Not while it
    moves: a collection walks every live object (about 0.3 s at 10,000 GuardedCronJobs,
    more while a start-up holds its bodies), and a start-up still holds most of them."""
    return abs(resident - last) < STEADY_MIB or since_collection >= idle_seconds


async def trim_once(trim: Trim | None, *, collect: bool = True) -> tuple[float, float]:
    """Collect cycles if `collect`, then trim in a worker thread (unless `trim` is None);
    resident MiB before and after (logged)."""
    before = resident_mib()
    if collect:
        collect_cycles()
    if trim is None:
        return before, resident_mib()
    started = time.monotonic()
    await asyncio.to_thread(trim)
    after = resident_mib()
    logger.debug("trim (%s): resident %.1f -> %.1f MiB in %.0f ms",
                 trim.allocator, before, after, (time.monotonic() - started) * 1000)
    return before, after


async def trim_periodically(trim: Trim | None, *, busy_seconds: float = TRIM_SECONDS,
                            idle_seconds: float = IDLE_TRIM_SECONDS) -> None:
    """Trim every `busy_seconds` while the memory moves, every `idle_seconds` once it is
    steady; until cancelled. Each trim collects cycles first when `wants_collection`, so
    full collections are at most `idle_seconds + busy_seconds` apart (plus their own time)."""
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
