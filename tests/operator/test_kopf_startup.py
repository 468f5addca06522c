"""kopf's index pre-population, made linear (guardedcron.handlers.kopf_startup).

The pattern is kopf's own at start-up: a toggle per listed object in one ToggleSet(all);
each object's worker drops its toggle, then waits for the whole set. The count of
checks the waiters make is what grew as N² (not a timing: a count)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.clients import watching
from kopf._core.reactor import orchestration, processing, running

from guardedcron import contract
from guardedcron.handlers import kopf_startup

WAIT_BOUND_SECONDS = 10.0


async def start_up_like_kopf(toggles: aiotoggles.ToggleSet, objects: int) -> int:
    """kopf's pre-population: a blocker (the listing), then objects arriving one per
    loop turn, each dropping its toggle and waiting. Returns how often the set was checked."""
    checks = 0
    check = toggles.is_on

    def counted() -> bool:
        nonlocal checks
        checks += 1
        return check()

    toggles.is_on = counted  # type: ignore[method-assign]
    blocker = await toggles.make_toggle(name="listing")

    async def worker(toggle: aiotoggles.Toggle) -> None:
        await toggles.drop_toggle(toggle)
        await toggles.wait_for(True)

    workers = []
    for _ in range(objects):
        workers.append(asyncio.create_task(worker(await toggles.make_toggle())))
        for _ in range(3):  # the watch stream's next event comes a few loop turns later
            await asyncio.sleep(0)
    await toggles.drop_toggle(blocker)
    await asyncio.wait_for(asyncio.gather(*workers), WAIT_BOUND_SECONDS)
    return checks


async def test_kopf_builds_counting_sets_once_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiotoggles, "ToggleSet", aiotoggles.ToggleSet)  # restored afterwards
    monkeypatch.setattr(watching, "continuous_watch", watching.continuous_watch)
    monkeypatch.setattr(processing, "process_spawning_cause", processing.process_spawning_cause)
    kopf_startup.install()
    # kopf's orchestration (operator_indexed) and runner (operator_paused) build their
    # sets through the module attribute, at the operator's start.
    assert aiotoggles.ToggleSet is kopf_startup.CountingToggleSet
    assert all(vars(module)["aiotoggles"] is aiotoggles for module in (orchestration, running))
    objects = 400
    checks = await start_up_like_kopf(aiotoggles.ToggleSet(all), objects)
    # A few checks per object (its make, its drop, its wait, its wake-up); kopf's own
    # set is checked by every waiter on every drop (about N²/2: 80,000 here).
    assert checks <= 10 * objects, f"{checks} checks of the set for {objects} objects"


def _states(toggles: Iterable[aiotoggles.Toggle]) -> list[bool]:
    return [t.is_on() for t in toggles]


@pytest.mark.parametrize("fn", [all, any], ids=["all", "any"])
async def test_same_answers_as_kopfs_set(fn: Callable[[Iterable[bool]], bool]) -> None:
    """Random makes, turns and drops: the counting set is on exactly when kopf's is."""
    rng = random.Random(13)
    ours, theirs = kopf_startup.CountingToggleSet(fn), aiotoggles.ToggleSet(fn)
    pairs: list[tuple[aiotoggles.Toggle, aiotoggles.Toggle]] = []
    for step in range(600):
        action = rng.choice(("make", "make", "turn", "drop", "drop_many"))
        if action == "make" or not pairs:
            state = rng.random() < 0.5
            pairs.append((await ours.make_toggle(state), await theirs.make_toggle(state)))
        elif action == "turn":
            state = rng.random() < 0.5
            mine, kopfs = rng.choice(pairs)
            await mine.turn_to(state)
            await kopfs.turn_to(state)
        elif action == "drop":
            mine, kopfs = pairs.pop(rng.randrange(len(pairs)))
            await ours.drop_toggle(mine)
            await theirs.drop_toggle(kopfs)
            # A dropped toggle may still be turned (kopf does not forbid it): no effect.
            await mine.turn_to(not mine.is_on())
            await kopfs.turn_to(not kopfs.is_on())
        else:
            dropped = [pairs.pop(rng.randrange(len(pairs))) for _ in range(min(3, len(pairs)))]
            await ours.drop_toggles([m for m, _ in dropped])
            await theirs.drop_toggles([k for _, k in dropped])
        assert ours.is_on() == theirs.is_on(), f"step {step} ({action})"
        assert len(ours) == len(theirs)
        assert _states(ours).count(True) == _states(theirs).count(True)


