"""Kubernetes Events for run transitions, as plain core/v1 Event bodies (pure).

The handlers post them; `kubectl describe gcj` lists them (it selects events by the
involved object's uid). The name is deterministic, made from the GuardedCronJob's uid
and the transition, so posting the same transition twice (a pass retried after its status write failed)
is refused by the API server as AlreadyExists instead of showing twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from guardedcron import contract
from guardedcron.objects import uid_of
from guardedcron.status.conditions import truncate
from guardedcron.status.times import format_time
from guardedcron.status.transitions import RunEvent

REPORTING_COMPONENT: Final = contract.FIELD_MANAGER  # "guardedcron-operator"
# events.k8s.io caps a note at 1 KiB; core/v1 messages are kept to the same size.
EVENT_MESSAGE_MAX: Final = 1024


def build_event(gcj: Mapping[str, Any], run_event: RunEvent, now: datetime, *,
                reporting_instance: str | None = None) -> dict[str, Any]:
    """The Event body to POST to /api/v1/namespaces/<namespace>/events."""
    metadata = gcj.get("metadata") or {}
    name = str(metadata.get("name") or "")
    namespace = str(metadata.get("namespace") or "")
    uid = uid_of(gcj)
    if not name or not namespace:
        raise ValueError("an Event needs the GuardedCronJob's metadata.name and metadata.namespace")
    involved: dict[str, Any] = {
        "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
        "kind": contract.KIND,
        "name": name,
        "namespace": namespace,
    }
    if uid:
        involved["uid"] = uid
    timestamp = format_time(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": event_name(name, uid, run_event),
            "namespace": namespace,
            "labels": {contract.LABEL_NAME: name, contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE},
        },
        "involvedObject": involved,
        "reason": str(run_event.reason),
        "message": truncate(run_event.message, EVENT_MESSAGE_MAX),
        "type": "Warning" if run_event.warning else "Normal",
        "source": {"component": REPORTING_COMPONENT},
        "reportingComponent": REPORTING_COMPONENT,
        "reportingInstance": reporting_instance or REPORTING_COMPONENT,
        "firstTimestamp": timestamp,
        "lastTimestamp": timestamp,
        "count": 1,
    }


def event_name(gcj_name: str, gcj_uid: str, run_event: RunEvent) -> str:
    """`<gcj>.<16 hex digits>`: a valid object name (GuardedCronJob names are at most 52
    characters), the same for the same transition of the same object."""
    digest = hashlib.sha256(f"{gcj_uid}\n{run_event.key()}".encode()).hexdigest()[:16]
    return f"{gcj_name}.{digest}"
