"""What a thread contender does in its seat: ask for the lease on the seat's connection,
and, when it won, do the job and release. Shared by the connection, network and burst
lanes (a seat is a `Link`: a connection reopened its own way after a restart or a cut).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg

from guardedcron.guard import lease as lease_ops
from guardedcron.guard.lease import AcquireRequest
from tests.chaos.contenders import Attempt, Link, name_connection
from tests.chaos.run_state import RETAIN_RUNS
from tests.chaos.work import Holding, Job, Refused, is_transient

Connection = psycopg.Connection[tuple[Any, ...]]


def acquire_on(conn: Connection, attempt: Attempt, lease: float) -> lease_ops.AcquireResult | None:
    request = AcquireRequest(attempt.lock, attempt.holder, lease, slot=attempt.slot, retain_runs=RETAIN_RUNS)
    started = time.monotonic()
    try:
        result = lease_ops.acquire(conn, request)
    except psycopg.Error as exc:
        if not is_transient(exc, conn):
            raise
        attempt.reason = f"no answer: {type(exc).__name__}"
        return None
    attempt.answer_seconds = time.monotonic() - started
    attempt.answered = True
    attempt.acquired = result.acquired
    attempt.reason = result.reason
    attempt.run_id = result.run_id
    attempt.fence = result.fence
    return result


def work_and_release(
    seat: Link,
    attempt: Attempt,
    fence: int,
    lease: float,
    rng: random.Random,
    before_batch: Callable[[int], None] | None = None,
    after_read: Callable[[int], None] | None = None,
) -> None:
    """Do the job on the seat's connection, named after the holder so the cutter can find it.

    Reconnections go the seat's way (through its proxy, for a network seat)."""
    holding = Holding(attempt.lock, attempt.holder, fence, lease)
    seat.run(partial(name_connection, f"chaos:{attempt.holder}"))
    job = Job(
        seat.dsn,
        holding,
        rng=rng,
        before_batch=before_batch,
        after_read=after_read,
        conn=seat.get(),
        pooled=seat.pooled,
    )
    try:
        job.run()
        attempt.exit_code = 0
    except Refused:
        attempt.exit_code = 76
        return
    finally:
        seat.adopt(job.detach())
        seat.run(partial(name_connection, f"chaos:{seat.name}"))
    seat.run(
        lambda c: lease_ops.release(c, attempt.lock, attempt.holder, fence, "succeeded"), give_up_after=20
    )
