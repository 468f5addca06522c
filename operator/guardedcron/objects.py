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
