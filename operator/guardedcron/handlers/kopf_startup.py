"""Two adapters of kopf's internals, for the operator's memory.

Most of a real object's body is `metadata.managedFields`, which neither kopf nor a pass
reads except the operator's own apply entry, so `install()` makes kopf's watch streams
drop the other entries from each object as it arrives, before kopf's worker for it
holds it (`slim_event`).

For a resource with a timer (the catch-up timer is registered for every GuardedCronJob,
and its `when` filter picks the few that use it), kopf keeps the object's latest whole
body for its timers (`live_fresh_body`), whether or not a timer runs for it, for as long
as the object exists: 8.0 MB at 1,000 GuardedCronJobs after a restart. `install()` makes
kopf drop it after each event for an object with no timer or daemon
running (`forget_idle_bodies`); kopf sets it again from the next event, before it
decides whether to start one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any

from kopf._cogs.clients import watching
from kopf._core.reactor import inventory, processing

from guardedcron.handlers.observe import own_apply_entries


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
    """Make kopf slim every object its watches deliver and keep no body for an object
    with no timer running. Idempotent; call before `kopf.operator()`."""
    watching.continuous_watch = slimmed(watching.continuous_watch)
    processing.process_spawning_cause = forget_idle_bodies(  # type: ignore[assignment]
        processing.process_spawning_cause)
