"""Reading nested Kubernetes objects (plain dicts from the API) without a chain of `.get`s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def get_path(obj: Any, *keys: str) -> Any:
    """`obj[k1][k2]...`, or None as soon as a level is missing or not a mapping."""
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def uid_of(obj: Any) -> str:
    """`metadata.uid`, or "" when the object has none yet (it was never created)."""
    return str(get_path(obj, "metadata", "uid") or "")


def controlled_by(obj: Any, uid: str) -> bool:
    """Whether `obj` has a controller owner reference to the object with this uid."""
    owners = get_path(obj, "metadata", "ownerReferences")
    return bool(uid) and isinstance(owners, list) and any(
        isinstance(o, Mapping) and o.get("uid") == uid and o.get("controller") is True for o in owners)
