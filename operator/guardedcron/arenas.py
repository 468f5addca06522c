"""What the operator keeps per object, made on pages of its own: a jemalloc arena apart.

The operator's resident memory after a start over N objects was three times what it
keeps live (docs/design.md, "Memory at scale"). kopf and the handlers make the
records that live as long as an object (kopf's per-object memories and index stores,
the index entries, the last status written, the lock and metric series of each
GuardedCronJob) while the start-up's flood of short-lived objects (bodies, kopf's
per-event wrappers, each waiting worker) is being made: both kinds come from the same
slabs, and once the flood is freed each slab keeps a few records and stays resident.

`kept()` marks a synchronous section whose allocations are made in an arena of their
own (`arenas.create`, then `thread.arena` for the calling thread): the records made
there pack together, and the slabs of the flood, with nothing long-lived on them,
empty whole and go back to the system. Inside a section the thread's cache of freed
regions is off (`thread.tcache.enabled`): it would otherwise hand the section regions
freed elsewhere, and the section's frees to later allocations elsewhere.

Where the allocations go never changes what the program does: without jemalloc (glibc,
a developer's machine), before `enable()`, or for code that runs outside a section,
`kept()` does nothing and everything is allocated where it would have been. A section
that misses a record, or holds a short-lived one, costs memory, not correctness.
CPython's own free lists would hand a section objects freed elsewhere: a section holds
the free lists of dicts and floats while it runs, and small tuples kept as keys are made
with `fresh_tuple`.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

_MallCtl = Callable[[bytes, Any, Any, Any, int], int]


class _Arena:
    """The kept arena, the calling thread's own arena to go back to, and mallctl."""

    def __init__(self, mallctl: _MallCtl, kept: int, default: int) -> None:
        self.mallctl = mallctl
        self.kept = ctypes.c_uint(kept)
        self.default = ctypes.c_uint(default)

    def enter(self) -> None:
        self.mallctl(b"thread.tcache.enabled", None, None, ctypes.byref(_OFF), ctypes.sizeof(_OFF))
        self.mallctl(b"thread.arena", None, None, ctypes.byref(self.kept), ctypes.sizeof(self.kept))

    def leave(self) -> None:
        self.mallctl(b"thread.arena", None, None, ctypes.byref(self.default), ctypes.sizeof(self.default))
        self.mallctl(b"thread.tcache.enabled", None, None, ctypes.byref(_ON), ctypes.sizeof(_ON))


# The lengths of CPython 3.11's free lists of dicts (and of their smallest tables) and of
# floats (PyDict_MAXFREELIST, PyFloat_MAXFREELIST).
FREE_DICTS = 80
FREE_FLOATS = 100
_OFF = ctypes.c_bool(False)
_ON = ctypes.c_bool(True)
_arena: _Arena | None = None
_local = threading.local()  # per thread: inside a section already (sections nest as one)


def _mallctl() -> _MallCtl | None:
    """jemalloc's mallctl when jemalloc serves this process (preloaded), else None."""
    try:
        function = getattr(ctypes.CDLL(None), "mallctl", None)
    except OSError:
        return None
    if function is None:
        return None
    function.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


