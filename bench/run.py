"""Run the benchmarks side by side on one durable local PostgreSQL and print Markdown.

    .venv/bin/python -m bench.run                       # everything, about 10 minutes
    .venv/bin/python -m bench.run --only lease cold     # some sections
    .venv/bin/python -m bench.run --out /tmp/bench.md   # also write the Markdown to a file

Sections: lease (ours beside the peers' patterns: bench/lease_acquire.py), contention
(100 connections, 20 processes), cold (the guard's cold start, the working tree beside
the code of `--before`, taken from git), history (a year of a one-minute job).
Benchmarks print figures; nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from bench import cold_start, contention, history_scale, lease_acquire
from bench.common import BEFORE_COMMIT, durable_server, fresh_database, machine_line, trees

SECTIONS = ("lease", "contention", "cold", "history")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--out", type=Path, help="also write the Markdown here")
    parser.add_argument("--before", default=BEFORE_COMMIT, help="cold section: the commit to compare with")
    parser.add_argument("--runs", type=int, default=30, help="cold section: runs of each version")
    args = parser.parse_args()
    out: list[str] = []

    def emit(text: str) -> None:
        print(text, flush=True)
        out.append(text)

    with durable_server() as server:
        emit(f"Machine: {machine_line(server)}\n")
        emit(f"Command: `.venv/bin/python -m bench.run {shlex.join(sys.argv[1:])}`\n")
        if "lease" in args.only:
            for table in lease_acquire.run(server):
                emit(table.markdown())
        if "contention" in args.only:
            for table in contention.run(fresh_database(server, "contention")):
                emit(table.markdown())
        if "cold" in args.only:
            with trees(args.before) as (before, after):
                for table in cold_start.run(server, before, after, runs=args.runs):
                    emit(table.markdown())
        if "history" in args.only:
            tables, plans = history_scale.run(fresh_database(server, "history"))
            for table in tables:
                emit(table.markdown())
            for name, plan in plans.items():
                summary = f"<summary>EXPLAIN (ANALYZE, BUFFERS): {name}</summary>"
                emit(f"<details>{summary}\n\n```\n{plan}\n```\n</details>\n")
    if args.out is not None:
        args.out.write_text("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
