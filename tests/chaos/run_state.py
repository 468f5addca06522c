"""What every lane and injector of one chaos run shares.

The plan and the database; the books (faults struck, rounds run, every contender's
`Attempt`, problems of the harness itself) under one lock; and the run's two signals:
the gate (held by a PostgreSQL restart, and by a burst while its losers answer: lanes
pass through it before starting a round) and abort (the time limit, or an injector
that failed). Also the one way a contender process is started (`spawn`), used by the
process lanes, the bursts and the final clean runs.
"""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from guardedcron_devenv.postgres import ThrowawayPostgres
from guardedcron_devenv.toxiproxy import Proxy
from tests.chaos.contenders import Admin, Attempt, Contender, workload_command, workload_env
from tests.chaos.plan import Plan
from tests.support import REPO
from tests.support.faketime import faketime_library

RETAIN_RUNS = 100_000_000  # keep every attempt: the checks read them all
SKEWS = ("+45s", "-45s", "+10m", "-10m", "+3h", "-3h", "+1d", "-1d", "+400d", "-400d")
SKEW_SHARE = 0.3
ROUND_INTERVAL = 0.1  # seconds between the starts of a connection lane's rounds, at least
# The most outstanding items a paced lane (connection, network) lets pile up: its rounds
# come every 0.1 s whether or not the holder is done, and on a loaded machine a holder
# that must work until nothing is outstanding could otherwise never finish.
OUTSTANDING_CAP = 12


@dataclass
class BurstResult:
    winners: int
    process_loser_seconds: list[float]
    connection_loser_seconds: list[float]
    loser_codes: list[int]
    load_average: float  # of the machine when the burst ended: a loaded host slows process start-up


class RunState:
    def __init__(self, server: ThrowawayPostgres, dsn: str, plan: Plan, log: Callable[[str], None]) -> None:
        self.server = server
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
        self.in_flight: dict[int, list[Contender]] = {}  # each process lane's current round
        self.stragglers: list[Contender] = []  # stopped or still-working processes, reaped at the end
        self.locks: set[str] = set()
        self.pooled_locks: dict[str, str] = {}  # locks reached through the pooler: the DSN there
        self.proxies: list[Proxy] = []
        self.problems: list[str] = []  # harness-level failures (not invariants): reported, fail the run
        self.book = threading.Lock()
        self.gate = threading.Lock()  # held by a restart, and by a burst while its losers answer
        self.timers: list[threading.Timer] = []
        self.injectors_done = threading.Event()
        self.abort = threading.Event()
        self.started = 0.0
        self.server_cpu = 0.0  # of servers already restarted
        self.lane_seconds: dict[str, float] = {}  # when each paced lane met its quotas

    # --- bookkeeping ----------------------------------------------------------------------
    def count(self, kind: str, n: int = 1) -> None:
        with self.book:
            self.faults[kind] += n

    def count_round(self, kind: str) -> None:
        with self.book:
            self.rounds[kind] += 1

    def record(self, attempt: Attempt) -> None:
        with self.book:
            self.attempts.append(attempt)

    def problem(self, message: str) -> None:
        with self.book:
            self.problems.append(message)

    def over_time(self) -> bool:
        return time.monotonic() - self.started > self.plan.time_limit_seconds

    def wait_at_gate(self) -> None:
        """Stand still while a burst's losers answer or the server restarts."""
        with self.gate:
            pass

    def guarded(self, name: str, target: Callable[[], None]) -> Callable[[], None]:
        """`target` for the run's thread `name`: what it raises is a problem, and ends the run."""

        def run() -> None:
            try:
                target()
            except Exception as exc:
                self.problem(f"{name} failed: {exc!r}")
                self.abort.set()
                self.injectors_done.set()

        return run

    # --- processes ------------------------------------------------------------------------
    def spawn(self, lock: str, holder: str, slot: int | None, lease: float, skew: str | None) -> Contender:
        """A workload process for `lock`, reaching the database the way the lock's lane does."""
        run_dir = self.workdir / holder
        run_dir.mkdir(parents=True)
        faults = []
        if skew is not None:
            faults.append(f"clock_skew:{skew}")
            self.count("clock_skew")
        pooled_dsn = self.pooled_locks.get(lock)
        command = workload_command(lock, holder, slot, lease, run_dir, pooled=pooled_dsn is not None)
        env = workload_env(pooled_dsn or self.dsn, skew)
        with (run_dir / "stderr").open("wb") as stderr:
            proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
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
        self.timers.append(timer)
        timer.start()
