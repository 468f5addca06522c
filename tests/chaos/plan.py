"""How big a chaos run is, and the pytest options that choose it.

`--chaos-seed N` replays a run's choices (pass it with the test path:
`pytest tests/chaos --chaos-seed 1234`); by default a random seed is drawn and printed.
`--chaos-long` runs ten times the default.

The seed fixes every lane's sequence of choices (contenders per round, which faults, when
they strike, clock offsets); it cannot fix how a busy machine interleaves processes, so
a replay repeats the plan, not the exact timing.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, replace

import pytest

# Faults a real Toxiproxy makes between a network contender and PostgreSQL (tests/chaos/network.py).
NETWORK_FAULT_KINDS = (
    "net_blackhole",
    "net_blackhole_up",
    "net_blackhole_down",
    "net_latency",
    "net_reset",
    "net_slicer",
    "net_bandwidth",
)
FAULT_KINDS = ("kill9", "sigstop", "pg_restart", "conn_cut", "clock_skew", "burst", *NETWORK_FAULT_KINDS)


@dataclass(frozen=True)
class Plan:
    seed: int
    process_rounds: int  # contended rounds of real processes (CLI acquire + workload)
    connection_rounds: int  # contended rounds of in-process connections (SQL functions)
    bursts: int  # many contenders for one slot at once; also a fault kind
    faults_per_kind: int  # at least this many of each kind in FAULT_KINDS, plus stalls
    process_lanes: int = 3
    connection_lanes: int = 2
    network_lanes: int = 3  # connection contenders, each behind a Toxiproxy of its own
    pooled_lanes: int = 1  # connection lanes through PgBouncer in transaction mode, same quotas
    process_lease_seconds: float = 2.0
    connection_lease_seconds: float = 1.0
    burst_processes: int = 3
    burst_connections: int = 30
    loser_exit_limit_seconds: float = 5.0  # the seeds' check: the losers of a burst are gone by then
    # A guard against a hung run, not the budget: the default run takes about 2 minutes on 2
    # idle cores (docs/benchmarks.md); a loaded machine stretches it, and that is no failure.
    time_limit_seconds: float = 840.0

    def share(self, total: int, lanes: int) -> int:
        """Each lane's part of a quota, so a lane's choices depend on its own seed only."""
        return math.ceil(total / lanes)

    def scaled(self, factor: int) -> Plan:
        return replace(
            self,
            process_rounds=self.process_rounds * factor,
            connection_rounds=self.connection_rounds * factor,
            bursts=self.bursts * factor,
            faults_per_kind=self.faults_per_kind * factor,
            time_limit_seconds=self.time_limit_seconds * factor,
        )


def default_plan(seed: int) -> Plan:
    return Plan(seed=seed, process_rounds=100, connection_rounds=350, bursts=50, faults_per_kind=50)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos", "chaos suite (tests/chaos)")
    group.addoption(
        "--chaos-seed", type=int, default=None, help="seed of the fault plan (default: random, printed)"
    )
    group.addoption(
        "--chaos-long", action="store_true", default=False, help="run ten times the default chaos"
    )


def plan_from_options(config: pytest.Config) -> Plan:
    seed = config.getoption("--chaos-seed", default=None)
    plan = default_plan(secrets.randbelow(2**31) if seed is None else int(seed))
    if config.getoption("--chaos-long", default=False):
        plan = plan.scaled(10)
    return plan
