"""Read the heap dumps of bench/heap_probe.py: what holds the operator's memory.

    .venv/bin/python bench/heap_report.py DIR/first/1.snap [--objects N] [--top 25]

Prints the bytes tracemalloc traces, grouped three ways: by the innermost frame outside
the standard library (who asked for the memory: kopf, aiohttp, guardedcron), by source
line, and the largest whole tracebacks. With --objects, bytes per object too.
"""

from __future__ import annotations

import argparse
import sysconfig
import tracemalloc
from collections import Counter
from pathlib import Path

STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve())


def owner_frame(trace: tracemalloc.Trace) -> str:
    """The innermost frame not in the standard library, as `package/file.py:line`."""
    for frame in reversed(trace.traceback):  # a Traceback runs from the oldest frame
        name = str(Path(frame.filename).resolve()) if frame.filename.startswith("/") else frame.filename
        if not name.startswith(STDLIB) and not frame.filename.startswith("<"):
            parts = Path(name).parts
            tail = "/".join(parts[-3:])
            return f"{tail}:{frame.lineno}"
    frame = trace.traceback[-1]
    return f"{Path(frame.filename).name}:{frame.lineno} (stdlib only)"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("--objects", type=int, default=0)
    parser.add_argument("--top", type=int, default=25)
    options = parser.parse_args()
    snapshot = tracemalloc.Snapshot.load(str(options.snapshot))
    traces = snapshot.traces
    total = sum(trace.size for trace in traces)
    per = f" ({total / options.objects / 1024:.1f} KiB per object)" if options.objects else ""
    print(f"traced: {total / 2**20:.1f} MiB in {len(traces)} blocks{per}\n")

    owners: Counter[str] = Counter()
    for trace in traces:
        owners[owner_frame(trace)] += trace.size
    print("by the innermost frame outside the standard library:")
    for owner, size in owners.most_common(options.top):
        print(f"  {size / 2**20:8.2f} MiB  {owner}")

    print("\nby line:")
    for stat in snapshot.statistics("lineno")[: options.top]:
        print(f"  {stat.size / 2**20:8.2f} MiB  {stat.count:8d}  {stat.traceback[0]}")

    print("\nlargest tracebacks:")
    for stat in snapshot.statistics("traceback")[: max(options.top // 3, 5)]:
        print(f"  {stat.size / 2**20:8.2f} MiB in {stat.count} blocks")
        for line in stat.traceback.format(limit=12, most_recent_first=True):
            print(f"      {line}")


if __name__ == "__main__":
    main()
