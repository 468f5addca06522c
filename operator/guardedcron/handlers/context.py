"""What every handler gets: the API client, the operator's settings (every variable
and flag, read once by `guardedcron operator`), the clock, the metrics, and the
operator's short memory of its own passes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from guardedcron.handlers.observe import Packed
from guardedcron.kube import KubeClient
from guardedcron.kube.client import CONNECTIONS
from guardedcron.observability.metrics import Metrics, create_metrics
from guardedcron.spec import Settings

# Injected so tests decide what "now" is (next fire times, condition transition times).
Clock = Callable[[], datetime]

# Passes in flight at once. kopf starts a worker per object, all at once when the
# operator starts over N objects, and each pass holds its desired CronJob and the
# answers it waits for: unbounded, the operator's memory grew with N (992 MiB with
# 2,722 of 5,000 objects created on a first start). Twice the API client's connections
# keeps every connection busy.
PASSES_AT_ONCE = 2 * CONNECTIONS


def system_clock() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class _Remembered:
    """What PassMemory keeps of one GuardedCronJob."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    started: float | None = None  # when the latest pass read the caches (`time.monotonic()`)
    # Packed: a parsed status costs a few KiB per object for as long as the process runs.
    written: Packed | None = None
    done: set[str] | None = None  # first_time's actions (rare: made on the first)


class PassMemory:
    """Per GuardedCronJob (by uid): a lock that runs its passes one at a time, and the
    status the operator wrote last.

    Passes start from several watches (the GuardedCronJob, its CronJob) whose events
    arrive in any order, and the status in a watched object lags the operator's own
    write by one event. Comparing a new status against the one written last, instead
    of the one seen, keeps a second pass from writing the same status again.
    """

    def __init__(self) -> None:
        self._objects: dict[str, _Remembered] = {}

    def _of(self, uid: str) -> _Remembered:
        remembered = self._objects.get(uid)
        if remembered is None:
            remembered = self._objects[uid] = _Remembered()
        return remembered

    def lock(self, uid: str) -> asyncio.Lock:
        return self._of(uid).lock

    def pass_starting(self, uid: str) -> None:
        """A pass is about to read the caches (under the lock)."""
        self._of(uid).started = time.monotonic()

    def last_pass_started(self, uid: str) -> float | None:
        """When the latest pass in this process read the caches (`time.monotonic()`)."""
        remembered = self._objects.get(uid)
        return remembered.started if remembered is not None else None

    def written_status(self, uid: str) -> Mapping[str, Any] | None:
        remembered = self._objects.get(uid)
        return remembered.written.unpack() if remembered is not None and remembered.written else None

    def remember_status(self, uid: str, status: Mapping[str, Any]) -> None:
        self._of(uid).written = Packed.of(status)

    def first_time(self, uid: str, action: str) -> bool:
        """True once per (uid, action) in this process: an action a pass must not repeat
        on every later pass (a trigger that failed, a pod already asked to stop)."""
        remembered = self._of(uid)
        if remembered.done is not None and action in remembered.done:
            return False
        if remembered.done is None:
            remembered.done = set()
        remembered.done.add(action)
        return True

    def taken(self, uid: str) -> frozenset[str]:
        """The actions `first_time` has seen for `uid`."""
        remembered = self._objects.get(uid)
        return frozenset(remembered.done or ()) if remembered is not None else frozenset()

    def forget_action(self, uid: str, action: str) -> None:
        """Let an action that failed for a passing reason be tried again."""
        remembered = self._objects.get(uid)
        if remembered is not None and remembered.done is not None:
            remembered.done.discard(action)

    def forget(self, uid: str) -> None:
        self._objects.pop(uid, None)


@dataclass(frozen=True)
class OperatorContext:
    client: KubeClient
    settings: Settings
    clock: Clock = system_clock
    memory: PassMemory = field(default_factory=PassMemory)
    metrics: Metrics = field(default_factory=create_metrics)
    passes: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(PASSES_AT_ONCE))
