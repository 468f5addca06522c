"""What the guard leaves behind for the workload and for Kubernetes.

- `<out>/fence`: the fencing token alone, for shell scripts.
- `<out>/lease.json`: lock, holder, fence, slot, locked_until, run_id, and the run
  context (`RunContext`): run_kind, manual, scheduled_time, scheduled_time_utc, time_zone.
- `<out>/keeper-ready` (the keeper): its SIGTERM handler is in place.
- `<out>/lost` (the keeper): the lease was lost.
- the termination message (`/dev/termination-log`): a short JSON summary that the
  operator reads from the pod's status, so it needs no database access.
Files are written to a temporary name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Any

from guardedcron.contract import (
    ENV_TERMINATION_LOG,
    FENCE_FILE,
    KEEPER_READY_FILE,
    KEY_FENCE,
    KEY_MANUAL,
    KEY_OUTCOME,
    KEY_REASON,
    KEY_RUN_KIND,
    KEY_SCHEDULED_TIME,
    KEY_SCHEDULED_TIME_UTC,
    KEY_TIME_ZONE,
    KEY_TRUNCATED,
    LEASE_FILE,
    LOST_FILE,
    RUN_KIND_MANUAL,
    RUN_KIND_SCHEDULED,
    TERMINATION_LOG,
    TERMINATION_MESSAGE_MAX,
    GuardOutcome,
)
from guardedcron.guard.redaction import redact


@dataclass(frozen=True)
class RunContext:
    """What a run is, for the slot it claims and for the workload (docs/design.md, "Run
    context"). `scheduled_slot` is the Job's own minute (None for a manual run); `zone` is
    the job's time zone when the guard was told it (`time_zone` is its name)."""

    scheduled_slot: int | None
    time_zone: str | None
    zone: tzinfo | None
    once_per_wall_minute: bool  # spec.dstPolicy.repeatedTime: Once
    run_kind: str | None  # catch-up or backfill when the operator says so

    @property
    def claimed_slot(self) -> int | None:
        """The slot claimed in the database: with repeatedTime Once, the first showing of
        the wall-clock minute, so its second showing finds it claimed in any cluster."""
        if self.scheduled_slot is None or not self.once_per_wall_minute or self.zone is None:
            return self.scheduled_slot
        # Imported here: the schedule package costs every guard's start-up otherwise.
        from guardedcron.schedule.dst import wall_clock_slot

        return wall_clock_slot(self.scheduled_slot, self.zone)

    def fields(self) -> dict[str, Any]:
        """The run context's keys of lease.json."""
        kind = self.run_kind or (RUN_KIND_MANUAL if self.scheduled_slot is None
                                 else RUN_KIND_SCHEDULED)
        when = (datetime.fromtimestamp(self.scheduled_slot * 60, UTC)  # a slot is a minute
                if self.scheduled_slot is not None else None)
        return {
            KEY_RUN_KIND: kind,
            KEY_MANUAL: kind == RUN_KIND_MANUAL,
            KEY_SCHEDULED_TIME_UTC: _rfc3339(when, UTC) if when is not None else None,
            KEY_SCHEDULED_TIME: (_rfc3339(when, self.zone)
                                 if when is not None and self.zone is not None else None),
            KEY_TIME_ZONE: self.time_zone,
        }


def _rfc3339(when: datetime, zone: tzinfo) -> str:
    text = when.astimezone(zone).isoformat()
    return text.replace("+00:00", "Z") if zone is UTC else text


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_lease_files(out_dir: Path, lease: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(out_dir / LEASE_FILE, json.dumps(lease, sort_keys=True) + "\n")
    # The fence file last: its presence means both files are complete.
    write_atomically(out_dir / FENCE_FILE, f"{lease[KEY_FENCE]}\n")


def write_lost_marker(out_dir: Path, details: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(out_dir / LOST_FILE, json.dumps(details, sort_keys=True) + "\n")


def write_keeper_ready(out_dir: Path) -> None:
    """The keeper's startupProbe reads this: from now on SIGTERM releases the lease."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(out_dir / KEEPER_READY_FILE, f"{os.getpid()}\n")


def termination_log_path() -> Path:
    return Path(os.environ.get(ENV_TERMINATION_LOG) or TERMINATION_LOG)


def write_termination_message(summary: dict[str, Any]) -> None:
    """Best effort: only where Kubernetes gave us a termination-log file."""
    path = termination_log_path()
    if not path.exists():
        return
    text = termination_message(summary)
    # A missing or read-only termination log must not fail the run.
    with contextlib.suppress(OSError):
        path.write_text(text)


# Each step keeps less of a summary that is too long: the reason first (it can be
# rebuilt from the run history), then long strings (a lock name may have 253 characters,
# each up to 12 bytes once escaped), and at last every string but the outcome.
_STRING_LIMITS = (None, None, 256, 32, 0)


def termination_message(summary: dict[str, Any]) -> str:
    """Compact JSON of at most TERMINATION_MESSAGE_MAX bytes (Kubernetes keeps no more),
    credentials hidden, whatever the summary holds."""
    for step, limit in enumerate(_STRING_LIMITS):
        kept = {
            key: _shortened(key, value, limit)
            for key, value in summary.items()
            if not (step > 0 and key == KEY_REASON)
        }
        text = json.dumps(kept, sort_keys=True, separators=(",", ":"))
        if len(text.encode()) <= TERMINATION_MESSAGE_MAX:
            return text
    outcome = str(summary.get(KEY_OUTCOME, GuardOutcome.ERROR))[:32]
    return json.dumps({KEY_OUTCOME: outcome, KEY_TRUNCATED: True})


def _shortened(key: str, value: Any, limit: int | None) -> Any:
    if not isinstance(value, str):
        return value if isinstance(value, int | float | bool) or value is None else str(value)[:64]
    value = redact(value)
    if limit is None or len(value) <= limit or key == KEY_OUTCOME:
        return value
    return value[:limit] + "..." if limit else ""
