"""Timestamps the way the Kubernetes API writes them (RFC 3339, UTC, whole seconds)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def format_time(t: datetime) -> str:
    """`2024-03-31T00:30:00Z`: what metav1.Time serialises to, so a re-read compares equal."""
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{t.isoformat()} is a naive datetime; pass an aware one")
    return t.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """An aware UTC datetime from an API timestamp; None for anything unreadable.

    Timestamps come from objects other programs wrote (annotations, status), so a bad
    one degrades to "unknown" instead of failing the whole pass.
    """
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo is not None else None
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return parsed.astimezone(UTC)


def epoch_minute(t: datetime) -> int:
    """Minutes since the Unix epoch: the number the CronJob controller puts in Job names."""
    return int(t.timestamp()) // 60
