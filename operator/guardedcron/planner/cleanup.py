"""What a pass does after its status write: stop the pods of runs that lost their lease
(`spec.lease.onLost: StopWorkload`) and remove the Jobs of skipped runs once status
records them.

Why the operator stops a lost run's pod, not the pod itself: the keeper is a native
sidecar and cannot stop the main container (the kubelet restarts a sidecar that exits,
even under restartPolicy Never); a shared process namespace would let it signal the
workload only as the same user or with CAP_KILL, which the restricted Pod Security
Standard forbids. Deleting the pod goes through the kubelet's ordinary termination
(SIGTERM, then SIGKILL after the grace period), whatever the workload's image and user.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from logging import DEBUG, INFO
from typing import Any

from guardedcron.planner.actions import Action, DeleteJob, DeletePod, Log, Refused
from guardedcron.planner.once import Once
from guardedcron.spec.settings import ENV_STOP_WORKLOAD
from guardedcron.status import EventReason, RunEvent
from guardedcron.status.lease_loss import StopOrder
from guardedcron.status.skips import SkippedJob

NOT_ALLOWED = ("this operator may not delete pods: enable it with the chart value "
               f"stopWorkload.enabled=true ({ENV_STOP_WORKLOAD}=true), which grants "
               "`delete` on pods")


def stop_lost_workloads(orders: Sequence[StopOrder], *, namespace: str, once: Once,
                        allowed: bool) -> Generator[Action, Any, list[RunEvent]]:
    """Delete the pods status/ says to stop (`StatusChange.stop`: still-running pods of
    Lost runs, when the spec asks for it); the Events to post (one per pod stopped or
    not stoppable)."""
    events: list[RunEvent] = []
    for order in orders:
        key = f"stop\n{order.pod}"
        if not (yield from once.first_time(key)):
            continue  # asked already; the pod's next event shows it terminating
        what = f"run {order.job} lost its lease ({order.reason})"
        if not allowed:
            events.append(RunEvent(EventReason.STOP_WORKLOAD_FAILED,
                                   f"{what} and pod {order.pod} keeps running: {NOT_ALLOWED}",
                                   subject=order.job))
            continue
        result = yield DeletePod(namespace, order.pod, order.pod_uid)
        if isinstance(result, Refused):
            if result.code == 404:
                continue  # gone already
            if result.transient:
                yield from once.release(key)  # try again on the next pass
            if result.code is None:
                yield Log(INFO, f"Could not delete pod {order.pod} of run {order.job}: {result.error}")
                continue
            events.append(RunEvent(EventReason.STOP_WORKLOAD_FAILED,
                                   f"{what}; deleting pod {order.pod} failed: {result.error}",
                                   subject=order.job))
            continue
        yield Log(INFO, f"Deleted pod {order.pod}: {what}.")
        events.append(RunEvent(EventReason.WORKLOAD_STOPPED,
                               f"{what}; deleted pod {order.pod} (onLost: StopWorkload): the "
                               "workload gets SIGTERM, then SIGKILL after the pod's grace period",
                               subject=order.pod))
    return events


def remove_skipped_jobs(removals: Sequence[SkippedJob], *, namespace: str,
                        once: Once) -> Generator[Action, Any, list[RunEvent]]:
    """Delete each Job (that instance only, its pods in the background); the Events to
    post: one per Job the API server refuses to delete for good."""
    events: list[RunEvent] = []
    for removal in removals:
        key = f"remove\n{removal.job}\n{removal.uid}"
        if not (yield from once.first_time(key)):
            continue  # asked already; the Job's deletion event ends its part
        result = yield DeleteJob(namespace, removal.job, removal.uid)
        if isinstance(result, Refused):
            if result.code in (404, 409):
                continue  # gone already, or the name is a newer Job's
            if result.transient:
                yield from once.release(key)  # try again on the next pass
                if result.code is None:
                    yield Log(INFO, f"Could not remove Job {removal.job} of a skipped run: {result.error}")
                continue
            events.append(RunEvent(
                EventReason.SKIPPED_JOB_KEPT,
                f"run {removal.job} was skipped and is recorded in status, but its Job stays "
                f"Failed (generic Job alerts count it): deleting it failed: {result.error}",
                subject=removal.job))
            continue
        yield Log(DEBUG, f"Removed Job {removal.job}: its run was skipped and status records it.")
    return events
