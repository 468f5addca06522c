"""The chaos run: lanes of contenders racing for leases while injectors break things.

`Chaos` only assembles and runs them, on one shared `RunState` (tests/chaos/run_state.py:
the plan, the books, the gate and the abort signal). Kinds of lanes, each on locks of
its own, all at once:

- process lanes (tests/chaos/process_lanes.py): real `guardedcron acquire` processes;
  `kill -9`, `SIGSTOP` past the lease, clock skew;
- connection lanes (tests/chaos/connection_lanes.py): threads calling the SQL functions
  on connections of their own; holders stall past the lease in-process;
- the burst lane (tests/chaos/burst_lane.py): many contenders for one slot at once;
- network lanes (tests/chaos/network_lanes.py): connection contenders, each behind a
  Toxiproxy of its own, cut off, slowed, reset or throttled for a window, then healed;
- the pooled lane (tests/chaos/connection_lanes.py too): a connection lane whose every
  connection goes through a real PgBouncer in transaction mode.

The injectors (tests/chaos/injectors.py) strike across lanes: PostgreSQL restarts and
cut connections. Afterwards every stopped process is resumed and reaped, and one
undisturbed run per lock must finish the outstanding work.
"""

from __future__ import annotations

import contextlib
import resource
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from guardedcron_devenv.pgbouncer import PgBouncer
from guardedcron_devenv.postgres import ThrowawayPostgres
from guardedcron_devenv.toxiproxy import Toxiproxy
from tests.chaos.burst_lane import BurstLane
from tests.chaos.connection_lanes import ConnectionLane
from tests.chaos.contenders import store_attempts
from tests.chaos.injectors import Injectors, server_cpu_seconds
from tests.chaos.network_lanes import NetworkLane
from tests.chaos.plan import Plan
from tests.chaos.process_lanes import ProcessLane
from tests.chaos.run_state import RunState
from tests.support.pgbouncer import session_state

FINAL_RUN_TRIES = 60


class Chaos:
    def __init__(
        self,
        server: ThrowawayPostgres,
        dsn: str,
        plan: Plan,
        log: Callable[[str], None],
        toxiproxy: Toxiproxy,
        pooler: PgBouncer,
    ) -> None:
        self.state = RunState(server, dsn, plan, log)
        self.toxiproxy = toxiproxy
        self.pooler = pooler
        self.pooled_dsn = pooler.dsn_for(dsn)
        self.seconds = 0.0
        self.cpu: dict[str, float] = {}
        self.pooler_figures: dict[str, Any] = {}

    def workers(self) -> list[tuple[str, Callable[[], None]]]:
        """Every thread of the run, by name: the injectors, then the lanes."""
        state, plan = self.state, self.state.plan
        return [
            ("injectors", Injectors(state).run),
            *((f"process-{n}", ProcessLane(state, n).run) for n in range(plan.process_lanes)),
            *((f"connection-{n}", ConnectionLane(state, n).run) for n in range(plan.connection_lanes)),
            *((f"network-{n}", NetworkLane(state, self.toxiproxy, n).run) for n in range(plan.network_lanes)),
            *(
                (f"pooled-{n}", ConnectionLane(state, n, pooler_dsn=self.pooled_dsn).run)
                for n in range(plan.pooled_lanes)
            ),
            ("bursts", BurstLane(state).run),
        ]

    def run(self) -> None:
        state = self.state
        state.started = time.monotonic()
        workers = [
            threading.Thread(target=state.guarded(name, work), name=name) for name, work in self.workers()
        ]
        watchdog = threading.Thread(target=self.watch_time, daemon=True)
        for w in workers:
            w.start()
        watchdog.start()
        for w in workers:
            w.join()
        self.settle()
        self.remove_proxies()
        self.final_clean_runs()
        self.pooler_figures = self.read_pooler()
        self.seconds = time.monotonic() - state.started
        me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu = {
            "harness": round(me.ru_utime + me.ru_stime, 1),
            "contender_processes": round(children.ru_utime + children.ru_stime, 1),
            "postgres": round(state.server_cpu + server_cpu_seconds(state.server), 1),
        }

    def read_pooler(self) -> dict[str, Any]:
        """What went through the pooler, and what its server sessions hold after the run:
        a session left with a prepared statement, a setting, an advisory lock, ... is a leak."""
        dbname = conninfo_to_dict(self.pooled_dsn)["dbname"]
        stats = next((row for row in self.pooler.show("STATS") if row["database"] == dbname), {})
        try:
            sessions = session_state(self.pooler, self.pooled_dsn)
        except (AssertionError, psycopg.Error) as error:
            self.state.problem(f"could not read the server sessions behind the pooler: {error!r}")
            sessions = {}
        return {
            "transactions": int(stats.get("total_xact_count", 0)),
            "statements": int(stats.get("total_query_count", 0)),
            "server_sessions_checked": len(sessions),
            "leaks": {pid: repr(state) for pid, state in sessions.items() if not state.clean},
        }

    def remove_proxies(self) -> None:
        for proxy in self.state.proxies:
            proxy.delete()

    def remove_traces(self) -> None:
        shutil.rmtree(self.state.workdir, ignore_errors=True)

    def watch_time(self) -> None:
        state = self.state
        while not state.abort.wait(1.0):
            if state.over_time():
                state.problem(f"time limit of {state.plan.time_limit_seconds:g} s reached; stopping early")
                state.abort.set()

    def settle(self) -> None:
        """Let every stopped process resume and every straggler finish."""
        state = self.state
        for timer in state.timers:
            timer.join()
        for c in state.stragglers:
            with contextlib.suppress(ProcessLookupError):
                c.proc.send_signal(signal.SIGCONT)
            try:
                c.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
                state.problem(f"{c.attempt.holder} did not finish within 90 s after resuming")
            c.reap()
            state.record(c.finish())

    def final_clean_runs(self) -> None:
        """One undisturbed run per lock: it must win (once the lease is free) and finish the work.

        Locks are independent, so their final runs go two at a time (one per core)."""
        with ThreadPoolExecutor(2, thread_name_prefix="final") as pool:
            list(pool.map(self.final_clean_run, sorted(self.state.locks)))

    def final_clean_run(self, lock: str) -> None:
        state = self.state
        for attempt_no in range(FINAL_RUN_TRIES):
            c = state.spawn(lock, f"final.{lock}.{attempt_no}", None, 5.0, None)
            c.proc.wait(timeout=120)
            c.reap()
            state.record(c.finish())
            if c.proc.returncode == 0:
                return
            time.sleep(0.5)
        state.problem(f"no clean final run of {lock} succeeded")

    def store_attempts(self) -> None:
        self.state.admin.run(partial(store_attempts, self.state.attempts))
