"""Process lanes (`proc-N`): every contender is a real process (tests/chaos/workload.py)
running the real `guardedcron acquire` command; the faults that need a process strike
here: `kill -9` of the holder mid-run, `SIGSTOP` past its lease then `SIGCONT`, and
clock skew (libfaketime preloaded into the contender and the guard it runs).
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter

from tests.chaos.contenders import Contender
from tests.chaos.run_state import RunState
from tests.chaos.schema import enqueue

ROUND_LIMIT_SECONDS = 90


class ProcessLane:
    def __init__(self, state: RunState, lane: int) -> None:
        self.state = state
        self.lane = lane

    def run(self) -> None:
        state, plan, lane = self.state, self.state.plan, self.lane
        rng = random.Random(f"{plan.seed}:process:{lane}")
        lock = f"proc-{lane}"
        state.locks.add(lock)
        quota = plan.share(plan.faults_per_kind, plan.process_lanes)
        rounds_quota = plan.share(plan.process_rounds, plan.process_lanes)
        hits: Counter[str] = Counter()
        round_no = 0
        while not state.abort.is_set():
            done = round_no >= rounds_quota and min(hits["kill9"], hits["sigstop"]) >= quota
            if done:
                return
            round_no += 1
            state.admin.run(lambda c: enqueue(c, lock, rng.randint(2, 6)))
            wanted = [k for k in ("kill9", "sigstop") if hits[k] < quota]
            fault = rng.choice(wanted) if wanted else rng.choice(("kill9", "sigstop", None, None, None))
            strike_after, strike_delay = rng.randint(1, 4), rng.uniform(0.0, 0.03)
            state.wait_at_gate()  # no new processes while a burst is answering or the server restarts
            contenders = [
                state.spawn(
                    lock, f"p{lane}.{round_no}.{i}", round_no, plan.process_lease_seconds, state.skew(rng)
                )
                for i in range(rng.choice((2, 2, 2, 2, 3)))
            ]
            state.in_flight[lane] = contenders
            struck = self.run_round(contenders, fault, strike_after, strike_delay, rng)
            if struck and fault is not None:
                hits[fault] += 1
            state.count_round("process")

    def run_round(
        self,
        contenders: list[Contender],
        fault: str | None,
        strike_after: int,
        strike_delay: float,
        rng: random.Random,
    ) -> bool:
        state = self.state
        pending = list(contenders)
        struck = False
        deadline = time.monotonic() + ROUND_LIMIT_SECONDS
        while pending:
            for c in list(pending):
                if c.reap():
                    pending.remove(c)
                    state.record(c.finish())
            if fault and not struck:
                target = next((c for c in pending if c.holds() and c.progress() >= strike_after), None)
                if target is not None:
                    time.sleep(strike_delay)
                    if target.proc.poll() is None:
                        struck = True
                        self.strike(target, fault, rng)
                        if fault == "sigstop":
                            pending.remove(target)
                            with state.book:
                                state.stragglers.append(target)
            if time.monotonic() > deadline:
                for c in pending:
                    c.proc.kill()
                state.problem(
                    f"process round of {[c.attempt.holder for c in contenders]} did not end in"
                    f" {ROUND_LIMIT_SECONDS} s"
                )
                deadline = float("inf")
            time.sleep(0.01)
        return struck

    def strike(self, target: Contender, fault: str, rng: random.Random) -> None:
        target.attempt.faults.append(fault)
        self.state.count(fault)
        if fault == "kill9":
            target.proc.send_signal(signal.SIGKILL)
        else:
            target.proc.send_signal(signal.SIGSTOP)
            self.state.resume_later(target, self.state.plan.process_lease_seconds + rng.uniform(0.5, 1.5))
