"""libfaketime for the tests that run the guard on a skewed clock: preloaded, never through
the `faketime` wrapper program.

The wrapper creates a semaphore and a shared-memory object named after its own process id
and exits when one by that name exists already. The library leaves such a pair behind
when the process it was preloaded into forks or is killed, and process ids come round
again, so the wrapper failed now and then in a long suite ("faketime: sem_open: File
exists"). `remove_leftovers` deletes the pairs whose process is gone.
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

SHARED_MEMORY = Path("/dev/shm")
LEFTOVER = re.compile(r"^(?:sem\.faketime_sem|faketime_shm)_(\d+)$")


def faketime_library() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        raise RuntimeError("libfaketime is not installed; run `bash .ci/bootstrap` (Debian package faketime)")
    return found[0]


def skewed_env(skew: str | None) -> dict[str, str]:
    """This process's environment with libfaketime preloaded, `skew` (e.g. "+1d") being its
    FAKETIME; with `skew` None, without libfaketime (the real clock)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "FAKETIME")}
    if skew is not None:
        env.update(LD_PRELOAD=faketime_library(), FAKETIME=skew)
    return env


def remove_leftovers(folder: Path = SHARED_MEMORY) -> int:
    """Delete libfaketime's semaphores and shared memory whose process has ended; how many."""
    removed = 0
    for entry in folder.iterdir() if folder.is_dir() else ():
        match = LEFTOVER.match(entry.name)
        if match is None or Path(f"/proc/{match.group(1)}").exists():
            continue
        try:
            entry.unlink()
            removed += 1
        except FileNotFoundError:  # its process or another session removed it first
            pass
    return removed
