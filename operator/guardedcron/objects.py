"""Kubernetes objects as plain dicts from the API: nested fields without a chain of `.get`s,
owner references, and the rules their names follow."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

# Kubernetes' name rules, matched whole (`fullmatch`: a `$` would let a trailing newline
# through): a namespace is a DNS label, most objects' names (GuardedCronJobs, CronJobs,
# Jobs) a DNS subdomain.
DNS_LABEL_MAX: Final = 63
DNS_SUBDOMAIN_MAX: Final = 253
_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN: Final = re.compile(rf"{_DNS_LABEL.pattern}(\.{_DNS_LABEL.pattern})*")


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


def is_dns_label(text: str, max_length: int = DNS_LABEL_MAX) -> bool:
    """Whether `text` is a DNS label (a namespace name) of at most `max_length` characters."""
    return len(text) <= max_length and _DNS_LABEL.fullmatch(text) is not None


def is_dns_subdomain(text: str, max_length: int = DNS_SUBDOMAIN_MAX) -> bool:
    """Whether `text` is a DNS subdomain (an object name) of at most `max_length` characters."""
    return len(text) <= max_length and _DNS_SUBDOMAIN.fullmatch(text) is not None
