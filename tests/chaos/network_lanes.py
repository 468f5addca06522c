"""Network lanes (`net-L.N`): connection contenders, each talking to PostgreSQL through a
Toxiproxy of its own; a holder (between batches or inside a fenced transaction) or a
contender mid-acquire is cut off, slowed, reset or throttled for a window, then healed
(the faults: tests/chaos/network.py).
"""

from __future__ import annotations

import queue
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import psycopg

from guardedcron_devenv.toxiproxy import Proxy, Toxiproxy
from tests.chaos.contenders import Attempt, Link
from tests.chaos.network import NetworkFault, Strike, bounded_dsn, draw_fault
from tests.chaos.plan import NETWORK_FAULT_KINDS
from tests.chaos.run_state import OUTSTANDING_CAP, ROUND_INTERVAL, RunState
from tests.chaos.schema import enqueue
from tests.chaos.seats import acquire_on, work_and_release

Connection = psycopg.Connection[tuple[Any, ...]]
NETWORK_SEATS = 6
# Locks a network lane's rounds choose from: a struck holder keeps its lock's lease for up
# to its window, and a round on a free lock has a winner to strike.
NETWORK_LOCKS = 4  # per network lane: a partitioned holder keeps its seat until healed
# Where a network fault strikes a holder: between batches (its renewal goes first), or
# inside a fenced transaction (after its read). Contenders are also struck mid-acquire.
NETWORK_HOLD_PHASES = ("between_batches", "in_transaction")


class NetworkLane:
    def __init__(self, state: RunState, toxiproxy: Toxiproxy, lane: int) -> None:
        self.state = state
        self.toxiproxy = toxiproxy
        self.lane = lane

    def seat(self, seat: int) -> tuple[Link, Proxy]:
        state = self.state
        name = f"chaos-{uuid.uuid4().hex[:8]}-{self.lane}.{seat}"
        proxy = self.toxiproxy.proxy(name, f"127.0.0.1:{state.server.port}")
        with state.book:
            state.proxies.append(proxy)
        return Link(bounded_dsn(proxy, state.dsn), f"net-seat-{self.lane}.{seat}"), proxy

    def run(self) -> None:
        state, plan, lane = self.state, self.state.plan, self.lane
        rng = random.Random(f"{plan.seed}:network:{lane}")
        locks = [f"net-{lane}.{n}" for n in range(NETWORK_LOCKS)]
        state.locks.update(locks)
        seats: queue.Queue[tuple[Link, Proxy]] = queue.Queue()
        for number in range(NETWORK_SEATS):
            seats.put(self.seat(number))
        quota = plan.share(plan.faults_per_kind, plan.network_lanes)
        struck: list[str] = []  # kinds applied so far; appended by contender threads
        round_no = 0
        next_round = 0.0
        with ThreadPoolExecutor(NETWORK_SEATS, thread_name_prefix=f"net{lane}") as pool:
            while not state.abort.is_set():
                hits = Counter(struck)
                wanted = [kind for kind in NETWORK_FAULT_KINDS if hits[kind] < quota]
                if not wanted:
                    break
                time.sleep(max(0.0, next_round - time.monotonic()))
                next_round = time.monotonic() + ROUND_INTERVAL
                round_no += 1
                lock = rng.choice(locks)
                # Fewer items than the other lanes: a round here is about the fault, not the work.
                items = rng.randint(1, 4)
                state.admin.run(partial(enqueue, lock=lock, count=items, outstanding_cap=OUTSTANDING_CAP))
                state.wait_at_gate()  # stand still while a burst's losers answer
                size = rng.randint(2, 3)
                taken = [seats.get() for _ in range(size)]
                # Up to two faults a round: in half the rounds one contender is struck just
                # before its acquire, and whoever else wins is struck while holding (between
                # batches or mid-transaction). Holders are the rarer target (a round needs a
                # winner), so acquires are not struck every round.
                on_acquire = draw_fault(rng.choice(wanted), rng, plan.connection_lease_seconds)
                on_hold = draw_fault(rng.choice(wanted), rng, plan.connection_lease_seconds)
                hold_phase = rng.choice(NETWORK_HOLD_PHASES)
                victim = rng.randrange(size) if rng.random() < 0.5 else None
                strike_at = rng.randint(0, 1)  # a struck holder that resumes may leave no more
                barrier = threading.Barrier(size)
                out = [threading.Event() for _ in taken]
                for i, (link, proxy) in enumerate(taken):
                    attempt = Attempt(f"n{lane}.{round_no}.{i}", "connection", lock, round_no)
                    pool.submit(
                        self.contender,
                        link,
                        attempt,
                        barrier,
                        out[i],
                        Strike(proxy, on_acquire if i == victim else on_hold),
                        "acquire" if i == victim else hold_phase,
                        strike_at,
                        struck,
                        rng.random(),
                        partial(seats.put, (link, proxy)),
                    )
                for event in out:  # set once each contender has its answer (a winner works on)
                    event.wait()
                state.count_round("network")
        state.lane_seconds[f"network-{lane}"] = round(time.monotonic() - state.started, 1)

    def contender(
        self,
        seat: Link,
        attempt: Attempt,
        barrier: threading.Barrier,
        out: threading.Event,
        strike: Strike,
        phase: str,
        strike_at: int,
        struck: list[str],
        seed: float,
        give_back: Callable[[], None],
    ) -> None:
        state = self.state
        lease = state.plan.connection_lease_seconds
        rng = random.Random(seed)

        def hit() -> None:
            """Apply the fault from this thread, right before it talks through the proxy."""
            fault: NetworkFault = strike.fault
            strike.apply()
            attempt.faults.append(f"{fault.kind}@{phase}")
            state.count(fault.kind)
            struck.append(fault.kind)
            out.set()  # the round goes on without this contender, as with a stalled holder

        def at(wanted_phase: str) -> Callable[[int], None]:
            def maybe_hit(batch: int) -> None:
                if phase == wanted_phase and batch == strike_at and not strike.applied:
                    hit()

            return maybe_hit

        try:
            try:
                conn: Connection | None = seat.probe()  # a restart leaves dead connections behind
            except psycopg.Error:
                conn = None  # the server is restarting: this contender gets no answer
            barrier.wait(timeout=60)
            if conn is None:
                attempt.reason = "no connection"
                return
            if phase == "acquire":
                hit()
            result = acquire_on(conn, attempt, lease)
            # The next round need not wait for this one's work: seats (6 a lane) bound how
            # many contenders are in flight, and a winner keeps its seat while it works.
            out.set()
            if result is not None and result.acquired:
                work_and_release(
                    seat,
                    attempt,
                    result.fence,
                    lease,
                    rng,
                    before_batch=at("between_batches"),
                    after_read=at("in_transaction"),
                )
        except Exception as exc:
            state.problem(f"network contender {attempt.holder} failed: {exc!r}")
        finally:
            strike.wait_healed()  # a seat goes back to the pool clean
            if strike.heal_error is not None:
                state.problem(f"healing {strike.fault.describe()} failed: {strike.heal_error!r}")
                state.abort.set()
            state.record(attempt)
            out.set()
            give_back()
