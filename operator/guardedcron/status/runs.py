"""One run = one Job: its outcome, read from the Job and its pod (pure).

Signals, strongest first (docs/design.md, "Run status"):
1. the keeper's termination message `lost` or exit code 76 (current or last state):
   Lost, whatever the workload did after, because the lease stopped protecting it;
2. the guard init container's exit code: 75 Skipped, any other non-zero GuardError;
   these are final as soon as the guard has exited (podFailurePolicy fails the Job
   at once), so the run is reported without waiting for the Job's condition;
3. the Job's terminal condition: Complete → Succeeded; Failed with DeadlineExceeded
   → TimedOut; Failed with PodFailurePolicy → the rule index in its message (the pod
   may be gone); any other Failed → Failed;
4. otherwise Running.
Holder, fence and slot come from the guard's termination message; no database.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from guardedcron import contract
from guardedcron.contract import AcquireReason, GuardOutcome, KeeperOutcome
from guardedcron.objects import get_path
from guardedcron.status.reports import (
    GuardReport,
    KeeperReport,
    clean_text,
    read_guard_message,
    read_keeper_message,
)
from guardedcron.status.times import epoch_minute, format_time, parse_time

REASON_MAX: Final = 512
# The end of a Lost run's reason while its workload runs on.
STILL_RUNNING: Final = "; workload still running"
# In the reason of a run skipped because its slot was already claimed (it ran somewhere).
SLOT_CLAIMED_WORDS: Final = "already ran under"
_LONG_AGO: Final = datetime.min.replace(tzinfo=UTC)  # sorts records without any time last
# The Job controller's message for a FailJob rule (pkg/controller/job/pod_failure_policy.go).
_RULE_MESSAGE = re.compile(r"failed with exit code (-?\d+) matching FailJob rule at index (\d+)")


class Outcome(StrEnum):
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SKIPPED = "Skipped"
    TIMED_OUT = "TimedOut"
    LOST = "Lost"
    GUARD_ERROR = "GuardError"


_OUTCOME_VALUES: Final = frozenset(o.value for o in Outcome)
# Outcomes in which the run's guard won the lease (so its fence was its own).
HELD_LEASE: Final = frozenset(
    {Outcome.RUNNING, Outcome.SUCCEEDED, Outcome.FAILED, Outcome.TIMED_OUT, Outcome.LOST})


@dataclass(frozen=True)
class RunRecord:
    """One run as status shows it. For Skipped, `holder`/`fence` name the winner.

    `started_at` is when the workload could begin (the guard won the lease) or, for a
    run that never won it, when its Job started. `finished_at` is set once the run is
    over and then never changes: a record with it is final.
    """

    job: str
    outcome: Outcome
    reason: str
    holder: str | None = None
    fence: int | None = None
    slot: int | None = None  # the scheduled minute (minutes since the epoch)
    manual: bool = False
    scheduled_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def final(self) -> bool:
        return self.finished_at is not None

    @property
    def held_lease(self) -> bool:
        """The run's own guard won the lease with `fence` (so its workload may have run)."""
        return self.outcome in HELD_LEASE and self.fence is not None and self.started_at is not None

    @property
    def settles_slot(self) -> bool:
        """A run of this slot started somewhere, or may still: this one is going or held the
        lease, or its guard found the slot claimed (it ran in another cluster). A skip for a
        lease held by a run of another slot, by a manual run or by a dead pod settles
        nothing: the slot is missed (docs/design.md, "Run-or-report")."""
        if not self.final or self.outcome in HELD_LEASE:
            return True
        return self.outcome is Outcome.SKIPPED and SLOT_CLAIMED_WORDS in self.reason

    def sort_key(self) -> tuple[datetime, str]:
        """Newest first when sorted in reverse: by the scheduled slot, else the start."""
        when = self.scheduled_at or self.started_at or self.finished_at or _LONG_AGO
        return when, self.job

    def to_status(self) -> dict[str, Any]:
        """The `status.lastRun` / `status.recentRuns[]` item; unset fields are left out."""
        item: dict[str, Any] = {
            "job": self.job,
            "outcome": str(self.outcome),
            "reason": self.reason,
            "manual": self.manual,
        }
        if self.holder is not None:
            item["holder"] = self.holder
        if self.fence is not None:
            item["fence"] = self.fence
        if self.slot is not None:
            item["slot"] = self.slot
        if self.started_at is not None:
            item["startedAt"] = format_time(self.started_at)
        if self.finished_at is not None:
            item["finishedAt"] = format_time(self.finished_at)
        return item

    @classmethod
    def from_status(cls, item: object) -> RunRecord | None:
        """A record written by an earlier pass; None when it is not one (edited by hand)."""
        if not isinstance(item, Mapping):
            return None
        job = clean_text(item.get("job"), contract.NAME_MAX)
        value = item.get("outcome")
        if job is None or not isinstance(value, str) or value not in _OUTCOME_VALUES:
            return None
        outcome = Outcome(value)
        slot = _int_or_none(item.get("slot"))
        manual = item.get("manual") is True
        return cls(
            job=job,
            outcome=outcome,
            reason=clean_text(item.get("reason"), REASON_MAX) or "",
            holder=clean_text(item.get("holder")),
            fence=_int_or_none(item.get("fence")),
            slot=slot,
            manual=manual,
            scheduled_at=None if manual or slot is None else slot_start(slot),
            started_at=parse_time(item.get("startedAt")),
            finished_at=parse_time(item.get("finishedAt")),
        )


