"""Which lock a GuardedCronJob's runs take, and whether its namespace may take it (pure).

Locks belong to namespaces (docs/design.md, "Multi-tenant clusters"): the lock of a
GuardedCronJob is "<namespace>/<lease.name>", so no spec can name another namespace's
lock. Namespaces share a lock only through the cluster admin's allow-list (the
operator setting `spec.settings.ENV_SHARED_LOCKS`), whose locks are "shared:<name>".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from guardedcron import contract

# lease.name: the part after "<namespace>/", so that the whole lock fits the guard's limit.
LEASE_NAME_MAX: Final = (contract.NAME_MAX - contract.NAMESPACE_MAX
                         - len(contract.NAMESPACE_LOCK_SEPARATOR))
# A character that would let lease.name step out of its namespace, or that the guard refuses.
LEASE_NAME_FORBIDDEN: Final = re.compile(r"[/:\x00-\x1f\x7f]")
# Shared lock names: chosen by the admin, written in the allow-list and in specs alike.
SHARED_LOCK_NAME_MAX: Final = 63
SHARED_LOCK_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9._]*[a-z0-9])?")  # whole string
SHARED_LOCK_NAME_RULE: Final = ("1-63 lower-case letters, digits, '-', '.' or '_', starting "
                                "and ending with a letter or digit")


@dataclass(frozen=True)
class SharedLock:
    """One entry of the allow-list: the namespaces that may take lock "shared:<name>"."""

    name: str
    namespaces: frozenset[str]


def namespace_lock(namespace: str, name: str) -> str:
    """The lock of lease.name `name` (or metadata.name when unset) in `namespace`."""
    return f"{namespace}{contract.NAMESPACE_LOCK_SEPARATOR}{name}"


def shared_lock(name: str) -> str:
    """The lock of the allow-list's shared lock `name`."""
    return f"{contract.SHARED_LOCK_PREFIX}{name}"


def may_use(namespace: str, lock: str, allowed: Iterable[SharedLock]) -> bool:
    """Whether a run in `namespace` may take `lock`: one of its own, or a shared lock
    the allow-list grants it."""
    if lock.startswith(namespace_lock(namespace, "")):
        return True
    if not lock.startswith(contract.SHARED_LOCK_PREFIX):
        return False
    name = lock.removeprefix(contract.SHARED_LOCK_PREFIX)
    return any(entry.name == name and namespace in entry.namespaces for entry in allowed)


def shared_lock_refusal(namespace: str, name: str, allowed: Iterable[SharedLock], *,
                        setting: str) -> str | None:
    """Why `namespace` may not take shared lock `name`, naming the allow-list's `setting`
    (where the admin writes it); None if it may."""
    entries = [entry for entry in allowed if entry.name == name]
    if any(namespace in entry.namespaces for entry in entries):
        return None
    if not entries:
        listed = f"lists no shared lock {name!r}"
    else:
        others = sorted({ns for entry in entries for ns in entry.namespaces})
        listed = f"grants {name!r} to namespaces {', '.join(others)} only"
    return (f"namespace {namespace} may not use shared lock {name!r}: the cluster admin's "
            f"allow-list, {setting}, {listed}; no CronJob runs until it "
            "allows this namespace or spec.lease.sharedLock is removed")
