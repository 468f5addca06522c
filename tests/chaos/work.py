"""What a guarded job does once it holds the lease: charge, send, delete, each write fenced.

Both contender paths run this: the process path (tests/chaos/workload.py, after the real
`guardedcron acquire` won) and the connection path (threads of the harness).

The job works through outstanding rows, not through elapsed time: each step selects
the queue rows still in its input state, in small batches, and moves them on in the
same transaction that records the effect. A run killed at any point leaves the queue
as its durable checkpoint, and the next holder resumes from there.

Every batch is one transaction that starts with `guardedcron.check_fence`, so a holder
whose lease was taken over cannot commit: its write is refused, it records the refusal
and stops. Lost connections (server restart, a cut backend, the server's
idle-in-transaction timeout) are retried on a new connection, fence check included.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import psycopg

from guardedcron.guard import lease as lease_ops
from guardedcron.guard.connection import connection_options
from guardedcron.guard.errors import StaleFenceError
from guardedcron.guard.fence import check_fence

Connection = psycopg.Connection[tuple[Any, ...]]
T = TypeVar("T")

# A holder stopped inside a fenced transaction would keep the lease row locked and so
# block every takeover until it resumed; the server ends such a session instead.
IDLE_IN_TRANSACTION_MS = 1000
POOLED_CONNECT_TIMEOUT = 2
# SQLSTATEs that mean "try again on a fresh connection" rather than "the job is wrong".
RETRY_STATES = {"55P03", "40001", "40P01", "57P01", "57P02", "57P03", "25P03", "08000", "08003", "08006"}


@dataclass(frozen=True)
class Holding:
    """The lease a job works under, as the guard handed it out."""

    lock: str
    holder: str
    fence: int
    lease_seconds: float


@dataclass(frozen=True)
class Step:
    kind: str
    takes: str  # queue state this step works on
    gives: str | None  # state it leaves; None: the row is deleted


STEPS = (Step("charge", "pending", "charged"), Step("send", "charged", "sent"), Step("delete", "sent", None))


class Refused(Exception):
    """A fenced write was refused: this run's lease was taken over. Stop."""


def connect(dsn: str, holder: str, *, pooled: bool = False) -> Connection:
    """A job's connection. Through a transaction pooler (`pooled`) it takes the guard's own
    settings (no `options` startup parameter, no server-side prepared statements) and the
    idle-in-transaction limit comes with each transaction instead (`Job._batch`)."""
    name = f"chaos:{holder}"[:63]
    if pooled:
        return psycopg.connect(dsn, application_name=name, **connection_options(POOLED_CONNECT_TIMEOUT))
    return psycopg.connect(
        dsn,
        autocommit=True,
        connect_timeout=2,
        application_name=name,
        options=f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}",
    )


def is_transient(exc: BaseException, conn: Connection | None) -> bool:
    if not isinstance(exc, psycopg.Error):
        return isinstance(exc, OSError)
    if conn is not None and (conn.broken or conn.closed):
        return True
    return isinstance(exc, psycopg.OperationalError) or exc.sqlstate in RETRY_STATES


