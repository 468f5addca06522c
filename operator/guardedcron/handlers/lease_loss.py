"""`spec.lease.onLost: StopWorkload`: the operator deletes the pod of a run whose lease
was lost, so the workload gets SIGTERM and then, after the pod's grace period, SIGKILL.

Why the operator and not the pod: the keeper is a native sidecar and cannot stop the
main container (the kubelet restarts a sidecar that exits, even under restartPolicy
Never); a shared process namespace would let it signal the workload only when both run
as the same user or the keeper holds CAP_KILL, which the restricted Pod Security
Standard forbids, and it would show every container's processes to every other.
Deleting the pod goes through the kubelet's ordinary termination, whatever the
workload's image and user.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from guardedcron.handlers.context import PassMemory
from guardedcron.kube import PODS, ApiError, ApiUnreachable, KubeClient, NotFound
from guardedcron.spec.settings import ENV_STOP_WORKLOAD
from guardedcron.status import EventReason, RunEvent
from guardedcron.status.lease_loss import StopOrder

Logger = logging.Logger | logging.LoggerAdapter[Any]
NOT_ALLOWED = ("this operator may not delete pods: enable it with the chart value "
               f"stopWorkload.enabled=true ({ENV_STOP_WORKLOAD}=true), which grants "
               "`delete` on pods")


async def stop_lost_workloads(orders: Sequence[StopOrder], *, namespace: str, uid: str,
                              client: KubeClient, memory: PassMemory, allowed: bool,
                              logger: Logger) -> list[RunEvent]:
    """Delete the pods status/ says to stop (`StatusChange.stop`: still-running pods of
    Lost runs, when the spec asks for it); the Events to post (one per pod stopped or
    not stoppable)."""
    events: list[RunEvent] = []
    for order in orders:
        action = f"stop\n{order.pod}"
        if not memory.first_time(uid, action):
            continue  # asked already; the pod's next event shows it terminating
        what = f"run {order.job} lost its lease ({order.reason})"
        if not allowed:
            events.append(RunEvent(EventReason.STOP_WORKLOAD_FAILED,
                                   f"{what} and pod {order.pod} keeps running: {NOT_ALLOWED}",
                                   subject=order.job))
            continue
        try:
            await client.delete(PODS, namespace, order.pod, uid=order.pod_uid)
        except NotFound:
            continue  # gone already
        except ApiUnreachable as error:
            memory.forget_action(uid, action)  # try again on the next pass
            logger.info(f"Could not delete pod {order.pod} of run {order.job}: {error}")
            continue
        except ApiError as error:
            if error.code >= 500 or error.code == 429:
                memory.forget_action(uid, action)
            events.append(RunEvent(EventReason.STOP_WORKLOAD_FAILED,
                                   f"{what}; deleting pod {order.pod} failed: {error}",
                                   subject=order.job))
            continue
        logger.info(f"Deleted pod {order.pod}: {what}.")
        events.append(RunEvent(EventReason.WORKLOAD_STOPPED,
                               f"{what}; deleted pod {order.pod} (onLost: StopWorkload): the "
                               "workload gets SIGTERM, then SIGKILL after the pod's grace period",
                               subject=order.pod))
    return events
