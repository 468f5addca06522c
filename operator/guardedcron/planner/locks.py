"""Locks belong to namespaces (docs/design.md, "Multi-tenant clusters"): the operator
refuses a shared lock the cluster admin's allow-list does not grant, and deletes a
CronJob of its own whose runs would take a lock the namespace may not use.

The second case is the security boundary outliving a change: a namespace taken off the
allow-list, or an object admitted before lease.name was confined to its namespace,
must not keep running with that lock because its CronJob already exists. An invalid
spec otherwise leaves the CronJob as it was (still guarded); not here. (A valid spec's
lock is always allowed, and applying it replaces the CronJob's lock, with a LockChanged
Event when that differs.) Deleting the CronJob deletes its Jobs too (background
propagation), so a run already holding the lock is stopped as well (its pod gets the
usual graceful termination).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from logging import INFO
from typing import Any

from guardedcron.builders import locks_in_cronjob
from guardedcron.objects import get_path, uid_of
from guardedcron.planner.actions import Action, DeleteCronJob, Log, Refused
from guardedcron.planner.once import Once
from guardedcron.spec import ParsedSpec, Problem
from guardedcron.spec.locks import may_use, shared_lock_refusal
from guardedcron.spec.settings import SHARED_LOCKS_SETTING, Settings
from guardedcron.status import EventReason, RunEvent

SHARED_LOCK_FIELD = "spec.lease.sharedLock"


def lock_refusal(parsed: ParsedSpec, settings: Settings) -> Problem | None:
    """The problem with a valid spec's lock under the allow-list, if any."""
    shared = parsed.spec.lease.shared_lock
    if shared is None:
        return None  # "<namespace>/...": the parser already keeps it inside the namespace
    refusal = shared_lock_refusal(parsed.namespace, shared, settings.shared_locks,
                                  setting=SHARED_LOCKS_SETTING)
    return None if refusal is None else Problem(SHARED_LOCK_FIELD, refusal)


def refusal_event(problem: Problem, once: Once) -> Generator[Action, Any, list[RunEvent]]:
    """One Event per refusal (per operator process; the Event's name is deterministic,
    so a restarted operator's second post is refused as AlreadyExists)."""
    if not (yield from once.first_time(f"lock-refused\n{problem.message}")):
        return []
    return [RunEvent(EventReason.LOCK_NOT_ALLOWED, f"{problem.field_path}: {problem.message}",
                     subject=problem.message)]


def lock_change_event(cronjob: Mapping[str, Any], parsed: ParsedSpec) -> list[RunEvent]:
    """An Event when the live CronJob's runs take another lock than the spec's now, before
    the apply that changes it: a run under the old name and one under the new do not
    exclude each other, so the change must not pass unseen (docs/design.md, "The allow-list")."""
    old = sorted(locks_in_cronjob(cronjob))
    new = parsed.spec.lease.name
    if not old or old == [new]:
        return []
    name = str(get_path(cronjob, "metadata", "name") or "")
    return [RunEvent(EventReason.LOCK_CHANGED,
                     f"CronJob {name}: runs took lock {', '.join(map(repr, old))} and now take "
                     f"{new!r}; a run still holding the old lock does not keep a new run out",
                     subject=f"{old}\n{new}")]


def delete_if_lock_forbidden(cronjob: Mapping[str, Any], *, namespace: str, settings: Settings,
                             ) -> Generator[Action, Any, tuple[bool, list[RunEvent]]]:
    """Delete `cronjob` (this GuardedCronJob's own) when one of the locks its runs take
    is not one its namespace may use now. Returns (deleted, Events to post)."""
    forbidden = sorted(lock for lock in locks_in_cronjob(cronjob)
                       if not may_use(namespace, lock, settings.shared_locks))
    if not forbidden:
        return False, []
    name = str(get_path(cronjob, "metadata", "name") or "")
    why = (f"its runs take lock {', '.join(map(repr, forbidden))}, which namespace "
           f"{namespace} may not use: its own locks start with \"{namespace}/\", and shared "
           f"locks need the cluster admin's allow-list, {SHARED_LOCKS_SETTING}")
    result = yield DeleteCronJob(namespace, name, uid_of(cronjob) or None)
    if isinstance(result, Refused):
        if result.code == 404:
            return True, []
        if not result.permanent:
            raise result.error  # the pass runs again later
        return False, [RunEvent(EventReason.LOCK_NOT_ALLOWED,
                                f"CronJob {name} must go, {why}; deleting it failed: {result.error}",
                                subject=f"{why}\n{result.error}")]
    yield Log(INFO, f"Deleted CronJob {name}: {why}.")  # the Event below tells people
    return True, [RunEvent(EventReason.LOCK_NOT_ALLOWED,
                           f"deleted CronJob {name} and its Jobs (a run in progress is "
                           f"stopped): {why}", subject=f"deleted\n{uid_of(cronjob)}")]
