"""Run status, pure: classification of runs, conditions, missed runs, overlaps, the
whole desired status of a GuardedCronJob and what follows from writing it (Events,
metric changes, outcomes to record, pods to stop)."""

from guardedcron.status.change import (
    EXPORTED_CONDITIONS,
    STATUS_KEYS,
    FinishedRun,
    MetricChanges,
    StatusChange,
    status_changed,
    status_patch,
)
from guardedcron.status.compute import (
    DEGRADED_AFTER_GUARD_ERRORS,
    SchedulingStatus,
    compute_status,
    cronjob_mismatch,
    merge_runs,
)
from guardedcron.status.conditions import get_condition, is_true, set_condition
from guardedcron.status.deadlines import AlertDeadlines, alert_deadlines
from guardedcron.status.history import finished_runs
from guardedcron.status.missed import MissedRun, find_missed_run
from guardedcron.status.overlap import Overlap, find_overlaps
from guardedcron.status.runs import Outcome, RunRecord, classify_run
from guardedcron.status.transitions import EventReason, RunEvent, run_events

__all__ = [
    "DEGRADED_AFTER_GUARD_ERRORS",
    "EXPORTED_CONDITIONS",
    "STATUS_KEYS",
    "AlertDeadlines",
    "EventReason",
    "FinishedRun",
    "MetricChanges",
    "MissedRun",
    "Outcome",
    "Overlap",
    "RunEvent",
    "RunRecord",
    "SchedulingStatus",
    "StatusChange",
    "alert_deadlines",
    "classify_run",
    "compute_status",
    "cronjob_mismatch",
    "find_missed_run",
    "find_overlaps",
    "finished_runs",
    "get_condition",
    "is_true",
    "merge_runs",
    "run_events",
    "set_condition",
    "status_changed",
    "status_patch",
]
