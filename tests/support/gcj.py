"""GuardedCronJob objects for the spec and builder tests, and dotted-path helpers."""

from __future__ import annotations

import copy
import re
from typing import Any

from guardedcron.builders import build_cronjob
from guardedcron.spec import OperatorSettings, parse_guarded_cronjob, settings_from_env

UID = "6f1c1f5e-2b7a-4c1e-9d59-3f0b8f1c2a77"
DEFAULT_SETTINGS: OperatorSettings = settings_from_env({})
DELETE = object()  # as a value for `put`: remove the key


# The README's first GuardedCronJob, as a manifest a user would write.
README_EXAMPLE = """\
apiVersion: guardedcron.io/v1alpha1
kind: GuardedCronJob
metadata: {name: nightly-invoices, namespace: billing}
spec:
  schedule: "30 2 * * *"
  timeZone: Europe/Stockholm
  activeDeadlineSeconds: 3600
  lease:
    databaseSecretRef: {name: jobs-db, key: dsn}
  jobTemplate:
    spec:
      template:
        spec:
          containers: [{name: task, image: "shop:1.42", command: [bin/run-task, invoices:rollup]}]
"""


def base_gcj() -> dict[str, Any]:
    """The README's example as the API server returns it: every schema default filled in."""
    return {
        "apiVersion": "guardedcron.io/v1alpha1",
        "kind": "GuardedCronJob",
        "metadata": {"name": "nightly-invoices", "namespace": "billing", "uid": UID,
                     "generation": 1},
        "spec": {
            "schedule": "30 2 * * *",
            "timeZone": "Europe/Stockholm",
            "suspend": False,
            "startingDeadlineSeconds": 600,
            "activeDeadlineSeconds": 3600,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "recentRunsLimit": 10,
            "missedRunToleranceSeconds": 60,
            "lease": {
                "databaseSecretRef": {"name": "jobs-db", "key": "dsn"},
                "durationSeconds": 3900,
                "minHoldSeconds": 0,
                "heartbeat": False,
                "onLost": "Record",
            },
            "jobTemplate": {"spec": {"template": {"spec": {"containers": [
                {"name": "task", "image": "shop:1.42",
                 "command": ["bin/run-task", "invoices:rollup"]},
            ]}}}},
        },
    }


_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _steps(path: str) -> list[str | int]:
    return [name if name else int(index) for name, index in _STEP.findall(path)]


def get(obj: Any, path: str) -> Any:
    for step in _steps(path):
        obj = obj[step]
    return obj


def put(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `obj` with `path` set to `value` (missing objects on the way are created)."""
    result = copy.deepcopy(obj)
    *parents, last = _steps(path)
    node: Any = result
    for step in parents:
        node = node.setdefault(step, {}) if isinstance(step, str) else node[step]
    if value is DELETE:
        del node[last]
    else:
        node[last] = copy.deepcopy(value)
    return result


def on_schedule(schedule: str, zone: str | None, **spec: Any) -> dict[str, Any]:
    """base_gcj() with `schedule` in `zone` (None: no timeZone) and other spec fields set."""
    body = put(put(base_gcj(), "spec.schedule", schedule), "spec.timeZone", DELETE if zone is None else zone)
    for key, value in spec.items():
        body = put(body, f"spec.{key}", value)
    return body


def build(obj: dict[str, Any], settings: OperatorSettings = DEFAULT_SETTINGS) -> dict[str, Any]:
    return build_cronjob(parse_guarded_cronjob(obj), settings)
