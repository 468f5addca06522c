"""Run status, pure: classification of runs, conditions, missed runs, overlaps, the
whole desired status of a GuardedCronJob and the events between two statuses."""

from guardedcron.status.compute import (
    DEGRADED_AFTER_GUARD_ERRORS,
    STATUS_KEYS,
    compute_status,
    cronjob_mismatch,
    status_changed,
    status_patch,
)
from guardedcron.status.conditions import get_condition, is_true, set_condition
from guardedcron.status.history import finished_runs
from guardedcron.status.missed import MissedRun, find_missed_run, schedule_period_seconds
from guardedcron.status.overlap import Overlap, find_overlaps
from guardedcron.status.runs import Outcome, RunRecord, classify_run
from guardedcron.status.transitions import EventReason, RunEvent, run_events

__all__ = [
    "DEGRADED_AFTER_GUARD_ERRORS",
    "STATUS_KEYS",
    "EventReason",
    "MissedRun",
    "Outcome",
    "Overlap",
    "RunEvent",
    "RunRecord",
    "classify_run",
    "compute_status",
    "cronjob_mismatch",
    "find_missed_run",
    "find_overlaps",
    "finished_runs",
    "get_condition",
    "is_true",
    "run_events",
    "schedule_period_seconds",
    "set_condition",
    "status_changed",
    "status_patch",
]
