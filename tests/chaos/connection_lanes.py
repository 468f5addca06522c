"""Connection lanes (`conn-N`): contenders are threads with their own connections calling
the same SQL functions through guardedcron.guard.lease, where process start-up would
otherwise eat the 2-core budget; their holders stall past the lease in-process.

A pooled lane (`pool-N`) is the same lane with every connection going through a real
PgBouncer in transaction mode (guardedcron_devenv.pgbouncer), with the guard's own
connection settings: consecutive statements of one contender land on whichever server
session the pooler hands out, and the restarts and cuts of the injectors hit those
sessions under the pooler. Its stalls are counted as `pooled_stall`, its rounds as
`pooled`, with the quotas of one connection lane; its final clean run is a workload
process whose `guardedcron acquire` and `release` go through the pooler too.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from tests.chaos.contenders import Attempt, Link
from tests.chaos.run_state import OUTSTANDING_CAP, ROUND_INTERVAL, RunState
from tests.chaos.schema import enqueue
from tests.chaos.seats import acquire_on, work_and_release

Connection = psycopg.Connection[tuple[Any, ...]]
SEATS = 6


class ConnectionLane:
    def __init__(self, state: RunState, lane: int, *, pooler_dsn: str | None = None) -> None:
        """`pooler_dsn`: the run's database through the pooler, for a pooled lane."""
        self.state = state
        self.lane = lane
        self.pooler_dsn = pooler_dsn
        pooled = pooler_dsn is not None
        self.kind = "pooled" if pooled else "connection"
        self.lock = f"pool-{lane}" if pooled else f"conn-{lane}"
        self.stall_kind = "pooled_stall" if pooled else "stall"
        self.holder_prefix = f"q{lane}" if pooled else f"c{lane}"

    def seat(self, number: int) -> Link:
        if self.pooler_dsn is None:
            return Link(self.state.dsn, f"seat-{self.lane}.{number}")
        return Link(self.pooler_dsn, f"pool-seat-{self.lane}.{number}", pooled=True)

    def run(self) -> None:
        state, plan, lane, lock = self.state, self.state.plan, self.lane, self.lock
        rng = random.Random(f"{plan.seed}:{self.kind}:{lane}")
        state.locks.add(lock)
        if self.pooler_dsn is not None:
            state.pooled_locks[lock] = self.pooler_dsn
        seats: queue.Queue[Link] = queue.Queue()
        for number in range(SEATS):
            seats.put(self.seat(number))
        # A pooled lane has the quotas of one connection lane.
        quota = plan.share(plan.faults_per_kind, plan.connection_lanes)
        rounds_quota = plan.share(plan.connection_rounds, plan.connection_lanes)
        stalls = 0
        round_no = 0
        next_round = 0.0
        with ThreadPoolExecutor(SEATS, thread_name_prefix=f"{self.kind}{lane}") as pool:
            while not state.abort.is_set():
                if round_no >= rounds_quota and stalls >= quota:
                    if state.injectors_done.is_set():
                        break
                    time.sleep(0.3)  # enough rounds: keep some going for the injectors to hit, cheaply
                # Like a schedule firing: rounds come at a pace, whether or not the last one is done
                # (a round in which a stalled holder still has the lease is quick: everyone loses).
                time.sleep(max(0.0, next_round - time.monotonic()))
                next_round = time.monotonic() + ROUND_INTERVAL
                round_no += 1
                state.admin.run(
                    lambda c: enqueue(c, lock, rng.randint(2, 6), outstanding_cap=OUTSTANDING_CAP)
                )
                state.wait_at_gate()  # stand still while a burst's losers answer
                size = rng.randint(2, 4)
                taken = [seats.get() for _ in range(size)]
                stall_at = rng.randint(1, 4) if stalls < quota and rng.random() < 0.5 else None
                barrier = threading.Barrier(size)
                out = [threading.Event() for _ in taken]
                stalled = threading.Event()
                for i, seat in enumerate(taken):
                    attempt = Attempt(f"{self.holder_prefix}.{round_no}.{i}", "connection", lock, round_no)
                    pool.submit(
                        self.contender,
                        seat,
                        attempt,
                        barrier,
                        out[i],
                        stall_at,
                        stalled,
                        rng.random(),
                        seats.put,
                    )
                for event in out:
                    event.wait()
                stalls += stalled.is_set()
                state.count_round(self.kind)
        state.lane_seconds[f"{self.kind}-{lane}"] = round(time.monotonic() - state.started, 1)
        while not seats.empty():
            seats.get().close()

    def contender(
        self,
        seat: Link,
        attempt: Attempt,
        barrier: threading.Barrier,
        out: threading.Event,
        stall_at: int | None,
        stalled: threading.Event,
        seed: float,
        give_back: Callable[[Link], None],
    ) -> None:
        state = self.state
        lease = state.plan.connection_lease_seconds
        rng = random.Random(seed)

        def stall(batch: int) -> None:
            if batch == stall_at and self.stall_kind not in attempt.faults:
                attempt.faults.append(self.stall_kind)
                state.count(self.stall_kind)
                stalled.set()
                out.set()  # the round goes on without this holder
                time.sleep(lease + rng.uniform(0.3, 1.0))

        try:
            try:
                conn: Connection | None = seat.get()
            except psycopg.Error:
                conn = None  # the server is restarting: this contender gets no answer
            barrier.wait(timeout=60)
            if conn is None:
                attempt.reason = "no connection"
                return
            result = acquire_on(conn, attempt, lease)
            if result is not None and result.acquired:
                work_and_release(seat, attempt, result.fence, lease, rng, stall)
        except Exception as exc:
            state.problem(f"{self.kind} contender {attempt.holder} failed: {exc!r}")
        finally:
            state.record(attempt)
            out.set()
            give_back(seat)