def classify_run(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> RunRecord:
    """The run a Job stands for, from the Job and the pods it owns (any order)."""
    name = str(get_path(job, "metadata", "name") or "")
    manual = is_manual(job)
    scheduled_at = None if manual else scheduled_time(job)
    slot = None if manual else scheduled_slot(job)
    if scheduled_at is None and slot is not None:
        scheduled_at = slot_start(slot)

    pod = _pick_pod(pods)
    guard = _container_status(pod, contract.GUARD_CONTAINER, init=True)
    guard_end = _terminated(guard)
    keeper_lost = _keeper_loss(pod)
    terminal = _terminal_condition(job)
    job_started = parse_time(get_path(job, "status", "startTime"))
    job_finished = _finish_time(job, terminal) if terminal is not None else None

    base = _Facts(name, manual, slot, scheduled_at, job_started, job_finished)
    if guard_end is None:
        return _without_guard_exit(base, job, terminal, pod, keeper_lost)
    exit_code = _int_or_none(guard_end.get("exitCode"))
    report = read_guard_message(guard_end.get("message"))
    guard_finished = parse_time(guard_end.get("finishedAt"))
    if exit_code == contract.EXIT_NOT_ACQUIRED:
        return _skipped(base, report, guard_finished)
    if exit_code != contract.EXIT_OK:
        return _guard_error(base, report, exit_code, guard_end, guard_finished)
    return _after_acquiring(base, report, job, terminal, pod, keeper_lost, guard_finished)


def is_manual(job: Mapping[str, Any]) -> bool:
    """Made by hand (kubectl create job --from, guardedcron trigger), not by the schedule.

    The CronJob controller marks its Jobs with the scheduled-timestamp annotation; both
    ways of making one by hand mark theirs too. A Job with neither mark counts as
    scheduled only if its name is `<cronjob>-<minutes>`, as the guard reads it.
    """
    annotations = _mapping(get_path(job, "metadata", "annotations"))
    if contract.ANNOTATION_MANUAL in annotations:
        return True
    if annotations.get(contract.ANNOTATION_KUBECTL_INSTANTIATE) == contract.INSTANTIATE_MANUAL:
        return True
    if contract.ANNOTATION_SCHEDULED_TIMESTAMP in annotations:
        return False
    return _slot_from_name(job) is None


def scheduled_time(job: Mapping[str, Any]) -> datetime | None:
    """The slot the CronJob controller created the Job for (its annotation, any offset)."""
    annotations = _mapping(get_path(job, "metadata", "annotations"))
    return parse_time(annotations.get(contract.ANNOTATION_SCHEDULED_TIMESTAMP))


def scheduled_slot(job: Mapping[str, Any]) -> int | None:
    """The slot minute: from the name `<cronjob>-<minutes>`, else from the annotation.

    The guard claims the slot it reads from the name, so the name wins when both exist.
    """
    from_name = _slot_from_name(job)
    if from_name is not None:
        return from_name
    at = scheduled_time(job)
    return epoch_minute(at) if at is not None else None


def slot_start(slot: int) -> datetime | None:
    """The instant a slot (minutes since the epoch) begins; None past what a datetime holds
    (year 9999): such a name still has the scheduled shape, but no time to show."""
    try:
        return datetime.fromtimestamp(slot * 60, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _slot_from_name(job: Mapping[str, Any]) -> int | None:
    """The slot the guard claims for this Job (contract.slot_from_job_name). A minute
    past a bigint gives none: the guard refuses such a name before it takes anything."""
    name = str(get_path(job, "metadata", "name") or "")
    for cronjob in _cronjob_names(job):
        try:
            slot = contract.slot_from_job_name(name, cronjob)
        except contract.SlotOutOfRange:
            return None
        if slot is not None:
            return slot
    return None


# --- the cases ------------------------------------------------------------------

@dataclass(frozen=True)
class _Facts:
    job: str
    manual: bool
    slot: int | None
    scheduled_at: datetime | None
    job_started: datetime | None
    job_finished: datetime | None

    def record(self, outcome: Outcome, reason: str, **fields: Any) -> RunRecord:
        values: dict[str, Any] = {
            "job": self.job, "outcome": outcome, "reason": bounded_reason(reason), "manual": self.manual,
            "slot": self.slot, "scheduled_at": self.scheduled_at, "started_at": self.job_started,
        }
        values.update(fields)
        return RunRecord(**values)


def _skipped(base: _Facts, report: GuardReport, guard_finished: datetime | None) -> RunRecord:
    finished = base.job_finished or guard_finished or base.job_started
    slot = report.slot if report.slot is not None else base.slot
    if report.outcome != GuardOutcome.SKIPPED:
        why = report.problem or f"its message says {report.outcome!r}"
        return base.record(Outcome.SKIPPED, f"guard exited 75 (not acquired); {why}",
                           slot=slot, finished_at=finished)
    if report.reason == AcquireReason.SLOT_CLAIMED:
        reason = f"slot {slot} {SLOT_CLAIMED_WORDS} {report.holder or 'an unknown holder'}"
    elif report.reason == AcquireReason.ROW_BUSY:
        reason = "lease row busy with a fenced write of the previous holder"
    else:
        reason = f"lease held by {report.holder or 'an unknown holder'}"
    if report.fence is not None:
        reason += f" (fence {report.fence})"
    return base.record(Outcome.SKIPPED, reason, holder=report.holder, fence=report.fence,
                       slot=slot, finished_at=finished)


def _guard_error(base: _Facts, report: GuardReport, exit_code: int | None, guard_end: Mapping[str, Any],
                 guard_finished: datetime | None) -> RunRecord:
    finished = base.job_finished or guard_finished or base.job_started
    meaning = {
        contract.EXIT_USAGE: "bad input",
        contract.EXIT_UNAVAILABLE: "database unreachable",
        contract.EXIT_INTERNAL: "internal error",
        contract.EXIT_NOT_GRANTED: "lock not granted to the database role",
        contract.EXIT_SCHEMA: "database schema missing or outdated",
    }.get(exit_code or 0) or clean_text(guard_end.get("reason")) or "crashed"
    reason = f"guard exited {exit_code if exit_code is not None else '?'} ({meaning})"
    if report.outcome == GuardOutcome.ERROR and report.reason:
        reason += f": {report.reason}"
    return base.record(Outcome.GUARD_ERROR, reason, holder=report.holder, finished_at=finished)


def _after_acquiring(base: _Facts, report: GuardReport, job: Mapping[str, Any],
                     terminal: Mapping[str, Any] | None, pod: Mapping[str, Any] | None,
                     keeper_lost: KeeperReport | None, guard_finished: datetime | None) -> RunRecord:
    fields: dict[str, Any] = {"started_at": guard_finished or base.job_started}
    if report.outcome == GuardOutcome.ACQUIRED and report.fence is not None:
        fields |= {"holder": report.holder, "fence": report.fence}
        if report.slot is not None:
            fields["slot"] = report.slot
        won = f"fence {report.fence}"
    else:
        why = report.problem or f"its message says {report.outcome!r}"
        won = f"fence unknown: {why}"
    if keeper_lost is not None:
        return _lost(base, keeper_lost, job, terminal, pod, fields)
    if terminal is None:
        return base.record(Outcome.RUNNING, f"workload running with {won}", **fields)
    outcome, reason = _terminal_outcome(job, terminal, pod)
    return base.record(outcome, reason, finished_at=base.job_finished, **fields)


def _without_guard_exit(base: _Facts, job: Mapping[str, Any], terminal: Mapping[str, Any] | None,
                        pod: Mapping[str, Any] | None, keeper_lost: KeeperReport | None) -> RunRecord:
    if keeper_lost is not None:  # a keeper runs only after the guard won; its report stands
        return _lost(base, keeper_lost, job, terminal, pod, {})
    if terminal is None:
        waiting = "waiting for a pod" if pod is None else "guard deciding"
        return base.record(Outcome.RUNNING, waiting)
    outcome, reason = _terminal_outcome(job, terminal, pod)
    if outcome in HELD_LEASE:
        reason += ("; the pod is gone, so holder and fence are unknown" if pod is None
                   else "; the guard never finished")
    return base.record(outcome, reason, finished_at=base.job_finished)


def _lost(base: _Facts, keeper: KeeperReport, job: Mapping[str, Any], terminal: Mapping[str, Any] | None,
          pod: Mapping[str, Any] | None, fields: dict[str, Any]) -> RunRecord:
    if keeper.reason:
        reason = f"lease lost: {keeper.reason}"
    else:
        why = keeper.problem or "no reason given"
        reason = f"lease lost: keeper exited {contract.EXIT_LEASE_LOST} ({why})"
    if terminal is None:
        return base.record(Outcome.LOST, reason + STILL_RUNNING, **fields)
    outcome, result = _terminal_outcome(job, terminal, pod)
    return base.record(Outcome.LOST, f"{reason}; then {outcome}: {result}",
                       finished_at=base.job_finished, **fields)


def _terminal_outcome(job: Mapping[str, Any], terminal: Mapping[str, Any],
                      pod: Mapping[str, Any] | None) -> tuple[Outcome, str]:
    if terminal.get("type") == "Complete":
        return Outcome.SUCCEEDED, "workload completed"
    reason = str(terminal.get("reason") or "")
    message = clean_text(terminal.get("message"), REASON_MAX) or ""
    if reason == "DeadlineExceeded":
        deadline = get_path(job, "spec", "activeDeadlineSeconds")
        limit = f" ({deadline} s)" if isinstance(deadline, int) else ""
        return Outcome.TIMED_OUT, f"active deadline exceeded{limit}"
    if reason == "PodFailurePolicy":
        match = _RULE_MESSAGE.search(message)
        if match and int(match.group(2)) == contract.SKIP_RULE_INDEX:
            return Outcome.SKIPPED, f"guard exited {match.group(1)} (not acquired); the pod is gone"
        if match and int(match.group(2)) == contract.GUARD_ERROR_RULE_INDEX:
            return Outcome.GUARD_ERROR, f"guard exited {match.group(1)}; the pod is gone"
    failed = _failed_workload_container(pod) or _pod_failure(pod)
    if failed is not None:
        return Outcome.FAILED, failed
    return Outcome.FAILED, f"{reason or 'Failed'}: {message}" if message else (reason or "Job failed")


# --- reading the objects ----------------------------------------------------------

def _terminal_condition(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Job's Complete or Failed condition when True (1.31+ adds them once pods ended)."""
    for condition in _list(get_path(job, "status", "conditions")):
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return condition
    return None


def _finish_time(job: Mapping[str, Any], terminal: Mapping[str, Any]) -> datetime | None:
    # completionTime is set only for Complete; a Failed Job's end is its condition's time.
    if terminal.get("type") == "Complete":
        completed = parse_time(get_path(job, "status", "completionTime"))
        if completed is not None:
            return completed
    return (parse_time(terminal.get("lastTransitionTime"))
            or parse_time(terminal.get("lastProbeTime"))
            or parse_time(get_path(job, "status", "startTime")))


def _pick_pod(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The pod that decided the run: the newest whose guard has exited, else the newest.

    With backoffLimit 0 and podReplacementPolicy Failed a Job has one pod; a pod that
    was deleted before it ran may leave a second one behind.
    """
    ordered = sorted(
        (p for p in pods if isinstance(p, Mapping)),
        key=lambda p: (parse_time(get_path(p, "metadata", "creationTimestamp")) or _LONG_AGO,
                       str(get_path(p, "metadata", "name") or "")),
        reverse=True,
    )
    for pod in ordered:
        if _terminated(_container_status(pod, contract.GUARD_CONTAINER, init=True)) is not None:
            return pod
    return ordered[0] if ordered else None


def _container_status(pod: Mapping[str, Any] | None, name: str, *, init: bool) -> Mapping[str, Any] | None:
    if pod is None:
        return None
    key = "initContainerStatuses" if init else "containerStatuses"
    for status in _list(get_path(pod, "status", key)):
        if status.get("name") == name:
            return status
    return None


def _terminated(status: Mapping[str, Any] | None, state: str = "state") -> Mapping[str, Any] | None:
    if status is None:
        return None
    terminated = get_path(status, state, "terminated")
    return terminated if isinstance(terminated, Mapping) else None


def _keeper_loss(pod: Mapping[str, Any] | None) -> KeeperReport | None:
    """The keeper's "lost" report. A native sidecar is restarted after it exits, even under
    restartPolicy Never, so the exit may be in `lastState` with the restarted one running."""
    keeper = _container_status(pod, contract.KEEPER_CONTAINER, init=True)
    for state in ("state", "lastState"):
        ended = _terminated(keeper, state)
        if ended is None:
            continue
        report = read_keeper_message(ended.get("message"))
        exit_code = _int_or_none(ended.get("exitCode"))
        if report.outcome == KeeperOutcome.LOST or exit_code == contract.EXIT_LEASE_LOST:
            return report
    return None


def _failed_workload_container(pod: Mapping[str, Any] | None) -> str | None:
    """"container task exited 1 (Error)" for the first workload container that failed."""
    if pod is None:
        return None
    ours = (contract.GUARD_CONTAINER, contract.KEEPER_CONTAINER)
    for key in ("initContainerStatuses", "containerStatuses"):
        for status in _list(get_path(pod, "status", key)):
            ended = _terminated(status)
            code = _int_or_none(ended.get("exitCode")) if ended is not None else None
            if ended is None or status.get("name") in ours or not code:
                continue
            name = clean_text(status.get("name"), 63) or "?"
            why = clean_text(ended.get("reason"), 63)
            return f"container {name} exited {code}" + (f" ({why})" if why else "")
    return None


def _pod_failure(pod: Mapping[str, Any] | None) -> str | None:
    """"pod Evicted: The node was low on resource: memory." when the pod as a whole failed."""
    reason = clean_text(get_path(pod, "status", "reason"), 63)
    if get_path(pod, "status", "phase") != "Failed" or reason is None:
        return None
    message = clean_text(get_path(pod, "status", "message"), REASON_MAX)
    return f"pod {reason}: {message}" if message else f"pod {reason}"


def _cronjob_names(job: Mapping[str, Any]) -> list[str]:
    names = [str(ref.get("name")) for ref in _list(get_path(job, "metadata", "ownerReferences"))
             if ref.get("kind") == "CronJob" and ref.get("name")]
    label = _mapping(get_path(job, "metadata", "labels")).get(contract.LABEL_NAME)
    if isinstance(label, str) and label:
        names.append(label)
    return names


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def bounded_reason(reason: str) -> str:
    return clean_text(reason, REASON_MAX) or ""
