"""`make test`: the whole suite as pytest sessions in three phases, the middle one in lanes
side by side.

Most of the e2e tier's time is spent waiting for the wall clock (cron minutes, deadlines,
DST changes), so the tiers that keep the CPU busy run beside it rather than after it:

1. `quiet`: the checks that time the guard itself (marker `quiet_machine`), alone;
2. three lanes at once: the e2e tests that wait on the clock longest; the rest of the e2e
   tier with the chaos suite; every other tier but the node tier;
3. `node`: the real node, alone again (its timings, iptables and cgroups are machine-wide).

Every test belongs to exactly one lane by construction: the `rest` lane is `tests/` minus
the paths the other lanes name, so a new tier runs there without being listed. A lane
that collects nothing fails the suite. Each lane's lines are printed as they come,
prefixed with its name; each session writes its counts and per-tier seconds to a file,
and the run ends with one table of both and the exit code of the first lane that failed.

With arguments, it is one plain pytest session with those arguments (`make test
PYTEST_ARGS=tests/guard`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

REPORT_ENV: Final = "GUARDEDCRON_SUITE_REPORT"  # where tests/conftest.py writes a session's figures
NO_TESTS_COLLECTED: Final = 5  # pytest's exit code
NOT_QUIET: Final = ("-m", "not quiet_machine")
CLOCK_BOUND: Final = ("tests/e2e/test_liveness.py", "tests/e2e/test_dst_policy.py")


@dataclass(frozen=True)
class Lane:
    name: str
    paths: tuple[str, ...]
    ignored: tuple[str, ...] = ()
    marker_args: tuple[str, ...] = NOT_QUIET

    def pytest_args(self) -> list[str]:
        # Concurrent sessions must not race on one .pytest_cache.
        return [*self.paths, *(f"--ignore={path}" for path in self.ignored), *self.marker_args,
                "-p", "no:cacheprovider"]


def phases() -> tuple[tuple[Lane, ...], ...]:
    clock = Lane("e2e-clock", CLOCK_BOUND)
    e2e = Lane("e2e", ("tests/e2e", "tests/chaos"), ignored=CLOCK_BOUND)
    node = Lane("node", ("tests/node",))
    rest = Lane("rest", ("tests",), ignored=(*e2e.paths, *node.paths))
    return (Lane("quiet", ("tests",), marker_args=("-m", "quiet_machine")),), (clock, e2e, rest), (node,)


@dataclass
class Outcome:
    lane: str
    exit_code: int
    seconds: float
    counts: dict[str, int]
    tier_seconds: dict[str, float]


def run_lanes(lanes: Sequence[Lane], repo: Path, report_dir: Path) -> list[Outcome]:
    """Start every lane at once; print their lines as they come; wait for all."""
    printing = threading.Lock()
    width = max(len(lane.name) for lane in lanes)
    relays: list[tuple[Lane, Path, _Relay]] = []
    for lane in lanes:
        report = report_dir / f"{lane.name}.json"
        process = subprocess.Popen(
            # -u: lines arrive as pytest writes them (not a child's environment change).
            [sys.executable, "-u", "-m", "pytest", *lane.pytest_args()],
            cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, REPORT_ENV: str(report)},
        )
        relay = _Relay(process, lane.name.rjust(width), printing)
        relay.start()
        relays.append((lane, report, relay))
    outcomes = []
    for lane, report, relay in relays:
        relay.join()
        outcomes.append(read_outcome(lane.name, relay.exit_code, relay.seconds, report))
    return outcomes


class _Relay(threading.Thread):
    """Prints one lane's lines with its prefix; then notes its exit code and duration."""

    def __init__(self, process: subprocess.Popen[str], prefix: str, printing: threading.Lock) -> None:
        super().__init__()
        self.process, self.prefix, self.printing = process, prefix, printing
        self.began = time.monotonic()
        self.exit_code = -1
        self.seconds = 0.0

    def run(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self.printing:
                sys.stdout.write(f"{self.prefix} | {line}")
                sys.stdout.flush()
        self.exit_code = self.process.wait()
        self.seconds = time.monotonic() - self.began


def read_outcome(lane: str, exit_code: int, seconds: float, report: Path) -> Outcome:
    try:
        figures = json.loads(report.read_text())
    except (OSError, json.JSONDecodeError):  # the session ended before its summary
        figures = {}
    return Outcome(lane, exit_code, seconds, figures.get("counts", {}), figures.get("tier_seconds", {}))


def suite_exit_code(outcomes: Sequence[Outcome]) -> int:
    """0 if every lane passed; else the first failing lane's code (no tests collected counts
    as a failure: every lane is meant to run something)."""
    return next((outcome.exit_code for outcome in outcomes if outcome.exit_code != 0), 0)


def summary(outcomes: Sequence[Outcome], wall_seconds: float) -> list[str]:
    lines = ["", "=" * 30 + " the suite, lane by lane " + "=" * 30]
    for outcome in outcomes:
        counts = _listed(outcome.counts) or "no report"
        lines.append(f"{outcome.lane:>10}: exit {outcome.exit_code}, {outcome.seconds:6.0f} s, {counts}")
    totals: dict[str, int] = {}
    tiers: dict[str, float] = {}
    for outcome in outcomes:
        for kind, number in outcome.counts.items():
            totals[kind] = totals.get(kind, 0) + number
        for tier, seconds in outcome.tier_seconds.items():
            tiers[tier] = tiers.get(tier, 0.0) + seconds
    lines.append("time per tier (set-up, call and tear-down, summed over the lanes it ran in):")
    lines += [f"{seconds:8.0f} s  {tier}" for tier, seconds in sorted(tiers.items(), key=lambda kv: -kv[1])]
    lines.append(f"all: {_listed(totals)} in {wall_seconds:.0f} s ({wall_seconds / 60:.0f} min) "
                 "of wall-clock time")
    return lines


def _listed(counts: dict[str, int]) -> str:
    return ", ".join(f"{number} {kind}" for kind, number in sorted(counts.items()))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    repo = Path.cwd()
    if args:
        return subprocess.call([sys.executable, "-m", "pytest", *args], cwd=repo)
    began = time.monotonic()
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="guardedcron-suite-") as report_dir:
        try:
            for lanes in phases():
                outcomes += run_lanes(lanes, repo, Path(report_dir))
        except KeyboardInterrupt:  # the lanes got the same SIGINT and end their sessions
            print("\ninterrupted")
            return 130
    for line in summary(outcomes, time.monotonic() - began):
        print(line)
    return suite_exit_code(outcomes)


if __name__ == "__main__":
    sys.exit(main())
