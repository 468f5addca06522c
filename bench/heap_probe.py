"""Run `guardedcron` with tracemalloc on, and dump the heap when sent SIGUSR2.

bench/operator_scale.py starts the operator through this with `--heap DIR`, so the
operator's own process tells what holds its memory. Each SIGUSR2 writes, into DIR:
- `<n>.snap` (FRAMES > 0): a tracemalloc snapshot (`tracemalloc.Snapshot.load`), traces of
  FRAMES frames, to compare by traceback (`bench/heap_report.py`);
- `<n>.census.json`: gc-tracked objects by type (count and shallow bytes: strings and
  bytes are not tracked, the containers holding them are), the bytes tracemalloc
  traces, and the process's RSS just before the dump; the time a full collection of
  reference cycles takes (what the operator's trim does first), and kopf's live bodies
  (`Body`: how many, their bytes, what refers to a sample of them and of kopf's
  `Patch`es), and live objects by the small size class they take (`by_size_class`);
- `<n>.pymalloc.txt`: `sys._debugmallocstats()`, pymalloc's arenas and free pools;
- in the census, glibc's own account (`mallinfo2`: bytes its heaps took from the system,
  bytes in use, bytes free inside them, and mmapped blocks), before and after a
  `malloc_trim(0)`, with the RSS after it: what of the resident memory is live
  allocations (Python's, and the C libraries' that tracemalloc never sees) and what
  is free memory the heaps keep; `<n>.malloc_info.xml` has each arena's own account;
- where jemalloc serves (the chart's allocator), its account too (`stats.allocated`,
  `active`, `resident`, `mapped`, `retained`), before and after a purge of every arena,
  with the RSS after it, the bytes in large allocations, and each small size class's
  live regions against the slabs holding them (`jemalloc_bins`).

Usage: python bench/heap_probe.py DIR FRAMES operator --standalone
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import json
import os
import signal
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def pymalloc_stats(path: Path) -> None:
    """Python's allocator's own account (arenas in use, free pools), written to stderr by
    the interpreter: fd 2 goes to `path` meanwhile."""
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("w") as out:
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


@functools.cache
def c_library() -> ctypes.CDLL:
    """The C library, with the signatures of the glibc calls the census makes."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if hasattr(libc, "mallinfo2"):
        libc.mallinfo2.restype = MallInfo2
        libc.fopen.restype = ctypes.c_void_p
        libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
    return libc


