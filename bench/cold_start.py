"""The guard's cold start, before and after issue 10's fixes, side by side in one run.

Every guarded run waits for this (the guard is the init container). Both versions run
from this venv's Python, with the same psycopg, against the same server: "before" is the
code of `bench.common.BEFORE_COMMIT` (its own database, at its own schema version),
"after" the working tree (its database at the current schema). Runs alternate, before
then after, so a change in the machine's load hits both alike.

- winner: each run takes over the same lock after the previous lease ran out, as a
  scheduled job does. Start: the wall clock read just before the process starts; fence:
  the fence file's own modification time, written by the guard; exit: when it is reaped.
  CPU: user + system of the finished process, from the kernel's accounting (wait4).
- loser: the lock is held by someone else for a day; the guard exits 75.
- phases: the same commands under bench/guard_phases.py, which notes the CPU at each
  phase boundary and counts the cyclic garbage collector's passes.
- imports: `python -X importtime` of the losing command; each module's own time is
  charged to the nearest module above it (itself included) that is psycopg's,
  guardedcron's or argparse, else to "other" (interpreter start-up: site, encodings).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
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
PHASES_SCRIPT = Path(__file__).with_name("guard_phases.py")
IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")
# What psycopg's import pulls in from outside psycopg (with all they import), and the own
# time of its largest module.
PSYCOPG_PARTS = {
    "psycopg.errors": "psycopg.errors' own code (exception classes)",
    "asyncio": "asyncio (psycopg.errors: CancelledError)",
    "importlib.metadata": "importlib.metadata (psycopg_binary.version)",
    "ctypes.util": "ctypes.util (psycopg.pq.misc)",
    "typing_extensions": "typing_extensions (psycopg._compat)",
    "logging": "logging (psycopg)",
}


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


def phase_run(variant: Variant, arguments: list[str]) -> dict[str, float]:
    """CPU seconds per phase of one run (bench/guard_phases.py), its exit, GC passes and CPU."""
    read, write = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, str(PHASES_SCRIPT), str(write), *arguments],
        env=variant.tree.env(variant.dsn),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        pass_fds=(write,),
    )
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        report = json.loads(pipe.read())
    _, _, usage = os.wait4(proc.pid, 0)
    phases: dict[str, float] = {}
    previous = 0.0
    for name, at in report["marks"].items():
        phases[name] = at - previous
        previous = at
    total = usage.ru_utime + usage.ru_stime
    phases["exit (interpreter shutdown)"] = total - previous
    phases["total"] = total
    phases["GC passes"] = report["gc_passes"]
    phases["of which GC"] = report["gc_cpu"]
    return phases


def import_groups(stderr: str) -> dict[str, float]:
    """Milliseconds of import time per group, from `-X importtime` output (see the docstring)."""
    nodes: list[tuple[int, str, float]] = []  # (depth, module, own µs) in the order printed
    for line in stderr.splitlines():
        match = IMPORT_LINE.match(line)
        if match:
            nodes.append(((len(match[3]) - 1) // 2, match[4], int(match[1])))
    # importtime prints a module after everything it imported; walk it backwards, top down.
    groups: dict[str, float] = defaultdict(float)
    parts: dict[str, float] = defaultdict(float)
    ancestors: list[tuple[int, str]] = []  # (depth, group)
    cumulative = {m[4]: int(m[2]) for m in IMPORT_LINE.finditer(stderr)}
    for depth, module, own in reversed(nodes):
        while ancestors and ancestors[-1][0] >= depth:
            ancestors.pop()
        group = named_group(module) or (ancestors[-1][1] if ancestors else "other (site, encodings)")
        ancestors.append((depth, group))
        groups[group] += own / 1000
        if group == "psycopg (total)" and module in PSYCOPG_PARTS:
            value = own if module.startswith("psycopg") else cumulative[module]
            parts[PSYCOPG_PARTS[module]] += value / 1000
    return {**groups, **{f"  of which {label}": value for label, value in parts.items()}}


def named_group(module: str) -> str | None:
    top = module.split(".")[0]
    if top in ("psycopg", "psycopg_binary"):
        return "psycopg (total)"
    if top == "guardedcron":
        return "guardedcron modules"
    if top == "argparse":
        return "argparse (the CLI's parser)"
    return None


def import_profiles(variants: list[Variant], runs: int) -> list[dict[str, float]]:
    """Median milliseconds per import group of each variant; the variants' runs alternate."""
    samples: list[dict[str, list[float]]] = [defaultdict(list) for _ in variants]
    for _ in range(runs):
        for index, variant in enumerate(variants):
            proc = subprocess.run(
                [sys.executable, "-X", "importtime", GUARDEDCRON, *acquire_command(HELD_LOCK, "imports")],
                env=variant.tree.env(variant.dsn),
                capture_output=True,
                text=True,
                check=False,
            )
            for name, value in import_groups(proc.stderr).items():
                samples[index][name].append(value)
    return [{name: median(values) for name, values in profile.items()} for profile in samples]


