"""What the operator keeps of the cluster, and the queue of passes to run.

**Caches.** Every GuardedCronJob and every CronJob, Job and Pod labelled as guardedcron's,
packed (handlers/observe.py), by the GuardedCronJob's key. kopf's watches keep them
current through `on.event` handlers, which store and return at once; before the watches
start, `prime` fills them from paginated lists, one page in memory at a time, so a
GuardedCronJob's first pass sees its children as an index would.

**Queue.** A watch event only names a GuardedCronJob due a pass; `WORKERS` tasks run
the passes, each key at most once in the queue at a time. So kopf's worker for an event
ends as soon as the event is stored, and drops the body: at start, with every object
listed at once, the operator holds one page and the passes in flight, not every body
until every pass has run. A pass that raises runs again after `RETRY_SECONDS`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from guardedcron import contract
from guardedcron.handlers.observe import Body, Key, Packed, index_by_name, index_job, index_pod
from guardedcron.kube import CRONJOBS, GUARDED_CRONJOBS, JOBS, PODS, KubeClient, Resource
from guardedcron.objects import uid_of

logger = logging.getLogger(__name__)

OWNED_SELECTOR = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY_VALUE}"
# Passes in flight at once: twice the API client's connections keeps every one busy.
WORKERS = 64
RETRY_SECONDS = 15.0  # a pass that raised (an API server hiccup) runs again after this


class ObjectCache:
    """One resource's objects, packed, by the key of the GuardedCronJob they belong to
    (its own for a GuardedCronJob or its CronJob), then by uid."""

    def __init__(self, entry_of: Callable[[Body], dict[Key, Packed]]) -> None:
        self._entry_of = entry_of
        self._by_key: dict[Key, dict[str, Packed]] = {}
        self._key_of: dict[str, Key] = {}

    def store(self, body: Body) -> None:
        uid = uid_of(body)
        entry = self._entry_of(body)
        old = self._key_of.get(uid)
        if old is not None and old not in entry:
            self._drop(old, uid)
        for key, packed in entry.items():
            self._by_key.setdefault(key, {})[uid] = packed
            self._key_of[uid] = key

    def delete(self, body: Body) -> None:
        uid = uid_of(body)
        key = self._key_of.get(uid)
        if key is not None:
            self._drop(key, uid)

    def _drop(self, key: Key, uid: str) -> None:
        self._key_of.pop(uid, None)
        objects = self._by_key.get(key)
        if objects is not None:
            objects.pop(uid, None)
            if not objects:
                del self._by_key[key]

    def get(self, key: Key) -> Iterable[Packed]:
        return (self._by_key.get(key) or {}).values()

    def __len__(self) -> int:
        return len(self._key_of)


@dataclass
class Caches:
    guarded_cronjobs: ObjectCache = field(default_factory=lambda: ObjectCache(index_by_name))
    # By its own name, the GuardedCronJob's: another CronJob carrying the labels under
    # another name must not stand in for it.
    cronjobs: ObjectCache = field(default_factory=lambda: ObjectCache(index_by_name))
    jobs: ObjectCache = field(default_factory=lambda: ObjectCache(index_job))
    pods: ObjectCache = field(default_factory=lambda: ObjectCache(index_pod))

    def of(self, resource: Resource) -> ObjectCache:
        return {GUARDED_CRONJOBS: self.guarded_cronjobs, CRONJOBS: self.cronjobs,
                JOBS: self.jobs, PODS: self.pods}[resource]


async def prime(caches: Caches, client: KubeClient, namespaces: Iterable[str | None]) -> None:
    """Fill the caches from lists of every watched namespace (None: the whole cluster),
    children first: a GuardedCronJob stored is one a pass may run for."""
    for resource, selector in ((CRONJOBS, OWNED_SELECTOR), (JOBS, OWNED_SELECTOR),
                               (PODS, OWNED_SELECTOR), (GUARDED_CRONJOBS, None)):
        cache = caches.of(resource)
        for namespace in namespaces:
            async for page in client.pages(resource, namespace, label_selector=selector):
                for body in page:
                    cache.store(body)
    logger.info("Cached %d GuardedCronJobs, %d CronJobs, %d Jobs and %d Pods.",
                len(caches.guarded_cronjobs), len(caches.cronjobs), len(caches.jobs), len(caches.pods))


class PassQueue:
    """Keys of GuardedCronJobs due a pass; a key is in the queue at most once (a pass for
    it reads the caches when it starts, so one pass serves every event before that)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()

    def add(self, key: Key) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_later(self, key: Key, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.add, key)

    async def next(self) -> Key:
        key = await self._queue.get()
        self._queued.discard(key)
        return key

    def __len__(self) -> int:
        return len(self._queued)


async def run_workers(queue: PassQueue, run: Callable[[Key], Awaitable[float | None]],
                      count: int = WORKERS) -> None:
    """`count` tasks, each taking the next key and running its pass until cancelled. A
    pass returns a delay to run it again after (None: not again until an event), and one
    that raises runs again after RETRY_SECONDS."""

    async def work() -> None:
        while True:
            key = await queue.next()
            try:
                again = await run(key)
            except asyncio.CancelledError:
                raise
            except Exception:  # the pass has said why (Event, log); it runs again
                logger.exception("A pass of %s/%s failed; it runs again in %.0f s.", *key, RETRY_SECONDS)
                again = RETRY_SECONDS
            if again is not None:
                queue.add_later(key, again)

    await asyncio.gather(*(work() for _ in range(count)))
