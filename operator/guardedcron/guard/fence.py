"""Helpers for the workload: read the fencing token and check it inside a write.

    from guardedcron.guard.fence import fenced_transaction, read_lease

    lease = read_lease()                    # from /var/run/guardedcron/lease.json
    with fenced_transaction(conn, lease.lock, lease.fence):   # StaleFenceError if taken over
        conn.execute("INSERT INTO invoices ...")              # commits at the end of the block

The SQL function `guardedcron.check_fence(lock, fence)` keeps the lease row
share-locked until the transaction ends, so a takeover cannot commit between the
check and the write. `fenced_transaction` opens that transaction, checks the fence in
it and commits it with the writes. `check_fence` alone must be called in the same
transaction as the write it guards; on an autocommit connection outside a transaction
block it refuses (BadInput), as the check's lock would end with the check.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
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
from guardedcron.guard.errors import BadInput, StaleFenceError, not_granted

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

    Runs inside the caller's transaction, whose writes it protects until the commit: a
    connection that is not in autocommit mode, or one in a `conn.transaction()` block.
    An autocommit connection outside a transaction is refused (BadInput): there the
    check would be a transaction of its own, and a takeover could commit before the write.
    """
    import psycopg
    from psycopg.pq import TransactionStatus

    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise BadInput(
            "check_fence needs the transaction of the write it guards: this connection is in "
            "autocommit mode outside a transaction, where the check's lock on the lease would end "
            "with the check; use `with fenced_transaction(conn, lock, fence):` (or conn.transaction())"
        )
    try:
        conn.execute("SELECT guardedcron.check_fence(%s, %s)", (lock, fence))
    except psycopg.Error as exc:
        if exc.sqlstate == STALE_FENCE_SQLSTATE:
            raise StaleFenceError(str(exc.diag.message_primary or exc)) from exc
        refusal = not_granted(exc, lock, conn.info.user)
        if refusal is not None:
            raise refusal from None
        raise


@contextmanager
def fenced_transaction(
    conn: psycopg.Connection[tuple[Any, ...]], lock: str, fence: int
) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
    """A transaction on `conn` that begins with the fence check: the block's writes commit
    at its end, before any takeover can, or not at all (StaleFenceError at the start, or
    the block's own exception, rolls them back). Any connection will do, autocommit or not.
    """
    with conn.transaction():
        check_fence(conn, lock, fence)
        yield conn
