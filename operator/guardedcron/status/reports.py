"""What the guard and the keeper said, read from their termination messages (pure).

Both write compact JSON to /dev/termination-log (guardedcron.guard.outputs); the
kubelet copies it into the pod status. The text is read, never trusted: the guard's
container runs with `terminationMessagePolicy: FallbackToLogsOnError`, so a guard
that crashed before writing leaves its last log lines there instead, and anything in
a pod status may have been written by someone else. Every field is checked for type
and size, and what cannot be read is named in `problem` rather than raised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from guardedcron.contract import (
    CONTROL_CHARACTERS,
    KEY_FENCE,
    KEY_HOLDER,
    KEY_OUTCOME,
    KEY_REASON,
    KEY_REQUESTER,
    KEY_SLOT,
)

# Holder names are "[cluster/]namespace/pod": far below this. Longer text is not ours.
TEXT_MAX: Final = 300


@dataclass(frozen=True)
class GuardReport:
    """The guard's termination message. For a skip, `holder`/`fence` are the winner's."""

    outcome: str | None = None  # a contract.GuardOutcome, if the guard wrote it
    holder: str | None = None
    fence: int | None = None
    slot: int | None = None
    requester: str | None = None  # on a skip: the holder name this pod asked with
    reason: str | None = None  # a contract.AcquireReason, or the guard's error text
    problem: str | None = None  # why the message could not be used, if it could not


@dataclass(frozen=True)
class KeeperReport:
    """The keeper's termination message; its outcome a contract.KeeperOutcome."""

    outcome: str | None = None
    holder: str | None = None
    fence: int | None = None
    reason: str | None = None
    problem: str | None = None


def read_guard_message(text: object) -> GuardReport:
    data, problem = _json_object(text)
    if data is None:
        return GuardReport(problem=problem)
    return GuardReport(
        outcome=clean_text(data.get(KEY_OUTCOME)),
        holder=clean_text(data.get(KEY_HOLDER)),
        fence=_non_negative_int(data.get(KEY_FENCE)),
        slot=_non_negative_int(data.get(KEY_SLOT)),
        requester=clean_text(data.get(KEY_REQUESTER)),
        reason=clean_text(data.get(KEY_REASON)),
    )


def read_keeper_message(text: object) -> KeeperReport:
    data, problem = _json_object(text)
    if data is None:
        return KeeperReport(problem=problem)
    return KeeperReport(
        outcome=clean_text(data.get(KEY_OUTCOME)),
        holder=clean_text(data.get(KEY_HOLDER)),
        fence=_non_negative_int(data.get(KEY_FENCE)),
        reason=clean_text(data.get(KEY_REASON)),
    )


def clean_text(value: object, limit: int = TEXT_MAX) -> str | None:
    """A string fit for a status field: no control characters, bounded; else None."""
    if not isinstance(value, str):
        return None
    text = CONTROL_CHARACTERS.sub(" ", value).strip()
    if not text:
        return None
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json_object(text: object) -> tuple[dict[str, Any] | None, str]:
    if not isinstance(text, str) or not text.strip():
        return None, "no termination message"
    try:
        data = json.loads(text)
    except ValueError:
        return None, "termination message is not JSON (the container's log tail?)"
    if not isinstance(data, dict):
        return None, "termination message is JSON but not an object"
    return data, ""


def _non_negative_int(value: object) -> int | None:
    # bool is an int in Python; a fence of `true` is not a fence.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
