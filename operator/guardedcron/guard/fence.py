"""Helpers for the workload: read the fencing token and check it inside a write.

    from guardedcron.guard.fence import read_lease, check_fence

    lease = read_lease()                    # from /var/run/guardedcron/lease.json
    with conn.transaction():
        check_fence(conn, lease.lock, lease.fence)   # raises StaleFenceError if taken over
        conn.execute("INSERT INTO invoices ...")

The SQL function `guardedcron.check_fence(lock, fence)` keeps the lease row
share-locked until the transaction ends, so a takeover cannot commit between the
check and the write. Call it in the same transaction as the write it guards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guardedcron.contract import (
    FENCE_FILE,
    KEY_FENCE,
    KEY_HOLDER,
    KEY_LOCK,
    KEY_LOCKED_UNTIL,
    KEY_SLOT,
    LEASE_FILE,
    RUN_DIR,
)
from guardedcron.guard.errors import StaleFenceError, not_granted

if TYPE_CHECKING:
    import psycopg

STALE_FENCE_SQLSTATE = "GC001"


@dataclass(frozen=True)
class HeldLease:
    lock: str
    holder: str
    fence: int
    slot: int | None
    locked_until: str


def read_fence(run_dir: str | Path = RUN_DIR) -> int:
    return int((Path(run_dir) / FENCE_FILE).read_text().strip())


def read_lease(run_dir: str | Path = RUN_DIR) -> HeldLease:
    data = json.loads((Path(run_dir) / LEASE_FILE).read_text())
    return HeldLease(
        lock=data[KEY_LOCK],
        holder=data[KEY_HOLDER],
        fence=int(data[KEY_FENCE]),
        slot=data.get(KEY_SLOT),
        locked_until=data[KEY_LOCKED_UNTIL],
    )


def check_fence(conn: psycopg.Connection[tuple[Any, ...]], lock: str, fence: int) -> None:
    """Raise StaleFenceError unless `fence` is the lock's current fence, and
    LockNotGranted (exit code 77) when the connection's role may not use `lock`.

    Must run inside the caller's transaction (not autocommit) to protect its writes.
    """
    import psycopg

    try:
        conn.execute("SELECT guardedcron.check_fence(%s, %s)", (lock, fence))
    except psycopg.Error as exc:
        if exc.sqlstate == STALE_FENCE_SQLSTATE:
            raise StaleFenceError(str(exc.diag.message_primary or exc)) from exc
        refusal = not_granted(exc, lock, conn.info.user)
        if refusal is not None:
            raise refusal from None
        raise
