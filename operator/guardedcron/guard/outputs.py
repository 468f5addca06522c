"""What the guard leaves behind for the workload and for Kubernetes.

- `<out>/fence`: the fencing token alone, for shell scripts.
- `<out>/lease.json`: lock, holder, fence, slot, locked_until.
- the termination message (`/dev/termination-log`): a short JSON summary that the
  operator reads from the pod's status, so it needs no database access.
Files are written to a temporary name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from guardedcron.contract import (
    ENV_TERMINATION_LOG,
    FENCE_FILE,
    LEASE_FILE,
    LOST_FILE,
    TERMINATION_LOG,
    TERMINATION_MESSAGE_MAX,
)


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_lease_files(out_dir: Path, lease: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(out_dir / LEASE_FILE, json.dumps(lease, sort_keys=True) + "\n")
    # The fence file last: its presence means both files are complete.
    write_atomically(out_dir / FENCE_FILE, f"{lease['fence']}\n")


def write_lost_marker(out_dir: Path, details: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(out_dir / LOST_FILE, json.dumps(details, sort_keys=True) + "\n")


def termination_log_path() -> Path:
    return Path(os.environ.get(ENV_TERMINATION_LOG) or TERMINATION_LOG)


def write_termination_message(summary: dict[str, Any]) -> None:
    """Best effort: only where Kubernetes gave us a termination-log file."""
    path = termination_log_path()
    if not path.exists():
        return
    text = json.dumps(summary, sort_keys=True, separators=(",", ":"))
    if len(text.encode()) > TERMINATION_MESSAGE_MAX:
        summary = {k: v for k, v in summary.items() if k != "reason"}
        text = json.dumps(summary, sort_keys=True, separators=(",", ":"))
    # A missing or read-only termination log must not fail the run.
    with contextlib.suppress(OSError):
        path.write_text(text)
