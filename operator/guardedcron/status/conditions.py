"""The one helper that sets status conditions (pure).

Rules, the same as cert-manager's and the Kubernetes API conventions:
- `lastTransitionTime` moves only when `status` changes; a new reason or message
  alone updates the condition in place, so tools watching transitions are not misled;
- every condition carries the `observedGeneration` it was computed from;
- the list order is fixed (known types first, in `CONDITION_ORDER`, then others by
  name), so recomputing an unchanged status gives an equal list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Final, Literal

from guardedcron.status.times import format_time

ConditionStatus = Literal["True", "False", "Unknown"]

READY: Final = "Ready"
INVALID: Final = "Invalid"
STALLED: Final = "Stalled"
MISSED_RUN: Final = "MissedRun"
OVERLAP: Final = "Overlap"
DEGRADED: Final = "Degraded"
# Only with spec.suspendAfterFailures set: True while the operator keeps the CronJob suspended.
SUSPENDED: Final = "Suspended"
CONDITION_ORDER: Final = (READY, INVALID, STALLED, MISSED_RUN, OVERLAP, DEGRADED, SUSPENDED)

# Kubernetes caps a condition message at 32 KiB; status stays far smaller than that.
MESSAGE_MAX: Final = 1024
_STATUSES: Final = ("True", "False", "Unknown")


def set_condition(
    conditions: Iterable[Mapping[str, Any]] | None,
    *,
    type: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    observed_generation: int,
    now: datetime,
) -> list[dict[str, Any]]:
    """A new, ordered list with condition `type` set; the input is not changed."""
    if status not in _STATUSES:
        raise ValueError(f"condition status must be one of {', '.join(_STATUSES)}, not {status!r}")
    if not type or not reason:
        raise ValueError("a condition needs a type and a reason")
    current = [dict(c) for c in conditions or () if c.get("type") != type]
    previous = get_condition(conditions, type)
    transition = format_time(now)
    if previous is not None and previous.get("status") == status and previous.get("lastTransitionTime"):
        transition = str(previous["lastTransitionTime"])
    current.append({
        "type": type,
        "status": status,
        "reason": reason,
        "message": truncate(message, MESSAGE_MAX),
        "observedGeneration": observed_generation,
        "lastTransitionTime": transition,
    })
    return sorted(current, key=_order)


def get_condition(conditions: Iterable[Mapping[str, Any]] | None, type: str) -> dict[str, Any] | None:
    for condition in conditions or ():
        if condition.get("type") == type:
            return dict(condition)
    return None


def is_true(conditions: Iterable[Mapping[str, Any]] | None, type: str) -> bool:
    condition = get_condition(conditions, type)
    return condition is not None and condition.get("status") == "True"


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _order(condition: Mapping[str, Any]) -> tuple[int, str]:
    kind = str(condition.get("type", ""))
    rank = CONDITION_ORDER.index(kind) if kind in CONDITION_ORDER else len(CONDITION_ORDER)
    return rank, kind
