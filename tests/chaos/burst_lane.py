"""The burst lane (`burst`): many contenders (processes and connections) for one slot at
once; one must work and every process loser must exit within the seeds' 5 s. While a
burst's losers answer it holds the run's gate: no restart, no new round elsewhere.
"""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from tests.chaos.contenders import Attempt, Contender, Link
from tests.chaos.run_state import BurstResult, RunState
from tests.chaos.schema import enqueue
from tests.chaos.seats import acquire_on, work_and_release

LOCK = "burst"


class BurstLane:
    def __init__(self, state: RunState) -> None:
        self.state = state

    def run(self) -> None:
        state, plan = self.state, self.state.plan
        rng = random.Random(f"{plan.seed}:burst")
        state.locks.add(LOCK)
        seats = [Link(state.dsn, f"burst-seat.{i}") for i in range(plan.burst_connections)]
        with ThreadPoolExecutor(plan.burst_connections, thread_name_prefix="burst") as pool:
            for burst in range(1, plan.bursts + 1):
                if state.abort.is_set():
                    break
                self.wait_until_free(LOCK)
                state.admin.run(lambda c: enqueue(c, LOCK, rng.randint(2, 6)))
                state.bursts.append(self.one_burst(pool, seats, LOCK, burst, rng))
                state.count("burst")
                state.count_round("burst")
        for seat in seats:
            seat.close()

    def one_burst(
        self, pool: ThreadPoolExecutor, seats: list[Link], lock: str, slot: int, rng: random.Random
    ) -> BurstResult:
        state, plan = self.state, self.state.plan
        answers = [Attempt(f"b.{slot}.c{i}", "connection", lock, slot) for i in range(plan.burst_connections)]
        answered = [threading.Event() for _ in answers]
        with state.gate:  # no restart, and no new process elsewhere, until every loser has answered
            self.wait_for_in_flight_answers()
            for seat in seats:
                seat.probe()
            started = time.monotonic()
            procs = [
                state.spawn(lock, f"b.{slot}.p{i}", slot, plan.process_lease_seconds, state.skew(rng))
                for i in range(plan.burst_processes)
            ]
            for seat, attempt, event in zip(seats, answers, answered, strict=True):
                pool.submit(self.burst_connection, seat, attempt, event, rng.random())
            losers: list[Contender] = []
            winner: Contender | None = None
            deadline = started + 60
            while len(losers) + (winner is not None) < len(procs) and time.monotonic() < deadline:
                for c in procs:
                    if c is winner or c in losers:
                        continue
                    if c.holds():
                        winner = c
                    elif c.reap():
                        losers.append(c)
                time.sleep(0.005)
            for event in answered:
                event.wait(60)
        for c in losers:
            state.record(c.finish())
        if winner is not None:
            with state.book:
                state.stragglers.append(winner)
        return BurstResult(
            winners=(winner is not None) + sum(a.acquired for a in answers),
            process_loser_seconds=[(c.ended or 0.0) - started for c in losers],
            connection_loser_seconds=[
                a.answer_seconds or 0.0 for a in answers if a.answered and not a.acquired
            ],
            loser_codes=[c.proc.returncode for c in losers]
            + [75 if a.answered else 69 for a in answers if not a.acquired],
            load_average=os.getloadavg()[0],
        )

    def wait_for_in_flight_answers(self, limit: float = 30.0) -> None:
        """Let the process rounds already started get their answers, so a burst has the CPU to itself."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if all(c.answered() for round_ in list(self.state.in_flight.values()) for c in round_):
                return
            time.sleep(0.01)

    def burst_connection(self, seat: Link, attempt: Attempt, answered: threading.Event, seed: float) -> None:
        state = self.state
        try:
            result = acquire_on(seat.get(), attempt, state.plan.process_lease_seconds)
            answered.set()
            if result is not None and result.acquired:
                work_and_release(
                    seat, attempt, result.fence, state.plan.process_lease_seconds, random.Random(seed)
                )
        except Exception as exc:
            state.problem(f"burst contender {attempt.holder} failed: {exc!r}")
        finally:
            answered.set()
            state.record(attempt)

    def wait_until_free(self, lock: str, limit: float = 60.0) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            row = self.state.admin.run(
                lambda c: c.execute(
                    "SELECT coalesce(bool_and(locked_until <= clock_timestamp()), true)"
                    " FROM guardedcron.leases WHERE lock_name = %s",
                    (lock,),
                ).fetchone()
            )
            if row is not None and row[0]:
                return
            time.sleep(0.05)
        self.state.problem(f"lease {lock} still held after {limit:g} s")
