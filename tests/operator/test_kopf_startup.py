"""The adapters of kopf's internals (guardedcron.handlers.kopf_startup): slimmed watch
events, and a test that fails on a kopf whose adapted parts changed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.clients import watching
from kopf._core.reactor import processing

from guardedcron import contract
from guardedcron.handlers import kopf_startup

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
    """The adapters of kopf_startup reach into kopf's private modules: a kopf that
    renamed or reshaped one of these parts fails here, by name, rather than start an
    operator that keeps every body again."""
    import inspect


    assert inspect.isasyncgenfunction(inspect.unwrap(watching.continuous_watch))
    assert "memory" in inspect.signature(processing.process_spawning_cause).parameters
