"""The figures of a chaos run, and the run-level checks that are not about the database."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

from tests.chaos.contenders import Attempt
from tests.chaos.harness import Chaos
from tests.chaos.invariants import Findings
from tests.chaos.plan import FAULT_KINDS


def figures(chaos: Chaos, found: Findings) -> dict[str, Any]:
    state = chaos.state
    attempts = state.attempts
    bursts = state.bursts
    process_losers = [s for b in bursts for s in b.process_loser_seconds]
    connection_losers = [s for b in bursts for s in b.connection_loser_seconds]
    return {
        "seed": state.plan.seed,
        "wall_seconds": round(chaos.seconds, 1),
        "cpu_seconds": chaos.cpu,
        "contended_runs": {
            "process": state.rounds["process"],
            "connection": state.rounds["connection"],
            "burst": state.rounds["burst"],
            "network": state.rounds["network"],
            "pooled": state.rounds["pooled"],
            "total": sum(state.rounds.values()),
        },
        "attempts": {
            "process": sum(a.path == "process" for a in attempts),
            "connection": sum(a.path == "connection" for a in attempts),
            "answered": sum(a.answered for a in attempts),
            "won": sum(a.acquired for a in attempts),
            "refused_and_stopped": sum(a.exit_code == 76 for a in attempts),
        },
        "faults": {kind: state.faults[kind] for kind in (*FAULT_KINDS, "stall", "pooled_stall")},
        "pooler": {**chaos.pooler_figures, "attempts": pooled_attempts(attempts, state.pooled_locks)},
        "network_faults": network_figures(state.attempts),
        "lanes_done_after_seconds": state.lane_seconds,  # the paced lanes: connection, pooled, network
        "duplicates": found.figures.get("duplicates"),
        "stale_writes_refused": found.figures.get("stale_writes_refused"),
        "max_loser_exit_seconds": {
            "burst_process": round(max(process_losers, default=0.0), 3),
            "burst_connection": round(max(connection_losers, default=0.0), 3),
        },
        "burst_contenders": state.plan.burst_processes + state.plan.burst_connections,
        **{k: v for k, v in found.figures.items() if k not in ("duplicates", "stale_writes_refused")},
    }


def pooled_attempts(attempts: list[Attempt], pooled_locks: dict[str, str]) -> dict[str, int]:
    """The pooled lane's contenders (final clean runs included): all of them went through the pooler."""
    pooled = [a for a in attempts if a.lock in pooled_locks]
    return {
        "contenders": len(pooled),
        "answered": sum(a.answered for a in pooled),
        "won": sum(a.acquired for a in pooled),
        "refused_and_stopped": sum(a.exit_code == 76 for a in pooled),
    }


def network_figures(attempts: list[Attempt]) -> dict[str, Any]:
    """Where the network faults struck, and what became of their victims."""
    struck = [(a, f) for a in attempts for f in a.faults if f.startswith("net_")]
    phases = Counter(f.split("@", 1)[1] for _, f in struck)
    holders = [a for a, f in struck if not f.endswith("@acquire")]
    return {
        "by_phase": dict(sorted(phases.items())),
        "holders_struck": len(holders),
        "holders_refused_after_heal": sum(a.exit_code == 76 for a in holders),
        "acquires_struck_unanswered": sum(not a.answered for a, f in struck if f.endswith("@acquire")),
    }


def run_problems(chaos: Chaos) -> list[str]:
    """Checks of the run itself: quotas reached, bursts as the seeds demand, contract exit codes."""
    state = chaos.state
    plan = state.plan
    problems = list(state.problems)
    contended = state.rounds["process"] + state.rounds["connection"] + state.rounds["burst"]
    wanted = plan.process_rounds + plan.connection_rounds + plan.bursts
    if contended < wanted:
        problems.append(f"only {contended} contended runs of the {wanted} planned")
    for kind in (*FAULT_KINDS, "stall"):
        if state.faults[kind] < plan.faults_per_kind:
            problems.append(f"only {state.faults[kind]} faults of kind {kind}, wanted {plan.faults_per_kind}")
    pooled_rounds = plan.share(plan.connection_rounds, plan.connection_lanes) * plan.pooled_lanes
    if state.rounds["pooled"] < pooled_rounds:
        problems.append(
            f"only {state.rounds['pooled']} rounds through the pooler of the {pooled_rounds} planned"
        )
    pooled_stalls = plan.share(plan.faults_per_kind, plan.connection_lanes) * plan.pooled_lanes
    if state.faults["pooled_stall"] < pooled_stalls:
        problems.append(
            f"only {state.faults['pooled_stall']} stalls through the pooler, wanted {pooled_stalls}"
        )
    if chaos.pooler_figures.get("leaks"):
        problems.append(f"server sessions behind the pooler hold state: {chaos.pooler_figures['leaks']}")
    limit = plan.loser_exit_limit_seconds
    for n, burst in enumerate(state.bursts, start=1):
        if burst.winners != 1:
            problems.append(f"burst {n}: {burst.winners} winners, wanted exactly one")
        if any(code != 75 for code in burst.loser_codes):
            problems.append(f"burst {n}: losers exited {sorted(set(burst.loser_codes))}, wanted 75")
        slow = [s for s in burst.process_loser_seconds if s > limit]
        if slow:
            problems.append(
                f"burst {n}: losers took {max(slow):.2f} s to exit (limit {limit:g} s;"
                f" load average {burst.load_average:.1f} on {os.cpu_count()} cores)"
            )
    odd = sorted(
        {
            (a.exit_code, a.reason)
            for a in state.attempts
            if a.path == "process" and a.exit_code not in (0, 69, 75, 76, -9)
        }
        - {(None, None)},
        key=str,
    )
    if odd:
        problems.append(f"process contenders exited outside the contract: {odd[:5]}")
    return problems


def render(values: dict[str, Any]) -> str:
    return json.dumps(values, indent=2, sort_keys=False, default=str)
