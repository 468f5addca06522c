"""Reading any timestamp a guardedcron table can hold, never failing on one.

PostgreSQL's timestamptz holds 'infinity', '-infinity' and years up to 294276 (and BC);
Python's datetime stops at the years 1 and 9999, and psycopg refuses the rest with a
DataError. The tables are writable by their owner and any superuser, so a hand-edited
`locked_until = 'infinity'` must not crash `guardedcron runs`, the guard or the keeper:
their queries read through `reading(conn)`, whose cursor clamps a timestamp Python cannot
hold to the nearest one it can (datetime.max or datetime.min, in UTC). Clamped values
compare as the originals do with every ordinary time, which is what the readers ask.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from psycopg import DataError
from psycopg.types.datetime import TimestamptzBinaryLoader, TimestamptzLoader

if TYPE_CHECKING:
    import psycopg
    from psycopg.abc import Buffer

LATEST = datetime.max.replace(tzinfo=UTC)
EARLIEST = datetime.min.replace(tzinfo=UTC)


class ClampingTimestamptzLoader(TimestamptzLoader):
    """Text format: '-infinity' and BC dates are before year 1, the rest beyond 9999."""

    def load(self, data: Buffer) -> datetime:
        try:
            return super().load(data)
        except DataError:
            text = bytes(data)
            return EARLIEST if text.startswith(b"-") or text.endswith(b" BC") else LATEST


class ClampingTimestamptzBinaryLoader(TimestamptzBinaryLoader):
    """Binary format: microseconds since 2000-01-01 as an int64; its sign says which end."""

    def load(self, data: Buffer) -> datetime:
        try:
            return super().load(data)
        except DataError:
            (micros,) = struct.unpack("!q", bytes(data))
            return EARLIEST if micros < 0 else LATEST


def reading(conn: psycopg.Connection[tuple[Any, ...]]) -> psycopg.Cursor[tuple[Any, ...]]:
    """A cursor on `conn` whose timestamps never fail to load (the connection is untouched)."""
    cursor = conn.cursor()
    cursor.adapters.register_loader("timestamptz", ClampingTimestamptzLoader)
    cursor.adapters.register_loader("timestamptz", ClampingTimestamptzBinaryLoader)
    return cursor
