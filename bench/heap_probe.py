"""Run `guardedcron` with tracemalloc on, and dump the heap when sent SIGUSR2.

bench/operator_scale.py starts the operator through this with `--heap DIR`, so the
operator's own process tells what holds its memory. Each SIGUSR2 writes, into DIR:
- `<n>.snap` (FRAMES > 0): a tracemalloc snapshot (`tracemalloc.Snapshot.load`), traces of
  FRAMES frames, to compare by traceback (`bench/heap_report.py`);
- `<n>.census.json`: gc-tracked objects by type (count and shallow bytes: strings and
  bytes are not tracked, the containers holding them are), the bytes tracemalloc
  traces, and the process's RSS just before the dump;
- `<n>.pymalloc.txt`: `sys._debugmallocstats()`, pymalloc's arenas and free pools.

Usage: python bench/heap_probe.py DIR FRAMES operator --standalone
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from types import FrameType


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def pymalloc_stats(path: Path) -> None:
    """Python's allocator's own account (arenas in use, free pools), written to stderr by
    the interpreter: fd 2 goes to `path` meanwhile."""
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("w") as out:
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def dump(directory: Path, number: int) -> None:
    rss = rss_kib()
    pymalloc_stats(directory / f"{number}.pymalloc.txt")
    if tracemalloc.is_tracing():
        tracemalloc.take_snapshot().dump(str(directory / f"{number}.snap"))
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for obj in gc.get_objects():
        name = f"{type(obj).__module__}.{type(obj).__qualname__}"
        counts[name] += 1
        sizes[name] += sys.getsizeof(obj)
    traced, peak = tracemalloc.get_traced_memory()
    (directory / f"{number}.census.json").write_text(json.dumps({
        "rss_kib": rss, "traced_bytes": traced, "traced_peak_bytes": peak,
        "gc_tracked_shallow_bytes": sum(sizes.values()),
        "by_count": dict(counts.most_common(40)),
        "by_shallow_bytes": dict(sizes.most_common(40))}, indent=1))


def main() -> int:
    directory, frames, *argv = sys.argv[1:]
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    if int(frames) > 0:  # 0: the census alone, at full speed
        tracemalloc.start(int(frames))
    dumps = iter(range(1, 1000))

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        number = next(dumps)
        dump(out, number)
        (out / f"{number}.done").touch()  # the snapshot is whole: the benchmark may read it

    signal.signal(signal.SIGUSR2, on_signal)
    from guardedcron.cli.main import main as guardedcron

    return guardedcron(argv)


if __name__ == "__main__":
    raise SystemExit(main())
