"""Whether records re-made after a flood give jemalloc's slabs back: the operator's case.

    .venv/bin/python -m bench.slab_compaction [--objects 3000000] [--keep-every 10]

After a restart over 10,000 GuardedCronJobs the operator's 64-byte size class holds 22 MiB
of live regions in 143 MiB of slabs (docs/benchmarks.md, "memory, seventh round"): its
long-lived records were made during the listing's flood of short-lived objects of the same
size, and each keeps its page. This models that in a fresh interpreter on the chart's
allocator (jemalloc, `operator_memory.ALLOCATOR_ENV`): OBJECTS two-tuples (64 bytes each
with their gc header), every KEEP_EVERY-th kept, the rest freed; then the kept ones
re-made one by one (a new tuple each, the old one dropped), all of them or only half.
Printed after each step, once every arena is purged: MiB of the 64-byte class's live
regions, MiB of the slabs holding them, and the process's RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import ctypes, gc, json, sys
from bench.heap_probe import jemalloc_bins, jemalloc_stats, rss_kib
from guardedcron.cli.operator_memory import JEMALLOC_PURGE_ALL

mallctl = getattr(ctypes.CDLL(None), "mallctl", None)
if mallctl is None:
    sys.exit("jemalloc did not load")
mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
objects, keep_every, share = {objects}, {keep_every}, {share}

def step(name):
    mallctl(JEMALLOC_PURGE_ALL, None, None, None, 0)
    jemalloc_stats(mallctl)  # refreshes the statistics jemalloc_bins reads
    bin64 = next(b for b in jemalloc_bins(mallctl) if b["size"] == 64)
    print(json.dumps({{"step": name, "live_mib": round(bin64["live_kib"] / 1024, 1),
                      "slabs_mib": round(bin64["slabs_kib"] / 1024, 1),
                      "rss_mib": round(rss_kib() / 1024, 1)}}), flush=True)

gc.disable()  # no collection moves anything: only frees, made by reference counting
kept, flood = [], []
for index in range(objects):
    (kept if index % keep_every == 0 else flood).append((index, index + 1))
step("after the flood")
del flood
step("flood freed")
cut = int(len(kept) * share)
kept[:cut] = [(first, second) for first, second in kept[:cut]]
step(f"{{share:.0%}} of the kept records re-made")
"""


def run(objects: int, keep_every: int, share: float) -> list[dict[str, object]]:
    from guardedcron.cli.operator_memory import ALLOCATOR_ENV

    env = {**os.environ, **ALLOCATOR_ENV,
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "operator")])}
    code = CHILD.format(objects=objects, keep_every=keep_every, share=share)
    done = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                          capture_output=True, text=True)
    return [json.loads(line) for line in done.stdout.splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=3_000_000)
    parser.add_argument("--keep-every", type=int, default=10)
    options = parser.parse_args()
    for share in (1.0, 0.5):
        for result in run(options.objects, options.keep_every, share):
            print(json.dumps(result))


if __name__ == "__main__":
    main()
