"""The guard's cold start: from starting the process to the fence file on disk.

Every guarded run waits for this (it is the init container). Each of the runs takes over
the same lock after its previous lease ran out, as a scheduled job does. The start is the
wall clock read just before the process is started; the end is the fence file's own
modification time, written by the guard, so the figure does not include the time the
parent takes to notice.

Then where the time goes: `-X importtime` of the same command, summed over runs, split
into the database driver (psycopg, with its largest parts), guardedcron's modules, and
the rest (interpreter start, standard library).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from tests.support import GUARDEDCRON

from bench.common import Table, median, ms, percentile

LOCK = "cold-start"
LEASE = 0.05
IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")
# The parts of psycopg's import worth naming: what they pull in, and through which module.
PSYCOPG_PARTS = {
    "asyncio": "asyncio (for psycopg.errors' CancelledError)",
    "importlib.metadata": "importlib.metadata (psycopg_binary.version)",
    "ctypes.util": "ctypes.util (psycopg.pq.misc)",
    "typing_extensions": "typing_extensions (psycopg._compat)",
    "logging": "logging",
}


def acquire_command(holder: str, out: Path) -> list[str]:
    return [
        GUARDEDCRON,
        "acquire",
        "--lock",
        LOCK,
        "--holder",
        holder,
        "--lease-seconds",
        str(LEASE),
        "--out",
        str(out),
    ]


def one_run(env: dict[str, str], holder: str, out: Path) -> tuple[float, float, float, int]:
    """(start → fence file, start → exit, CPU seconds, exit code)."""
    started_ns = time.time_ns()
    started = time.perf_counter()
    proc = subprocess.Popen(acquire_command(holder, out), env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    ended = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    fence = out / "fence"
    to_fence = (fence.stat().st_mtime_ns - started_ns) / 1e9 if fence.exists() else float("nan")
    return to_fence, ended, usage.ru_utime + usage.ru_stime, proc.returncode


def import_profile(env: dict[str, str], runs: int = 5) -> dict[str, float]:
    """Median milliseconds of import time per part of the acquire command."""
    totals: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            time.sleep(LEASE * 2)
            proc = subprocess.run(
                [
                    sys.executable,
                    "-X",
                    "importtime",
                    GUARDEDCRON,
                    *acquire_command(f"imp{i}", Path(tmp) / str(i))[1:],
                ],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            parts = split_import_times(proc.stderr)
            for name, value in parts.items():
                totals[name].append(value)
    return {name: median(values) for name, values in totals.items()}


def split_import_times(stderr: str) -> dict[str, float]:
    parts: dict[str, float] = defaultdict(float)
    for line in stderr.splitlines():
        match = IMPORT_LINE.match(line)
        if not match:
            continue
        cumulative, indent, module = int(match[2]), len(match[3]), match[4]
        if indent == 1:  # a top-level import: everything is counted once, here
            top = module.split(".")[0]
            key = {"psycopg": "psycopg (total)", "guardedcron": "guardedcron modules"}.get(
                top, "other modules"
            )
            parts[key] += cumulative / 1000
        for name, label in PSYCOPG_PARTS.items():
            if module == name:
                parts[f"  of which {label}"] += cumulative / 1000
    return dict(parts)


def run(dsn: str, *, runs: int = 30) -> list[Table]:
    env = {**os.environ, "GUARDEDCRON_DSN": dsn}
    fence_times, exit_times, cpu, codes = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            time.sleep(LEASE * 2)  # the previous run's lease has run out: a takeover, as on a schedule
            to_fence, ended, used, code = one_run(env, f"run-{i}", Path(tmp) / f"run-{i}")
            fence_times.append(to_fence)
            exit_times.append(ended)
            cpu.append(used)
            codes.append(code)
    table = Table(
        f"Guard cold start, {runs} runs of `guardedcron acquire --out DIR`",
        ["measure", "p50 ms", "p99 ms", "min ms"],
    )
    to_fence = ("process start → fence file written", fence_times)
    table.add(to_fence[0], ms(median(to_fence[1])), ms(percentile(to_fence[1], 0.99)), ms(min(to_fence[1])))
    table.add(
        "process start → exit", ms(median(exit_times)), ms(percentile(exit_times, 0.99)), ms(min(exit_times))
    )
    table.add("CPU (user + system)", ms(median(cpu)), ms(percentile(cpu, 0.99)), ms(min(cpu)))
    table.notes.append(
        f"Exit codes: {sorted(set(codes))} (0: acquired). Target: p50 ≤ 250 ms to the fence file."
    )
    profile = import_profile(env)
    imports = Table(
        "Where the cold start goes: `python -X importtime` of the same command (median of 5)", ["part", "ms"]
    )
    for name in sorted(profile, key=lambda n: (n.startswith("  "), -profile[n])):
        imports.add(name.replace("  ", "&nbsp;&nbsp;"), f"{profile[name]:.1f}")
    return [table, imports]