class Job:
    """One run of the job under one lease. `run()` returns the number of batches committed."""

    def __init__(
        self,
        dsn: str,
        holding: Holding,
        *,
        rng: random.Random,
        batch_size: int = 2,
        think_seconds: tuple[float, float] = (0.005, 0.02),
        before_batch: Callable[[int], None] | None = None,
        after_read: Callable[[int], None] | None = None,
        fenced: bool = True,
        give_up_after: float = 30.0,
        conn: Connection | None = None,
        pooled: bool = False,
    ) -> None:
        self.dsn = dsn
        self.holding = holding
        self.rng = rng
        self.batch_size = batch_size
        self.think_seconds = think_seconds
        self.before_batch = before_batch
        self.after_read = after_read
        # Only the suite's own control test turns the fence off, to prove the checks see it.
        self.fenced = fenced
        self.give_up_after = give_up_after
        self._conn = conn  # an open connection to start on, if the caller has one
        self.pooled = pooled  # behind a transaction pooler: no session state (see `connect`)
        self.batches = 0
        self.step = STEPS[0].kind
        self.reconnects = 0

    # --- connection handling ------------------------------------------------------------
    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = connect(self.dsn, self.holding.holder, pooled=self.pooled)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def detach(self) -> Connection | None:
        """Hand the connection back to the caller instead of closing it."""
        conn, self._conn = self._conn, None
        return conn

    def _retrying(self, action: Callable[[Connection], T]) -> T:
        deadline = time.monotonic() + self.give_up_after
        while True:
            conn: Connection | None = None
            try:
                conn = self._connection()
                return action(conn)
            except StaleFenceError:
                raise
            except Exception as exc:
                if not is_transient(exc, conn) or time.monotonic() > deadline:
                    raise
                self.close()
                self.reconnects += 1
                time.sleep(self.rng.uniform(0.05, 0.2))

    # --- the job -----------------------------------------------------------------------
    def run(self) -> int:
        try:
            for step in STEPS:
                self.step = step.kind
                while True:
                    self._prepare(self.batches)
                    if self._retrying(partial(self._batch, step)) == 0:
                        break
                    self.batches += 1
        except StaleFenceError as exc:
            self._record_refusal(str(exc))
            raise Refused(str(exc)) from exc
        return self.batches

    def _prepare(self, batch: int) -> None:
        """Outside any transaction: the work between writes, and a renewal like a keeper's."""
        if self.before_batch is not None:
            self.before_batch(batch)
        time.sleep(self.rng.uniform(*self.think_seconds))
        h = self.holding
        # Best effort, as a sidecar's would be: whether the write may land is the fence's call.
        self._retrying(lambda conn: lease_ops.renew(conn, h.lock, h.holder, h.fence, h.lease_seconds))

    def _batch(self, step: Step, conn: Connection) -> int:
        h = self.holding
        with conn.transaction():
            # Behind a pooler a session-level SET would stay on the server session, for whoever
            # gets it next; SET LOCAL ends with this transaction.
            if self.pooled:
                conn.execute(f"SET LOCAL idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}")
            if self.fenced:
                check_fence(conn, h.lock, h.fence)
            items = [
                int(r[0])
                for r in conn.execute(
                    "SELECT item FROM chaos.queue WHERE lock_name = %s AND state = %s ORDER BY item LIMIT %s",
                    (h.lock, step.takes, self.batch_size),
                )
            ]
            if not items:
                return 0
            if self.after_read is not None:
                self.after_read(self.batches)
            changed = self._apply(conn, step, items)
            # The sequence number is drawn last, just before the commit, so that its order is
            # the order of commits: a takeover waits for this commit (the fence check's lock).
            seq_row = conn.execute(
                "INSERT INTO chaos.fenced_writes (write_seq, lock_name, fence, holder, kind, items)"
                " VALUES (nextval('chaos.write_seq'), %s, %s, %s, %s, %s) RETURNING write_seq",
                (h.lock, h.fence, h.holder, step.kind, len(items)),
            ).fetchone()
            assert seq_row is not None
            conn.execute(
                "INSERT INTO chaos.effects (item, kind, lock_name, fence, holder, write_seq, absorbed)"
                " SELECT i, %s, %s, %s, %s, %s, NOT (i = ANY(%s)) FROM unnest(%s::bigint[]) i",
                (step.kind, h.lock, h.fence, h.holder, seq_row[0], changed, items),
            )
        return len(items)

    def _apply(self, conn: Connection, step: Step, items: list[int]) -> list[int]:
        """Do the step's write for `items`; return those it changed (the rest were absorbed)."""
        h = self.holding
        if step.kind == "charge":
            conn.execute(
                "INSERT INTO chaos.invoices (item, amount_cents, fence, holder)"
                " SELECT i, 100 + i %% 900, %s, %s FROM unnest(%s::bigint[]) i"
                " ON CONFLICT (item) DO NOTHING",
                (h.fence, h.holder, items),
            )
        elif step.kind == "send":
            conn.execute(
                "INSERT INTO chaos.outbox (dedupe_key, item, fence, holder)"
                " SELECT 'receipt:' || i, i, %s, %s FROM unnest(%s::bigint[]) i"
                " ON CONFLICT (dedupe_key) DO NOTHING",
                (h.fence, h.holder, items),
            )
        if step.gives is None:
            rows = conn.execute(
                "DELETE FROM chaos.queue WHERE item = ANY(%s) AND state = %s RETURNING item",
                (items, step.takes),
            ).fetchall()
        else:
            rows = conn.execute(
                "UPDATE chaos.queue SET state = %s WHERE item = ANY(%s) AND state = %s RETURNING item",
                (step.gives, items, step.takes),
            ).fetchall()
        return [int(r[0]) for r in rows]

    def _record_refusal(self, message: str) -> None:
        h = self.holding
        kind = self.step
        self._retrying(
            lambda conn: conn.execute(
                "INSERT INTO chaos.refusals (lock_name, fence, holder, kind, message)"
                " VALUES (%s, %s, %s, %s, %s)",
                (h.lock, h.fence, h.holder, kind, message),
            )
        )
