"""Which pods `spec.lease.onLost: StopWorkload` stops (pure).

A run whose keeper reported the lease lost is `Lost` and stays open until its Job
ends. While it is open, each of its pods that is still running and not already being
deleted is to be stopped; the handlers delete it (docs/design.md, "Lease loss").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from guardedcron.spec import OnLost
from guardedcron.status.runs import Outcome, RunRecord

STOP_WORKLOAD: Final[OnLost] = "StopWorkload"
_ENDED_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class StopOrder:
    job: str
    pod: str
    pod_uid: str | None  # the pod instance looked at: never delete a different one of that name
    reason: str  # the run's reason: why its lease is lost


def workloads_to_stop(runs: Iterable[RunRecord],
                      pods_by_job: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[StopOrder]:
    """Pods of open `Lost` runs among `runs` that are still running, by Job and pod name."""
    orders: list[StopOrder] = []
    for run in runs:
        if run.outcome is not Outcome.LOST or run.final:
            continue
        for pod in pods_by_job.get(run.job, ()):
            metadata = pod.get("metadata") or {}
            phase = (pod.get("status") or {}).get("phase")
            name = metadata.get("name")
            if not isinstance(name, str) or metadata.get("deletionTimestamp") or phase in _ENDED_PHASES:
                continue
            uid = metadata.get("uid")
            orders.append(StopOrder(run.job, name, uid if isinstance(uid, str) else None, run.reason))
    return sorted(orders, key=lambda order: (order.job, order.pod))
