"""Actions a pass takes once per GuardedCronJob and operator process.

Every Job or Pod event starts a pass, so an Event about a refused request or a pod
already asked to stop would otherwise be repeated on every one. A restarted operator
starts with none taken: it tries again, and an Event's deterministic name keeps the
API server from storing it twice.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from typing import Any

from guardedcron.planner.actions import Action, Forget, Remember


class Once:
    """The marks this pass starts with (`PassView.done`) and those it adds; the executor
    keeps each added mark (`Remember`) and drops each released one (`Forget`)."""

    def __init__(self, done: Iterable[str]) -> None:
        self._taken = set(done)

    def first_time(self, key: str) -> Generator[Action, Any, bool]:
        """Whether the action `key` is taken for the first time now (and mark it)."""
        if key in self._taken:
            return False
        self._taken.add(key)
        yield Remember(key)
        return True

    def release(self, key: str) -> Generator[Action, Any, None]:
        """Let an action that failed for a passing reason be taken again."""
        self._taken.discard(key)
        yield Forget(key)