def _read_uint(mallctl: _MallCtl, name: bytes) -> int | None:
    value = ctypes.c_uint(0)
    size = ctypes.c_size_t(ctypes.sizeof(value))
    if mallctl(name, ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
        return None
    return int(value.value)


def enable() -> int | None:
    """Create the kept arena for sections run by the calling thread (the event loop's);
    its index, or None where jemalloc does not serve (then `kept()` does nothing).
    Once per process: a second call returns the same arena."""
    global _arena
    if _arena is not None:
        return int(_arena.kept.value)
    mallctl = _mallctl()
    if mallctl is None:
        return None
    default = _read_uint(mallctl, b"thread.arena")
    kept = _read_uint(mallctl, b"arenas.create")
    if default is None or kept is None:
        return None
    _arena = _Arena(mallctl, kept, default)
    return kept


@contextlib.contextmanager
def kept(when: bool = True) -> Iterator[None]:
    """Within (synchronous code only: a task switch inside would put other tasks'
    allocations here too), allocate in the kept arena; `when` False: as anywhere else.
    A section turns the thread's cache off and on again (a flush, then a new cache) and
    holds CPython's free lists of dicts and floats: 0.03-0.1 ms, so code that makes a
    record only sometimes enters one only then."""
    arena = _arena
    if arena is None or not when or getattr(_local, "inside", False):
        yield
        return
    held = _hold_free_lists()
    _local.inside = True
    arena.enter()
    try:
        yield
    finally:
        arena.leave()
        del held
        _local.inside = False


def _hold_free_lists() -> list[object]:
    """Empty CPython's free lists of dicts and floats, made anywhere and handed out before
    malloc is asked: held for a section, a dict or float made in it is made in the arena.
    (Small tuples have free lists too long to empty, 2,000 of each length: fresh_tuple.)"""
    held: list[object] = [{"": None} for _ in range(FREE_DICTS)]
    held.extend(number * 1.0 for number in range(FREE_FLOATS))
    return held


def kept_until_suspended(coroutine: Coroutine[Any, Any, T]) -> Awaitable[T]:
    """Await a coroutine whose allocations are kept for as long as it runs without
    suspending. kopf's record-keeping calls are coroutines that, today, never suspend:
    they run whole in the section. If one ever does, the section ends there and the
    rest runs as any other code (other tasks must not allocate in the section)."""
    return _KeptUntilSuspended(coroutine)


class _KeptUntilSuspended(Awaitable[T]):
    def __init__(self, coroutine: Coroutine[Any, Any, T]) -> None:
        self._coroutine = coroutine

    def __await__(self) -> Generator[Any, Any, T]:
        coroutine = self._coroutine
        with kept():
            try:
                pending = coroutine.send(None)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
        while True:  # suspended: hand the rest to the event loop as `await` would
            try:
                answer = yield pending
            except BaseException as thrown:  # cancellation, or a failed future's error
                try:
                    pending = coroutine.throw(thrown)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
            else:
                try:
                    pending = coroutine.send(answer)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]


def fresh(text: str) -> str:
    """A copy of `text` made now (in a section: in the kept arena). A string parsed from
    an API answer and then kept as a key (a uid, a name) would otherwise pin the answer's
    slab; `str(text)` and slicing return the same object."""
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


class _FreshTuple(tuple):  # type: ignore[type-arg]
    """Allocated anew each time: CPython's free lists serve exact tuples only."""

    __slots__ = ()


def fresh_tuple(items: tuple[T, ...]) -> tuple[T, ...]:
    """A copy of `items` made now (in a section: in the kept arena), equal to and hashed
    as the plain tuple. CPython hands out a small tuple from a free list of ones freed
    anywhere (up to 2,000 of each length), so a tuple kept as a key, made in a section
    amid a flood, would be an old one on the flood's pages."""
    return _FreshTuple(items)


def fresh_float(value: float) -> float:
    """A copy of `value` made now (in a section: in the kept arena); `float(x)` returns x."""
    return value * 1.0


def fresh_bytes(data: bytes) -> bytes:
    """A copy of `data` made now (`bytes(data)` returns the same object)."""
    return bytes(memoryview(data))


def arena_of(obj: object) -> int | None:
    """The jemalloc arena that holds `obj`; None where jemalloc does not serve. For tests
    and the benchmarks' census."""
    return arena_at(id(obj))


def arena_at(address: int) -> int | None:
    """The jemalloc arena that holds the allocation at `address` (`arenas.lookup`); None
    where jemalloc does not serve."""
    mallctl = _mallctl()
    if mallctl is None:
        return None
    found = ctypes.c_uint(0)
    size = ctypes.c_size_t(ctypes.sizeof(found))
    pointer = ctypes.c_void_p(address)
    if mallctl(b"arenas.lookup", ctypes.byref(found), ctypes.byref(size), ctypes.byref(pointer),
               ctypes.sizeof(pointer)) != 0:
        return None
    return int(found.value)
