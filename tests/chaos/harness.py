"""The chaos run: lanes of contenders racing for leases while injectors break things.

Three kinds of lanes run at once, each on its own lock:

- process lanes: every contender is a real process (tests/chaos/workload.py) that runs
  the real `guardedcron acquire` command; the faults that need a process strike here:
  `kill -9` of the holder mid-run, `SIGSTOP` past its lease then `SIGCONT`, and clock
  skew (libfaketime preloaded into the contender and the guard it runs);
- connection lanes: contenders are threads with their own connections calling the
  same SQL functions through guardedcron.guard.lease, where process start-up would
  otherwise eat the 2-core budget; their holders stall past the lease in-process;
- the burst lane: many contenders (processes and connections) for one slot at once;
  one must work and every process loser must exit within the seeds' 5 s;
- network lanes: connection contenders, each talking to PostgreSQL through a Toxiproxy
  of its own; a holder (between batches or inside a fenced transaction) or a contender
  mid-acquire is cut off, slowed, reset or throttled for a window, then healed
  (tests/chaos/network.py).

Two injectors strike across lanes: PostgreSQL restarts (`pg_ctl restart -m fast`) and
cut connections (`pg_terminate_backend` of a current holder's backend). A restart
waits while a burst's contenders are still answering, so the burst figure stays the
seeds' check; everything else is fair game.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from guardedcron.guard import lease as lease_ops
from guardedcron.guard.lease import AcquireRequest
from guardedcron_devenv.postgres import ThrowawayPostgres
from guardedcron_devenv.toxiproxy import Proxy, Toxiproxy
from tests.chaos.contenders import (
    Admin,
    Attempt,
    Contender,
    Link,
    faketime_library,
    name_connection,
    store_attempts,
    terminate_backend,
    workload_command,
    workload_env,
)
from tests.chaos.network import NetworkFault, Strike, bounded_dsn, draw_fault
from tests.chaos.plan import NETWORK_FAULT_KINDS, Plan
from tests.chaos.schema import enqueue
from tests.chaos.work import Holding, Job, Refused, is_transient
from tests.support import REPO

T = TypeVar("T")
Connection = psycopg.Connection[tuple[Any, ...]]

RETAIN_RUNS = 100_000_000  # keep every attempt: the checks read them all
SKEWS = ("+45s", "-45s", "+10m", "-10m", "+3h", "-3h", "+1d", "-1d", "+400d", "-400d")
SKEW_SHARE = 0.3
ROUND_INTERVAL = 0.1  # seconds between the starts of a connection lane's rounds, at least
# The most outstanding items a paced lane (connection, network) lets pile up: its rounds
# come every 0.1 s whether or not the holder is done, and on a loaded machine a holder
# that must work until nothing is outstanding could otherwise never finish.
OUTSTANDING_CAP = 12
NETWORK_SEATS = 6
# Locks a network lane's rounds choose from: a struck holder keeps its lock's lease for up
# to its window, and a round on a free lock has a winner to strike.
NETWORK_LOCKS = 4  # per network lane: a partitioned holder keeps its seat until healed
# Where a network fault strikes a holder: between batches (its renewal goes first), or
# inside a fenced transaction (after its read). Contenders are also struck mid-acquire.
NETWORK_HOLD_PHASES = ("between_batches", "in_transaction")


def server_cpu_seconds(server: ThrowawayPostgres) -> float:
    """CPU used so far by the running server: the postmaster, its live children, and the reaped ones."""
    try:
        postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(stat.parent.name), int(fields[1])
        if pid == postmaster:
            total += sum(int(f) for f in fields[11:15])  # utime, stime, and of reaped children
        elif ppid == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / tick


@dataclass
class BurstResult:
    winners: int
    process_loser_seconds: list[float]
    connection_loser_seconds: list[float]
    loser_codes: list[int]
    load_average: float  # of the machine when the burst ended: a loaded host slows process start-up


class Chaos:
    def __init__(
        self,
        server: ThrowawayPostgres,
        dsn: str,
        plan: Plan,
        log: Callable[[str], None],
        toxiproxy: Toxiproxy,
    ) -> None:
        self.server = server
        self.toxiproxy = toxiproxy
        self.proxies: list[Proxy] = []
        self.dsn = dsn
        self.plan = plan
        self.log = log
        self.admin = Admin(dsn)
        faketime_library()  # fail at once, not in the middle of the run, when it is missing
        self.workdir = Path(tempfile.mkdtemp(prefix="guardedcron-chaos-"))
        self.faults: Counter[str] = Counter()
        self.rounds: Counter[str] = Counter()
        self.attempts: list[Attempt] = []
        self.bursts: list[BurstResult] = []
        self._in_flight: dict[int, list[Contender]] = {}  # each process lane's current round
        self.stragglers: list[Contender] = []  # stopped or still-working processes, reaped at the end
        self.locks: set[str] = set()
        self.problems: list[str] = []  # harness-level failures (not invariants): reported, fail the run
        self._book = threading.Lock()
        self._gate = threading.Lock()  # held by a restart, and by a burst while its losers answer
        self._timers: list[threading.Timer] = []
        self._injectors_done = threading.Event()
        self._abort = threading.Event()
        self.started = 0.0
        self.seconds = 0.0
        self.server_cpu = 0.0  # of servers already restarted
        self.cpu: dict[str, float] = {}
        self.lane_seconds: dict[str, float] = {}  # when each network lane met its quotas

    # --- bookkeeping ----------------------------------------------------------------------
    def count(self, kind: str, n: int = 1) -> None:
        with self._book:
            self.faults[kind] += n

    def record(self, attempt: Attempt) -> None:
        with self._book:
            self.attempts.append(attempt)

    def problem(self, message: str) -> None:
        with self._book:
            self.problems.append(message)

    def over_time(self) -> bool:
        return time.monotonic() - self.started > self.plan.time_limit_seconds

    # --- processes ------------------------------------------------------------------------
    def spawn(self, lock: str, holder: str, slot: int | None, lease: float, skew: str | None) -> Contender:
        run_dir = self.workdir / holder
        run_dir.mkdir(parents=True)
        faults = []
        if skew is not None:
            faults.append(f"clock_skew:{skew}")
            self.count("clock_skew")
        command = workload_command(lock, holder, slot, lease, run_dir)
        with (run_dir / "stderr").open("wb") as stderr:
            proc = subprocess.Popen(
                command, cwd=REPO, env=workload_env(self.dsn, skew), stdout=subprocess.DEVNULL, stderr=stderr
            )
        return Contender(
            Attempt(holder, "process", lock, slot, faults=faults), proc, run_dir, time.monotonic()
        )

    def skew(self, rng: random.Random) -> str | None:
        return rng.choice(SKEWS) if rng.random() < SKEW_SHARE else None

    def resume_later(self, contender: Contender, after: float) -> None:
        def resume() -> None:
            with contextlib.suppress(ProcessLookupError):
                contender.proc.send_signal(signal.SIGCONT)

        timer = threading.Timer(after, resume)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    # --- process lanes ----------------------------------------------------------------------
    def process_lane(self, lane: int) -> None:
        plan = self.plan
        rng = random.Random(f"{plan.seed}:process:{lane}")
        lock = f"proc-{lane}"
        self.locks.add(lock)
        quota = plan.share(plan.faults_per_kind, plan.process_lanes)
        rounds_quota = plan.share(plan.process_rounds, plan.process_lanes)
        hits: Counter[str] = Counter()
        round_no = 0
        while not self._abort.is_set():
            done = round_no >= rounds_quota and min(hits["kill9"], hits["sigstop"]) >= quota
            if done:
                return
            round_no += 1
            self.admin.run(lambda c: enqueue(c, lock, rng.randint(2, 6)))
            wanted = [k for k in ("kill9", "sigstop") if hits[k] < quota]
            fault = rng.choice(wanted) if wanted else rng.choice(("kill9", "sigstop", None, None, None))
            strike_after, strike_delay = rng.randint(1, 4), rng.uniform(0.0, 0.03)
            with self._gate:  # no new processes while a burst is answering or the server restarts
                pass
            contenders = [
                self.spawn(
                    lock, f"p{lane}.{round_no}.{i}", round_no, plan.process_lease_seconds, self.skew(rng)
                )
                for i in range(rng.choice((2, 2, 2, 2, 3)))
            ]
            self._in_flight[lane] = contenders
            struck = self.run_process_round(contenders, fault, strike_after, strike_delay, rng)
            if struck and fault is not None:
                hits[fault] += 1
            with self._book:
                self.rounds["process"] += 1

    def run_process_round(
        self,
        contenders: list[Contender],
        fault: str | None,
        strike_after: int,
        strike_delay: float,
        rng: random.Random,
    ) -> bool:
        pending = list(contenders)
        struck = False
        deadline = time.monotonic() + 90
        while pending:
            for c in list(pending):
                if c.reap():
                    pending.remove(c)
                    self.record(c.finish())
            if fault and not struck:
                target = next((c for c in pending if c.holds() and c.progress() >= strike_after), None)
                if target is not None:
                    time.sleep(strike_delay)
                    if target.proc.poll() is None:
                        struck = True
                        self.strike(target, fault, rng)
                        if fault == "sigstop":
                            pending.remove(target)
                            with self._book:
                                self.stragglers.append(target)
            if time.monotonic() > deadline:
                for c in pending:
                    c.proc.kill()
                self.problem(f"process round of {[c.attempt.holder for c in contenders]} did not end in 90 s")
                deadline = float("inf")
            time.sleep(0.01)
        return struck

    def strike(self, target: Contender, fault: str, rng: random.Random) -> None:
        target.attempt.faults.append(fault)
        self.count(fault)
        if fault == "kill9":
            target.proc.send_signal(signal.SIGKILL)
        else:
            target.proc.send_signal(signal.SIGSTOP)
            self.resume_later(target, self.plan.process_lease_seconds + rng.uniform(0.5, 1.5))

    # --- connection lanes ---------------------------------------------------------------------
    def connection_lane(self, lane: int) -> None:
        plan = self.plan
        rng = random.Random(f"{plan.seed}:connection:{lane}")
        lock = f"conn-{lane}"
        self.locks.add(lock)
        seats: queue.Queue[Link] = queue.Queue()
        for number in range(6):
            seats.put(Link(self.dsn, f"seat-{lane}.{number}"))
        quota = plan.share(plan.faults_per_kind, plan.connection_lanes)
        rounds_quota = plan.share(plan.connection_rounds, plan.connection_lanes)
        stalls = 0
        round_no = 0
        next_round = 0.0
        with ThreadPoolExecutor(6, thread_name_prefix=f"conn{lane}") as pool:
            while not self._abort.is_set():
                if round_no >= rounds_quota and stalls >= quota:
                    if self._injectors_done.is_set():
                        break
                    time.sleep(0.3)  # enough rounds: keep some going for the injectors to hit, cheaply
                # Like a schedule firing: rounds come at a pace, whether or not the last one is done
                # (a round in which a stalled holder still has the lease is quick: everyone loses).
                time.sleep(max(0.0, next_round - time.monotonic()))
                next_round = time.monotonic() + ROUND_INTERVAL
                round_no += 1
                self.admin.run(lambda c: enqueue(c, lock, rng.randint(2, 6), outstanding_cap=OUTSTANDING_CAP))
                with self._gate:  # stand still while a burst's losers answer
                    pass
                size = rng.randint(2, 4)
                taken = [seats.get() for _ in range(size)]
                stall_at = rng.randint(1, 4) if stalls < quota and rng.random() < 0.5 else None
                barrier = threading.Barrier(size)
                out = [threading.Event() for _ in taken]
                stalled = threading.Event()
                for i, seat in enumerate(taken):
                    attempt = Attempt(f"c{lane}.{round_no}.{i}", "connection", lock, round_no)
                    pool.submit(
                        self.connection_contender,
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
                with self._book:
                    self.rounds["connection"] += 1
        while not seats.empty():
            seats.get().close()

    def connection_contender(
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
        lease = self.plan.connection_lease_seconds
        rng = random.Random(seed)

        def stall(batch: int) -> None:
            if batch == stall_at and "stall" not in attempt.faults:
                attempt.faults.append("stall")
                self.count("stall")
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
            result = self.acquire_on(conn, attempt, lease)
            if result is not None and result.acquired:
                self.work_and_release(seat, attempt, result.fence, lease, rng, stall)
        except Exception as exc:
            self.problem(f"connection contender {attempt.holder} failed: {exc!r}")
        finally:
            self.record(attempt)
            out.set()
            give_back(seat)

    def acquire_on(self, conn: Connection, attempt: Attempt, lease: float) -> lease_ops.AcquireResult | None:
        request = AcquireRequest(
            attempt.lock, attempt.holder, lease, slot=attempt.slot, retain_runs=RETAIN_RUNS
        )
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
        self,
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
            seat.dsn, holding, rng=rng, before_batch=before_batch, after_read=after_read, conn=seat.get()
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

    # --- network lanes -------------------------------------------------------------------------
    def network_seat(self, lane: int, seat: int) -> tuple[Link, Proxy]:
        name = f"chaos-{uuid.uuid4().hex[:8]}-{lane}.{seat}"
        proxy = self.toxiproxy.proxy(name, f"127.0.0.1:{self.server.port}")
        with self._book:
            self.proxies.append(proxy)
        return Link(bounded_dsn(proxy, self.dsn), f"net-seat-{lane}.{seat}"), proxy

    def network_lane(self, lane: int) -> None:
        plan = self.plan
        rng = random.Random(f"{plan.seed}:network:{lane}")
        locks = [f"net-{lane}.{n}" for n in range(NETWORK_LOCKS)]
        self.locks.update(locks)
        seats: queue.Queue[tuple[Link, Proxy]] = queue.Queue()
        for number in range(NETWORK_SEATS):
            seats.put(self.network_seat(lane, number))
        quota = plan.share(plan.faults_per_kind, plan.network_lanes)
        struck: list[str] = []  # kinds applied so far; appended by contender threads
        round_no = 0
        next_round = 0.0
        with ThreadPoolExecutor(NETWORK_SEATS, thread_name_prefix=f"net{lane}") as pool:
            while not self._abort.is_set():
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
                self.admin.run(partial(enqueue, lock=lock, count=items, outstanding_cap=OUTSTANDING_CAP))
                with self._gate:  # stand still while a burst's losers answer
                    pass
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
                        self.network_contender,
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
                with self._book:
                    self.rounds["network"] += 1
        self.lane_seconds[f"network-{lane}"] = round(time.monotonic() - self.started, 1)

    def network_contender(
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
        lease = self.plan.connection_lease_seconds
        rng = random.Random(seed)

        def hit() -> None:
            """Apply the fault from this thread, right before it talks through the proxy."""
            fault: NetworkFault = strike.fault
            strike.apply()
            attempt.faults.append(f"{fault.kind}@{phase}")
            self.count(fault.kind)
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
            result = self.acquire_on(conn, attempt, lease)
            # The next round need not wait for this one's work: seats (6 a lane) bound how
            # many contenders are in flight, and a winner keeps its seat while it works.
            out.set()
            if result is not None and result.acquired:
                self.work_and_release(
                    seat,
                    attempt,
                    result.fence,
                    lease,
                    rng,
                    before_batch=at("between_batches"),
                    after_read=at("in_transaction"),
                )
        except Exception as exc:
            self.problem(f"network contender {attempt.holder} failed: {exc!r}")
        finally:
            strike.wait_healed()  # a seat goes back to the pool clean
            if strike.heal_error is not None:
                self.problem(f"healing {strike.fault.describe()} failed: {strike.heal_error!r}")
                self._abort.set()
            self.record(attempt)
            out.set()
            give_back()

    # --- bursts ------------------------------------------------------------------------------
    def burst_lane(self) -> None:
        plan = self.plan
        rng = random.Random(f"{plan.seed}:burst")
        lock = "burst"
        self.locks.add(lock)
        seats = [Link(self.dsn, f"burst-seat.{i}") for i in range(plan.burst_connections)]
        with ThreadPoolExecutor(plan.burst_connections, thread_name_prefix="burst") as pool:
            for burst in range(1, plan.bursts + 1):
                if self._abort.is_set():
                    break
                self.wait_until_free(lock)
                self.admin.run(lambda c: enqueue(c, lock, rng.randint(2, 6)))
                self.bursts.append(self.one_burst(pool, seats, lock, burst, rng))
                self.count("burst")
                with self._book:
                    self.rounds["burst"] += 1
        for seat in seats:
            seat.close()

    def one_burst(
        self, pool: ThreadPoolExecutor, seats: list[Link], lock: str, slot: int, rng: random.Random
    ) -> BurstResult:
        plan = self.plan
        answers = [Attempt(f"b.{slot}.c{i}", "connection", lock, slot) for i in range(plan.burst_connections)]
        answered = [threading.Event() for _ in answers]
        with self._gate:  # no restart, and no new process elsewhere, until every loser has answered
            self.wait_for_in_flight_answers()
            for seat in seats:
                seat.probe()
            started = time.monotonic()
            procs = [
                self.spawn(lock, f"b.{slot}.p{i}", slot, plan.process_lease_seconds, self.skew(rng))
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
            self.record(c.finish())
        if winner is not None:
            with self._book:
                self.stragglers.append(winner)
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
            if all(c.answered() for round_ in list(self._in_flight.values()) for c in round_):
                return
            time.sleep(0.01)

    def burst_connection(self, seat: Link, attempt: Attempt, answered: threading.Event, seed: float) -> None:
        try:
            result = self.acquire_on(seat.get(), attempt, self.plan.process_lease_seconds)
            answered.set()
            if result is not None and result.acquired:
                self.work_and_release(
                    seat, attempt, result.fence, self.plan.process_lease_seconds, random.Random(seed)
                )
        except Exception as exc:
            self.problem(f"burst contender {attempt.holder} failed: {exc!r}")
        finally:
            answered.set()
            self.record(attempt)

    def wait_until_free(self, lock: str, limit: float = 60.0) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            row = self.admin.run(
                lambda c: c.execute(
                    "SELECT coalesce(bool_and(locked_until <= clock_timestamp()), true)"
                    " FROM guardedcron.leases WHERE lock_name = %s",
                    (lock,),
                ).fetchone()
            )
            if row is not None and row[0]:
                return
            time.sleep(0.05)
        self.problem(f"lease {lock} still held after {limit:g} s")

    # --- injectors -----------------------------------------------------------------------------
    def restarter(self) -> None:
        rng = random.Random(f"{self.plan.seed}:restart")
        while self.faults["pg_restart"] < self.plan.faults_per_kind and not self._abort.is_set():
            time.sleep(rng.uniform(0.8, 1.6))
            with self._gate:
                self.server_cpu += server_cpu_seconds(self.server)
                self.server.restart("fast")
            self.count("pg_restart")

    def cutter(self) -> None:
        rng = random.Random(f"{self.plan.seed}:cut")
        while self.faults["conn_cut"] < self.plan.faults_per_kind and not self._abort.is_set():
            time.sleep(rng.uniform(0.2, 0.8))
            targets = self.admin.run(
                lambda c: c.execute(
                    "SELECT a.pid FROM pg_stat_activity a JOIN guardedcron.leases l"
                    " ON a.application_name = 'chaos:' || l.holder"
                    " WHERE l.locked_until > clock_timestamp() AND a.datname = current_database()"
                    " ORDER BY a.pid"
                ).fetchall()
            )
            if not targets:
                continue
            pid = rng.choice(targets)[0]
            row = self.admin.run(partial(terminate_backend, pid))
            if row is not None and row[0]:
                self.count("conn_cut")

    def injectors(self) -> None:
        threads = [
            threading.Thread(target=self.guarded(f), name=f.__name__) for f in (self.restarter, self.cutter)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._injectors_done.set()

    def guarded(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except Exception as exc:
                self.problem(f"{getattr(target, '__name__', target)!s} failed: {exc!r}")
                self._abort.set()
                self._injectors_done.set()

        return run

    # --- the whole run ---------------------------------------------------------------------------
    def run(self) -> None:
        self.started = time.monotonic()
        plan = self.plan
        workers = [threading.Thread(target=self.guarded(self.injectors), name="injectors")]
        workers += [
            threading.Thread(target=self.guarded(partial(self.process_lane, n)), name=f"process-{n}")
            for n in range(plan.process_lanes)
        ]
        workers += [
            threading.Thread(target=self.guarded(partial(self.connection_lane, n)), name=f"connection-{n}")
            for n in range(plan.connection_lanes)
        ]
        workers += [
            threading.Thread(target=self.guarded(partial(self.network_lane, n)), name=f"network-{n}")
            for n in range(plan.network_lanes)
        ]
        workers.append(threading.Thread(target=self.guarded(self.burst_lane), name="bursts"))
        watchdog = threading.Thread(target=self.watch_time, daemon=True)
        for w in workers:
            w.start()
        watchdog.start()
        for w in workers:
            w.join()
        self.settle()
        self.remove_proxies()
        self.final_clean_runs()
        self.seconds = time.monotonic() - self.started
        me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu = {
            "harness": round(me.ru_utime + me.ru_stime, 1),
            "contender_processes": round(children.ru_utime + children.ru_stime, 1),
            "postgres": round(self.server_cpu + server_cpu_seconds(self.server), 1),
        }

    def remove_proxies(self) -> None:
        for proxy in self.proxies:
            proxy.delete()

    def remove_traces(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)

    def watch_time(self) -> None:
        while not self._abort.wait(1.0):
            if self.over_time():
                self.problem(f"time limit of {self.plan.time_limit_seconds:g} s reached; stopping early")
                self._abort.set()

    def settle(self) -> None:
        """Let every stopped process resume and every straggler finish."""
        for timer in self._timers:
            timer.join()
        for c in self.stragglers:
            with contextlib.suppress(ProcessLookupError):
                c.proc.send_signal(signal.SIGCONT)
            try:
                c.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
                self.problem(f"{c.attempt.holder} did not finish within 90 s after resuming")
            c.reap()
            self.record(c.finish())

    def final_clean_runs(self) -> None:
        """One undisturbed run per lock: it must win (once the lease is free) and finish the work.

        Locks are independent, so their final runs go two at a time (one per core)."""
        with ThreadPoolExecutor(2, thread_name_prefix="final") as pool:
            list(pool.map(self.final_clean_run, sorted(self.locks)))

    def final_clean_run(self, lock: str) -> None:
        for attempt_no in range(60):
            c = self.spawn(lock, f"final.{lock}.{attempt_no}", None, 5.0, None)
            c.proc.wait(timeout=120)
            c.reap()
            self.record(c.finish())
            if c.proc.returncode == 0:
                return
            time.sleep(0.5)
        self.problem(f"no clean final run of {lock} succeeded")

    def store_attempts(self) -> None:
        self.admin.run(partial(store_attempts, self.attempts))
