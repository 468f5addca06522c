"""The guard's cold start: a commit's code and the working tree's, side by side in one run.

Every guarded run waits for this (the guard is the init container). Both versions run
from this venv's Python, with the same psycopg, against the same server: "before" is the
code of `--before` (its own database, at its own schema version), "after" the working
tree (its database at the current schema). Runs alternate, before then after, so a
change in the machine's load hits both alike.

- winner: each run takes over the same lock after the previous lease ran out, as a
  scheduled job does. Start: the wall clock read just before the process starts; fence:
  the fence file's own modification time, written by the guard; exit: when it is reaped.
  CPU: user + system of the finished process, from the kernel's accounting (wait4).
- loser: the lock is held by someone else for a day; the guard exits 75.

Where the time goes inside a run: `python -X importtime` of the same command (psycopg's
import is most of it).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tests.support import GUARDEDCRON

from bench.common import Table, Tree, median, migrated_database, ms, percentile
from guardedcron_devenv.postgres import ThrowawayPostgres

LOCK = "cold-start"
HELD_LOCK = "cold-held"
LEASE = 0.1  # the shortest lease the contract allows (contract.MIN_LEASE_SECONDS)


@dataclass(frozen=True)
class Variant:
    tree: Tree
    dsn: str


@dataclass(frozen=True)
class Sample:
    to_fence: float  # NaN for a loser
    to_exit: float
    cpu: float
    code: int


def acquire_command(lock: str, holder: str, out: Path | None = None, lease: float = LEASE) -> list[str]:
    command = ["acquire", "--lock", lock, "--holder", holder, "--lease-seconds", str(lease)]
    return command + (["--out", str(out)] if out is not None else [])


def one_run(variant: Variant, arguments: list[str], out: Path | None = None) -> Sample:
    started_ns = time.time_ns()
    started = time.perf_counter()
    proc = subprocess.Popen(
        [GUARDEDCRON, *arguments],
        env=variant.tree.env(variant.dsn),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    ended = time.perf_counter() - started
    fence = out / "fence" if out is not None else None
    to_fence = (fence.stat().st_mtime_ns - started_ns) / 1e9 if fence and fence.exists() else float("nan")
    return Sample(to_fence, ended, usage.ru_utime + usage.ru_stime, os.waitstatus_to_exitcode(status))


def run(server: ThrowawayPostgres, before: Tree, after: Tree, *, runs: int = 30) -> list[Table]:
    variants = [
        Variant(tree, migrated_database(server, f"cold_{key}", tree))
        for key, tree in (("before", before), ("after", after))
    ]
    winners: dict[int, list[Sample]] = defaultdict(list)
    losers: dict[int, list[Sample]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for variant in variants:
            held = one_run(variant, acquire_command(HELD_LOCK, "holder", lease=86400))
            assert held.code == 0, f"{variant.tree.label}: could not take {HELD_LOCK} (exit {held.code})"
        for i in range(runs):
            for index, variant in enumerate(variants):
                time.sleep(LEASE * 2)  # the previous run's lease has run out: a takeover, as on a schedule
                out = Path(tmp) / f"{index}-{i}"
                winners[index].append(one_run(variant, acquire_command(LOCK, f"run-{i}", out), out))
                losers[index].append(one_run(variant, acquire_command(HELD_LOCK, f"loser-{i}")))
    return [side_by_side(variants, winners, losers, runs)]


def side_by_side(
    variants: list[Variant], winners: dict[int, list[Sample]], losers: dict[int, list[Sample]], runs: int
) -> Table:
    before, after = (v.tree.label for v in variants)
    table = Table(
        f"Guard cold start, {before} vs {after}: {runs} runs of each, alternating",
        [
            "measure",
            "before p50 ms",
            "after p50 ms",
            "after ÷ before",
            "before min ms",
            "after min ms",
            "after p99 ms",
        ],
    )

    def row(name: str, values: list[list[float]]) -> None:
        old, new = values
        table.add(
            name,
            ms(median(old)),
            ms(median(new)),
            f"{median(new) / median(old):.2f}",
            ms(min(old)),
            ms(min(new)),
            ms(percentile(new, 0.99)),
        )

    row("winner: process start → fence file written", [[s.to_fence for s in winners[i]] for i in (0, 1)])
    row("winner: process start → exit", [[s.to_exit for s in winners[i]] for i in (0, 1)])
    row("winner: CPU (user + system)", [[s.cpu for s in winners[i]] for i in (0, 1)])
    row("loser: process start → exit (75)", [[s.to_exit for s in losers[i]] for i in (0, 1)])
    row("loser: CPU (user + system)", [[s.cpu for s in losers[i]] for i in (0, 1)])
    codes = {
        v.tree.label: (sorted({s.code for s in winners[i]}), sorted({s.code for s in losers[i]}))
        for i, v in enumerate(variants)
    }
    table.notes.append(
        f"Exit codes (winner, loser): {codes}. Lease {LEASE:g} s, so each winner takes over from the"
        f" previous run. Load average at the end: {os.getloadavg()[0]:.1f}."
    )
    return table