def run(server: ThrowawayPostgres, before: Tree, after: Tree, *, runs: int = 30) -> list[Table]:
    variants = [
        Variant(tree, migrated_database(server, f"cold_{key}", tree))
        for key, tree in (("before", before), ("after", after))
    ]
    winners: dict[int, list[Sample]] = defaultdict(list)
    losers: dict[int, list[Sample]] = defaultdict(list)
    phases: dict[tuple[int, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
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
        for i in range(max(5, runs // 3)):
            for index, variant in enumerate(variants):
                time.sleep(LEASE * 2)
                for role, arguments in (
                    ("winner", acquire_command(LOCK, f"phase-{i}", Path(tmp) / f"p{index}-{i}")),
                    ("loser", acquire_command(HELD_LOCK, f"phase-{i}")),
                ):
                    for name, value in phase_run(variant, arguments).items():
                        phases[index, role][name].append(value)
    imports = import_profiles(variants, max(5, runs // 3))
    return [
        side_by_side(variants, winners, losers, runs),
        phase_table(variants, phases, max(5, runs // 3)),
        import_table(variants, imports, max(5, runs // 3)),
    ]


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


def phase_table(
    variants: list[Variant], phases: dict[tuple[int, str], dict[str, list[float]]], runs: int
) -> Table:
    table = Table(
        f"Where a guard run's CPU goes, by phase (median of {runs} runs; ms of CPU)",
        ["phase", "winner before", "winner after", "loser before", "loser after"],
    )
    columns = [(0, "winner"), (1, "winner"), (0, "loser"), (1, "loser")]
    for name in phases[0, "winner"]:
        cells = [median(phases[key][name]) for key in columns]
        if name == "GC passes":
            table.add(name, *(f"{value:.0f}" for value in cells))
        else:
            table.add(name, *(ms(value) for value in cells))
    table.notes.append(
        "Phases end where bench/guard_phases.py reads the CPU clock: psycopg's import starting,"
        " its end, the connection call starting and returning, main() returning; exit is the rest"
        " of the process's CPU (kernel accounting). Medians per phase do not add up to the median total."
        " Modules are charged to the phase that imports them first."
    )
    return table


def import_table(variants: list[Variant], imports: list[dict[str, float]], runs: int) -> Table:
    table = Table(
        f"Imports of a losing guard run: `python -X importtime` (median of {runs} runs; ms, wall clock)",
        ["part", "before", "after"],
    )
    names = sorted(
        set(imports[0]) | set(imports[1]), key=lambda n: (n.startswith("  "), -imports[0].get(n, 0))
    )
    for name in names:
        table.add(
            name.replace("  ", "&nbsp;&nbsp;"),
            *(f"{profile[name]:.1f}" if name in profile else "" for profile in imports),
        )
    table.notes.append(
        "Each module's own time is charged to the nearest importing module (itself included) that is"
        " psycopg's, guardedcron's or argparse; the standard library a group imports first is in that"
        " group. `-X importtime` reads the wall clock, so it includes time the process waited for a CPU."
    )
    return table
