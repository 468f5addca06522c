"""Removing the Jobs of skipped runs once status records them (status/skips.py says which)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from guardedcron.handlers.context import PassMemory
from guardedcron.kube import JOBS, ApiError, ApiUnreachable, Conflict, KubeClient, NotFound
from guardedcron.status import EventReason, RunEvent
from guardedcron.status.skips import SkippedJob

Logger = logging.Logger | logging.LoggerAdapter[Any]


async def remove_skipped_jobs(removals: Sequence[SkippedJob], *, namespace: str, uid: str,
                              client: KubeClient, memory: PassMemory, logger: Logger) -> list[RunEvent]:
    """Delete each Job (that instance only, its pods in the background); the Events to
    post: one per Job the API server refuses to delete for good."""
    events: list[RunEvent] = []
    for removal in removals:
        action = f"remove\n{removal.job}\n{removal.uid}"
        if not memory.first_time(uid, action):
            continue  # asked already; the Job's deletion event ends its part
        try:
            await client.delete(JOBS, namespace, removal.job, uid=removal.uid)
        except (NotFound, Conflict):
            continue  # gone already, or the name is a newer Job's
        except ApiUnreachable as error:
            memory.forget_action(uid, action)  # try again on the next pass
            logger.info(f"Could not remove Job {removal.job} of a skipped run: {error}")
            continue
        except ApiError as error:
            if error.code >= 500 or error.code == 429:
                memory.forget_action(uid, action)
                continue
            events.append(RunEvent(
                EventReason.SKIPPED_JOB_KEPT,
                f"run {removal.job} was skipped and is recorded in status, but its Job stays "
                f"Failed (generic Job alerts count it): deleting it failed: {error}",
                subject=removal.job))
            continue
        logger.debug(f"Removed Job {removal.job}: its run was skipped and status records it.")
    return events
