"""The injectors that strike across lanes: PostgreSQL restarts (`pg_ctl restart -m fast`)
and cut connections (`pg_terminate_backend` of a current holder's backend).

A restart waits at the run's gate while a burst's contenders are still answering, so
the burst figure stays the seeds' check; everything else is fair game. When both have
struck their quota, `injectors_done` tells the paced lanes they may stop.
"""

from __future__ import annotations

import os
import random
import threading
import time
from functools import partial
from pathlib import Path

from guardedcron_devenv.postgres import ThrowawayPostgres
from tests.chaos.contenders import terminate_backend
from tests.chaos.run_state import RunState


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


class Injectors:
    def __init__(self, state: RunState) -> None:
        self.state = state

    def run(self) -> None:
        state = self.state
        threads = [
            threading.Thread(target=state.guarded(f.__name__, f), name=f.__name__)
            for f in (self.restarter, self.cutter)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        state.injectors_done.set()

    def restarter(self) -> None:
        state = self.state
        rng = random.Random(f"{state.plan.seed}:restart")
        while state.faults["pg_restart"] < state.plan.faults_per_kind and not state.abort.is_set():
            time.sleep(rng.uniform(0.8, 1.6))
            with state.gate:
                state.server_cpu += server_cpu_seconds(state.server)
                state.server.restart("fast")
            state.count("pg_restart")

    def cutter(self) -> None:
        state = self.state
        rng = random.Random(f"{state.plan.seed}:cut")
        while state.faults["conn_cut"] < state.plan.faults_per_kind and not state.abort.is_set():
            time.sleep(rng.uniform(0.2, 0.8))
            targets = state.admin.run(
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
            row = state.admin.run(partial(terminate_backend, pid))
            if row is not None and row[0]:
                state.count("conn_cut")
