"""The operator's memory after its start-up: cycles collected, free pages given back.

The operator's memory peaks while it starts over all its objects (the caches fill, and
kopf's per-object workers hold each event's body until they end), then falls. Two things
keep the fall from reaching the system by themselves:

- Cycles. kopf wraps every event's object in a `Body` and a `Patch` whose views point
  back at them, so each event leaves a cycle of a whole object's size that only a full
  collection frees, and CPython starts one only once the cycles pending reach a quarter
  of everything long-lived (docs/benchmarks.md, "Operator at scale").
- Free pages. CPython's small-object allocator returns an arena once every block in it
  is free; larger blocks come from glibc's `malloc`, which keeps freed pages until
  `malloc_trim`.

So `trim_periodically` collects cycles and then asks glibc to trim (`allocator_trim`):
every few seconds while the memory moves, once a minute once it is steady. Each trim
runs in a worker thread, so the event loop is not held up while glibc walks its free
lists. Those collections are the operator's only full ones (`own_full_collections`):
CPython's own would start each time the old generation grew by a quarter, and a start-up
over 10,000 GuardedCronJobs grows it many times, each holding the event loop for
seconds. The young generations stay CPython's. Where the C library has no `malloc_trim`
(musl, macOS) the same loop still collects (`trim` None).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

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

    allocator: str  # "glibc"
    call: Callable[[], object]

    def __call__(self) -> object:
        return self.call()


def allocator_trim() -> Trim | None:
    """glibc's `malloc_trim(0)`; None where the C library has none (musl, macOS)."""
    try:
        process = ctypes.CDLL(None)
    except OSError:
        return None
    trim = getattr(process, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return Trim("glibc", lambda: trim(0))


def log_allocator(trim: Trim | None) -> None:
    logger.info("memory: %s", f"{trim.allocator}'s allocator, trimmed" if trim is not None
                else "an allocator it cannot trim")


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