async def test_waiters_wake_when_the_set_turns() -> None:
    toggles = kopf_startup.CountingToggleSet(all)
    first, second = await toggles.make_toggle(), await toggles.make_toggle(True)
    waiting = asyncio.create_task(toggles.wait_for(True))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    await second.turn_to(False)
    await toggles.drop_toggle(first)
    await asyncio.sleep(0.01)
    assert not waiting.done()  # `second` is off now
    await second.turn_to(True)
    await asyncio.wait_for(waiting, WAIT_BOUND_SECONDS)
    off = asyncio.create_task(toggles.wait_for(False))
    await toggles.make_toggle(False)
    await asyncio.wait_for(off, WAIT_BOUND_SECONDS)


OWN_APPLY = {"manager": contract.FIELD_MANAGER, "operation": "Apply", "fieldsV1": {"f:spec": {}}}
OTHERS = [{"manager": "kubectl-create", "operation": "Update", "fieldsV1": {"f:spec": {}}},
          {"manager": contract.FIELD_MANAGER, "operation": "Update", "subresource": "status",
           "fieldsV1": {"f:status": {}}},
          {"manager": "kopf", "operation": "Update", "fieldsV1": {"f:metadata": {}}}]


def test_a_watched_object_keeps_only_the_operators_own_apply_entry() -> None:
    event: dict[str, Any] = {"type": "MODIFIED",
                             "object": {"metadata": {"name": "n", "managedFields": [*OTHERS, OWN_APPLY]}}}
    kopf_startup.slim_event(event)
    assert event["object"]["metadata"] == {"name": "n", "managedFields": [OWN_APPLY]}

    event = {"type": None, "object": {"metadata": {"name": "n", "managedFields": OTHERS}}}
    kopf_startup.slim_event(event)
    assert event["object"]["metadata"] == {"name": "n"}

    gone: dict[str, Any] = {"type": "ERROR", "object": {"code": 410}}  # not an object: left as it is
    kopf_startup.slim_event(gone)
    assert gone == {"type": "ERROR", "object": {"code": 410}}


async def test_installed_watches_slim_every_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """install() wraps kopf's stream of one resource (the listing, then the watches):
    what kopf's workers receive is slimmed, whatever the stream yields between objects."""
    async def stream(**_: object) -> AsyncIterator[object]:
        yield {"type": None, "object": {"metadata": {"name": "a", "managedFields": [*OTHERS, OWN_APPLY]}}}
        yield watching.Bookmark.LISTED
        yield {"type": "ADDED", "object": {"metadata": {"name": "b", "managedFields": OTHERS}}}

    monkeypatch.setattr(aiotoggles, "ToggleSet", aiotoggles.ToggleSet)
    monkeypatch.setattr(watching, "continuous_watch", stream)
    monkeypatch.setattr(processing, "process_spawning_cause", processing.process_spawning_cause)
    kopf_startup.install()
    kopf_startup.install()  # idempotent: wrapped once
    assert watching.continuous_watch is not stream
    slimmed_stream: Callable[..., AsyncIterator[object]] = watching.continuous_watch
    seen = [event async for event in slimmed_stream()]
    assert seen == [{"type": None, "object": {"metadata": {"name": "a", "managedFields": [OWN_APPLY]}}},
                    watching.Bookmark.LISTED,
                    {"type": "ADDED", "object": {"metadata": {"name": "b"}}}]


def test_the_kopf_parts_the_adapters_replace_are_still_there_as_they_were() -> None:
    """The three adapters of kopf_startup reach into kopf's private modules: a kopf that
    renamed or reshaped one of these parts fails here, by name, rather than start an
    operator that is quadratic at start-up or keeps every body again."""
    import inspect

    from kopf._core.reactor import inventory

    assert set(inspect.signature(aiotoggles.ToggleSet.__init__).parameters) == {"self", "fn"}
    for method in ("is_on", "make_toggle", "drop_toggle", "drop_toggles"):
        assert callable(getattr(aiotoggles.ToggleSet, method)), method
    async def fields() -> tuple[set[str], set[str]]:
        daemons = inventory.ResourceMemory().daemons_memory
        return set(vars(aiotoggles.ToggleSet(all))), set(dir(daemons))
    toggle_set, daemons = asyncio.run(fields())
    assert {"_toggles", "_condition", "_fn"} <= toggle_set
    assert {"live_fresh_body", "running_daemons"} <= daemons
    assert "condition" in inspect.signature(aiotoggles.Toggle.__init__).parameters
    assert inspect.isasyncgenfunction(inspect.unwrap(watching.continuous_watch))
    assert "memory" in inspect.signature(processing.process_spawning_cause).parameters
