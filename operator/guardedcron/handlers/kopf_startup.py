"""A linear start-up for kopf with indexes: kopf's toggle set, counting instead of scanning.

kopf starts handlers only once every index is filled. For that it gives each object of
its first listing of an indexed resource a toggle in one set (`operator_indexed`, a
`ToggleSet(all)`), and each object's worker, once it has indexed its object, drops its
toggle and waits until the whole set is on. Every drop (and every new toggle) wakes
every waiting worker, and each re-checks the set: with N objects that is about N²/2
wake-ups before the first pass runs. It was the operator's CPU growing with the
number of objects (docs/benchmarks.md, "Operator at scale": a restart over 5,000
GuardedCronJobs took 403 s of CPU, about 80 ms an object against 18 ms at 1,000).

`CountingToggleSet` keeps the same contract (the set is on when all, or any, of its
toggles are) but counts its toggles that are off, so a check costs O(1), and wakes
the set's waiters only when the set's own state flips: a worker whose toggle is
dropped while others remain off has nothing to wake up for. A toggle turned on or
off still wakes everyone waiting on the shared condition, as kopf's does (waiters
on that single toggle need it; it is rare). `install()` makes kopf build its sets
from this class; kopf creates them when the operator starts.

The same wait is the operator's memory peak: until every index is filled, every listed
object's worker holds its whole body (N GuardedCronJobs and N CronJobs at once on a
restart). Most of a real object's body is `metadata.managedFields`, which neither kopf
nor a pass reads except the operator's own apply entry, so `install()` also makes kopf's
watch streams drop the other entries from each object as it arrives, before any worker
keeps it (`slim_event`).

Once started, what stays is kopf's memory of each object. For a resource with a timer
(the catch-up timer is registered for every GuardedCronJob, and its `when` filter
picks the few that use it), kopf keeps the object's latest whole body for its timers
(`live_fresh_body`), whether or not a timer runs for it, for as long as the object
exists: 8.0 MB at 1,000 GuardedCronJobs after a restart (docs/benchmarks.md,
"Memory: the bodies kopf keeps and leaves").
`install()` makes kopf drop it after each event for an object with no timer or daemon
running (`forget_idle_bodies`); kopf sets it again from the next event, before it
decides whether to start one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable
from typing import Any

from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.clients import watching
from kopf._core.reactor import inventory, processing

from guardedcron.handlers.observe import own_apply_entries


class CountedToggle(aiotoggles.Toggle):
    """A toggle that tells its set when it turns on or off."""

    def __init__(self, owner: CountingToggleSet, state: bool, *, name: str | None) -> None:
        super().__init__(state, name=name, condition=owner._condition)
        self._owner = owner

    async def turn_to(self, __state: bool) -> None:
        async with self._condition:
            state = bool(__state)
            if state != self._state and self in self._owner._toggles:
                self._owner._off += -1 if state else 1
            self._state = state
            self._condition.notify_all()


class CountingToggleSet(aiotoggles.ToggleSet):
    """kopf's ToggleSet for `all` and `any`, with O(1) checks and wake-ups only when
    the set's state changes. Any other function gets kopf's own behaviour."""

    def __init__(self, fn: Callable[[Iterable[bool]], bool]) -> None:
        super().__init__(fn)
        self._off = 0  # toggles in the set that are off
        self._counting = fn is all or fn is any

    def is_on(self) -> bool:
        if self._fn is all:
            return self._off == 0
        if self._fn is any:
            return len(self._toggles) > self._off
        return super().is_on()

    async def make_toggle(self, __val: bool = False, *, name: str | None = None) -> aiotoggles.Toggle:
        if not self._counting:
            return await super().make_toggle(__val, name=name)
        toggle = CountedToggle(self, bool(__val), name=name)
        async with self._condition:
            was_on = self.is_on()
            self._toggles.add(toggle)
            self._off += not toggle.is_on()
            if self.is_on() != was_on:
                self._condition.notify_all()
        return toggle

    async def drop_toggle(self, toggle: aiotoggles.Toggle) -> None:
        await self.drop_toggles((toggle,))

    async def drop_toggles(self, toggles: Iterable[aiotoggles.Toggle]) -> None:
        if not self._counting:
            await super().drop_toggles(toggles)
            return
        async with self._condition:
            was_on = self.is_on()
            for toggle in toggles:
                if toggle in self._toggles:
                    self._toggles.discard(toggle)
                    self._off -= not toggle.is_on()
            if self.is_on() != was_on:
                self._condition.notify_all()


def slim_event(event: Any) -> None:
    """Drop, in place, the managedFields entries no one reads from a watch event's object."""
    body = event.get("object") if isinstance(event, dict) else None
    metadata = body.get("metadata") if isinstance(body, dict) else None
    if not isinstance(metadata, dict) or "managedFields" not in metadata:
        return
    own = own_apply_entries(metadata["managedFields"])
    if own:
        metadata["managedFields"] = own
    else:
        del metadata["managedFields"]


_ContinuousWatch = Callable[..., AsyncIterator[Any]]


def slimmed(continuous_watch: _ContinuousWatch) -> _ContinuousWatch:
    """kopf's stream of one resource's listing and watch events, each object slimmed."""
    if getattr(continuous_watch, "_guardedcron_slimmed", False):
        return continuous_watch

    async def slimmed_watch(**kwargs: Any) -> AsyncIterator[Any]:
        async for event in continuous_watch(**kwargs):
            slim_event(event)
            yield event

    slimmed_watch._guardedcron_slimmed = True  # type: ignore[attr-defined]
    return slimmed_watch


_ProcessSpawningCause = Callable[..., Awaitable[Collection[float]]]


def forget_idle_bodies(process_spawning_cause: _ProcessSpawningCause) -> _ProcessSpawningCause:
    """kopf's start (or stop) of an object's timers and daemons, after which the body it
    keeps for them is let go if none is running: only a running one reads it."""
    if getattr(process_spawning_cause, "_guardedcron_forgets", False):
        return process_spawning_cause

    async def forgetting(*, memory: inventory.ResourceMemory, **kwargs: Any) -> Collection[float]:
        try:
            return await process_spawning_cause(memory=memory, **kwargs)
        finally:
            if not memory.daemons_memory.running_daemons:
                memory.daemons_memory.live_fresh_body = None

    forgetting._guardedcron_forgets = True  # type: ignore[attr-defined]
    return forgetting


def install() -> None:
    """Make kopf build its toggle sets (index pre-population, pausing) from
    CountingToggleSet, slim every object its watches deliver, and keep no body for an
    object with no timer running. Idempotent; call before `kopf.operator()`."""
    aiotoggles.ToggleSet = CountingToggleSet  # type: ignore[misc]
    watching.continuous_watch = slimmed(watching.continuous_watch)
    processing.process_spawning_cause = forget_idle_bodies(  # type: ignore[assignment]
        processing.process_spawning_cause)