def glibc_heaps() -> dict[str, int] | None:
    """glibc's account of its heaps, in KiB; None where the C library is not glibc."""
    libc = c_library()
    if not hasattr(libc, "mallinfo2"):
        return None
    info = libc.mallinfo2()
    return {"heaps_from_system_kib": info.arena // 1024, "in_use_kib": info.uordblks // 1024,
            "free_in_heaps_kib": info.fordblks // 1024, "mmapped_kib": info.hblkhd // 1024}


def glibc_census(info_path: Path) -> dict[str, object]:
    before = glibc_heaps()
    if before is None:
        return {}
    libc = c_library()
    stream = libc.fopen(str(info_path).encode(), b"w")
    if stream:  # each arena's own account, as XML
        libc.malloc_info(0, stream)
        libc.fclose(stream)
    libc.malloc_trim(0)
    return {"glibc": before, "glibc_after_trim": glibc_heaps(), "rss_kib_after_trim": rss_kib()}


JEMALLOC_STATS = ("allocated", "active", "resident", "mapped", "retained")


def jemalloc_stats(mallctl: Callable[..., int]) -> dict[str, int]:
    """jemalloc's account, in KiB, refreshed first (its statistics are a snapshot taken at
    each `epoch` write): bytes allocated, on active pages, resident, mapped, retained."""
    epoch = ctypes.c_uint64(1)
    mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.sizeof(epoch))
    return {f"{name}_kib": _mallctl_read(mallctl, f"stats.{name}") // 1024 for name in JEMALLOC_STATS}


def _mallctl_read(mallctl: Callable[..., int], name: str, kind: type = ctypes.c_size_t) -> int:
    value = kind(0)
    size = ctypes.c_size_t(ctypes.sizeof(value))
    if mallctl(name.encode(), ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
        raise OSError(f"mallctl {name} failed")
    return int(value.value)


def jemalloc_bins(mallctl: Callable[..., int], stats: str = "stats.arenas.4096") -> list[dict[str, int]]:
    """Each small size class over every arena, or over the one arena `stats` names (after
    the `epoch` write of jemalloc_stats): KiB in live regions against KiB of the slabs that
    hold them, so a class whose slabs are mostly free shows where the resident memory is
    not live data."""
    found = []
    for index in range(_mallctl_read(mallctl, "arenas.nbins", ctypes.c_uint)):
        size = _mallctl_read(mallctl, f"arenas.bin.{index}.size")
        slab = _mallctl_read(mallctl, f"arenas.bin.{index}.slab_size")
        regions = _mallctl_read(mallctl, f"{stats}.bins.{index}.curregs")
        slabs = _mallctl_read(mallctl, f"{stats}.bins.{index}.curslabs")
        nonfull = _mallctl_read(mallctl, f"{stats}.bins.{index}.nonfull_slabs")
        found.append({"size": size, "live_kib": regions * size // 1024,
                      "slabs_kib": slabs * slab // 1024, "slabs": slabs, "nonfull_slabs": nonfull})
    return found


def _emptiest_classes(mallctl: Callable[..., int], stats: str, most: int = 4) -> dict[str, str]:
    """An arena's small size classes with the most free space on their slabs: "live / slabs" KiB."""
    bins = sorted(jemalloc_bins(mallctl, stats), key=lambda b: (b["slabs_kib"] - b["live_kib"], b["size"]),
                  reverse=True)
    return {str(b["size"]): f"{b['live_kib']} / {b['slabs_kib']}" for b in bins[:most]}


def jemalloc_arenas(mallctl: Callable[..., int]) -> list[dict[str, object]]:
    """Each arena apart (after the `epoch` write of jemalloc_stats), in KiB: small and
    large allocations live in it, and its active pages (slabs and extents in use); the
    operator's kept arena (guardedcron.arenas) shows how densely its records sit."""
    page = _mallctl_read(mallctl, "arenas.page")
    found = []
    for index in range(_mallctl_read(mallctl, "arenas.narenas", ctypes.c_uint)):
        stats = f"stats.arenas.{index}"
        try:
            small = _mallctl_read(mallctl, f"{stats}.small.allocated")
        except OSError:  # an arena never initialised
            continue
        found.append({"arena": index, "small_allocated_kib": small // 1024,
                      "large_allocated_kib": _mallctl_read(mallctl, f"{stats}.large.allocated") // 1024,
                      "active_kib": _mallctl_read(mallctl, f"{stats}.pactive") * page // 1024,
                      # freed regions that threads' caches hold (counted as live above)
                      "thread_caches_kib": _mallctl_read(mallctl, f"{stats}.tcache_bytes") // 1024,
                      "emptiest_classes": _emptiest_classes(mallctl, stats)})
    return found


def by_arena(tracked: list[object]) -> dict[str, object]:
    """Which jemalloc arena holds each live object, by type; the untracked objects
    (strings, bytes, numbers) that tracked ones refer to, by their referrer's type too;
    and what sits outside the operator's kept arena (guardedcron.arenas) in the 64- and
    128-byte classes, where the start-up's fragmentation was. Empty where jemalloc does
    not serve or the operator made no kept arena."""
    try:
        from guardedcron import arenas  # loaded by then: the operator's
    except ImportError:  # an older operator's code (--code), before the kept arena
        return {}
    kept = arenas.enable()  # the operator's own arena: enable() returns it once made
    if kept is None:
        return {}
    types: Counter[str] = Counter()
    referents: Counter[str] = Counter()
    outside: Counter[str] = Counter()
    seen: set[int] = set()

    def place(obj: object, key: str, counter: Counter[str], referrer: str = "") -> None:
        where = arenas.arena_of(obj)
        counter[f"{where} {key}"] += 1
        size = size_class(sys.getsizeof(obj))
        if where != kept and size in (64, 128):
            outside[f"{type(obj).__qualname__} ({size}){referrer}"] += 1

    for obj in tracked:
        place(obj, type(obj).__qualname__, types)
        for child in gc.get_referents(obj):
            if type(child) in (str, bytes, float, int) and id(child) not in seen:
                seen.add(id(child))
                referrer = f" <- {type(obj).__qualname__}"
                place(child, f"{type(child).__qualname__}{referrer}", referents, referrer)
    return {"by_arena": dict(types.most_common(60)), "untracked_by_arena": dict(referents.most_common(60)),
            "outside_kept_64_128": dict(outside.most_common(40))}


def header_size(obj: object) -> int:
    """Bytes of the malloc that holds `obj` itself (under PYTHONMALLOC=malloc): for dicts,
    lists and sets the object without the table or item array it owns (a separate malloc)."""
    kind = type(obj)
    if kind in (dict, list, set, frozenset):
        return sys.getsizeof(obj) - obj.__sizeof__() + kind.__basicsize__
    return sys.getsizeof(obj)


def every_object(tracked: list[object]) -> Iterator[object]:
    """Every live object reachable from gc's: the tracked ones and, once each, the
    untracked ones they refer to (strings, numbers, tuples and dicts of those), through
    untracked containers too."""
    seen: set[int] = set()
    stack: list[object] = []
    for obj in tracked:
        yield obj
        stack.extend(gc.get_referents(obj))
        while stack:
            child = stack.pop()
            if gc.is_tracked(child) or id(child) in seen:
                continue
            seen.add(id(child))
            yield child
            if isinstance(child, (tuple, dict)):
                stack.extend(gc.get_referents(child))


def outside_kept_by_site(tracked: list[object], classes: tuple[int, ...] = (16, 32, 48, 64, 80, 128),
                         ) -> dict[str, int]:
    """Objects, and the item arrays of lists and tables of dicts, of the given size classes
    that live outside the kept arena, by type and by where tracemalloc saw each object
    made (a buffer: its owner): the innermost frames outside the standard library, or
    the innermost ones. Empty without tracemalloc or the kept arena."""
    try:
        from guardedcron import arenas
    except ImportError:
        return {}
    kept = arenas.enable()
    if kept is None or not tracemalloc.is_tracing():
        return {}
    usable = ctypes.CDLL(None).malloc_usable_size
    usable.argtypes, usable.restype = [ctypes.c_void_p], ctypes.c_size_t
    found: Counter[str] = Counter()
    for obj in every_object(tracked):
        parts = [(type(obj).__qualname__, size_class(header_size(obj)), id(obj))]
        for what, address in _buffers(obj):
            parts.append((what, size_class(usable(address)), address))
        for what, size, address in parts:
            if size in classes and arenas.arena_at(address) != kept:
                found[f"{what} ({size}) {_site(tracemalloc.get_object_traceback(obj))}"] += 1
    return dict(found.most_common(120))


def _buffers(obj: object) -> Iterator[tuple[str, int]]:
    """The separate mallocs a list or dict owns (CPython 3.11's layouts): a list's item
    array, a combined dict's table (a split dict's values start inside their malloc)."""
    if type(obj) is list and obj.__sizeof__() > list.__basicsize__:
        address = ctypes.c_void_p.from_address(id(obj) + 24).value  # ob_item
        if address:
            yield "list items", address
    elif type(obj) is dict and obj and not ctypes.c_void_p.from_address(id(obj) + 40).value:
        address = ctypes.c_void_p.from_address(id(obj) + 32).value  # ma_keys (no ma_values)
        if address:
            yield "dict table", address


def _site(traceback: tracemalloc.Traceback | None, depth: int = 3) -> str:
    if traceback is None:
        return "(not traced: made before tracemalloc started, or an instance with a managed __dict__)"
    innermost_first = list(reversed(traceback))  # a Traceback runs from the oldest frame
    frames = [frame for frame in innermost_first if "/lib/python3" not in frame.filename
              or "site-packages" in frame.filename] or innermost_first
    return " < ".join(f"{'/'.join(Path(frame.filename).parts[-2:])}:{frame.lineno}"
                      for frame in frames[:depth])


def jemalloc_census() -> dict[str, object]:
    """jemalloc's account before and after a purge of every arena (what the operator's
    trim does under it), with the RSS after it; empty where jemalloc does not serve."""
    from guardedcron.cli.operator_memory import JEMALLOC_PURGE_ALL  # loaded by then: the operator's

    mallctl = getattr(ctypes.CDLL(None), "mallctl", None)
    if mallctl is None:
        return {}
    before = jemalloc_stats(mallctl)
    bins = jemalloc_bins(mallctl)
    arenas = jemalloc_arenas(mallctl)
    large = _mallctl_read(mallctl, "stats.arenas.4096.large.allocated") // 1024
    mallctl(JEMALLOC_PURGE_ALL, None, None, None, 0)
    return {"jemalloc": before, "jemalloc_large_allocated_kib": large, "jemalloc_bins": bins,
            "jemalloc_arenas": arenas,
            "jemalloc_after_purge": jemalloc_stats(mallctl), "rss_kib_after_purge": rss_kib()}


def deep_size(roots: list[object]) -> int:
    """Bytes of JSON-like data (dicts, lists, strings, numbers) reachable from `roots`,
    each object counted once."""
    seen: set[int] = set()
    total, stack = 0, list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return total


def holders(objects: list[object]) -> Counter[str]:
    """What refers to `objects`, by type (an attribute's owner shows as its `__dict__`'s
    owner when the instance has one)."""
    found: Counter[str] = Counter()
    ignore = {id(objects)}
    for obj in objects:
        for referrer in gc.get_referrers(obj):
            if id(referrer) in ignore or isinstance(referrer, FrameType):
                continue
            name = f"{type(referrer).__module__}.{type(referrer).__qualname__}"
            if isinstance(referrer, dict):
                owners = [o for o in gc.get_referrers(referrer)
                          if getattr(o, "__dict__", None) is referrer]
                if owners:
                    name = f"{type(owners[0]).__qualname__}.__dict__"
            found[name] += 1
    return found


HOLDERS_SAMPLE = 100  # bodies and patches whose referrers the census looks up
# Where jemalloc's small size classes end, to sort objects into them (a Python object is
# one malloc of sys.getsizeof bytes under PYTHONMALLOC=malloc).
SIZE_CLASSES = (8, 16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)


def size_class(size: int) -> int:
    """The small size class a malloc of `size` bytes takes (0: a larger one)."""
    return next((limit for limit in SIZE_CLASSES if size <= limit), 0)


def by_size_class(tracked: list[object]) -> dict[str, dict[str, int]]:
    """Live objects by the small size class they take and by type: the tracked ones, and
    the strings, bytes and numbers they refer to (not tracked by gc, each counted once)."""
    found: dict[str, Counter[str]] = {}
    seen: set[int] = set()

    def count(obj: object) -> None:
        size = sys.getsizeof(obj)
        for limit in SIZE_CLASSES:
            if size <= limit:
                found.setdefault(str(limit), Counter())[type(obj).__qualname__] += 1
                return

    for obj in tracked:
        count(obj)
        for referent in gc.get_referents(obj):
            if not gc.is_tracked(referent) and id(referent) not in seen:
                seen.add(id(referent))
                count(referent)
    return {limit: dict(types.most_common(12)) for limit, types in found.items()}


def dump(directory: Path, number: int) -> None:
    rss = rss_kib()
    pymalloc_stats(directory / f"{number}.pymalloc.txt")
    if tracemalloc.is_tracing():
        tracemalloc.take_snapshot().dump(str(directory / f"{number}.snap"))
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    kopf: dict[str, list[object]] = {"kopf._cogs.structs.bodies.Body": [],
                                     "kopf._cogs.structs.patches.Patch": []}
    tracked = gc.get_objects()
    for obj in tracked:  # dead cycles not yet collected included: they hold memory
        name = f"{type(obj).__module__}.{type(obj).__qualname__}"
        counts[name] += 1
        sizes[name] += sys.getsizeof(obj)
        if name in kopf:
            kopf[name].append(obj)
    traced, peak = tracemalloc.get_traced_memory()
    bodies, patches = kopf.values()
    census = {
        "rss_kib": rss, "traced_bytes": traced, "traced_peak_bytes": peak,
        "gc_tracked_objects": sum(counts.values()),
        "gc_tracked_shallow_bytes": sum(sizes.values()),
        # kopf keeps a Body per object while it has timers or daemons (live_fresh_body)
        "kopf_bodies": len(bodies),
        "kopf_bodies_deep_bytes": deep_size([body._src for body in bodies]),  # type: ignore[attr-defined]
        # A sample: each referrer search walks every live object.
        "kopf_bodies_held_by": dict(holders(bodies[:HOLDERS_SAMPLE]).most_common(12)),
        "kopf_patches_held_by": dict(holders(patches[:HOLDERS_SAMPLE]).most_common(12)),
        **glibc_census(directory / f"{number}.malloc_info.xml"),
        **jemalloc_census(),
        "by_count": dict(counts.most_common(40)),
        "by_shallow_bytes": dict(sizes.most_common(40)),
        "by_size_class": by_size_class(tracked),
        **by_arena(tracked),
        "outside_kept_by_site": outside_kept_by_site(tracked)}
    del bodies, patches, kopf, tracked
    started = time.monotonic()
    gc.collect()  # what the operator's trim does first: how long it holds the loop
    census["full_collection_ms"] = round((time.monotonic() - started) * 1000, 1)
    # After that collection (which also empties CPython's free lists) and a purge: what
    # of the resident memory was garbage or free-list objects pinning their pages.
    census.update({f"after_collection_{key}": value for key, value in jemalloc_census().items()
                   if key in ("jemalloc_after_purge", "rss_kib_after_purge", "jemalloc_arenas")})
    (directory / f"{number}.census.json").write_text(json.dumps(census, indent=1))


def main() -> int:
    directory, frames, *argv = sys.argv[1:]
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    if int(frames) > 0:  # 0: the census alone, at full speed
        tracemalloc.start(int(frames))
    dumps = iter(range(1, 1000))

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        number = next(dumps)
        dump(out, number)
        (out / f"{number}.done").touch()  # the snapshot is whole: the benchmark may read it

    signal.signal(signal.SIGUSR2, on_signal)
    from guardedcron.cli.main import main as guardedcron

    return guardedcron(argv)


if __name__ == "__main__":
    raise SystemExit(main())
