"""Pure build_* functions: the CronJob and the guard containers injected into its pods."""

from guardedcron.builders.cronjob import (
    build_cronjob,
    build_job_template,
    build_owner_reference,
    build_pod_failure_policy,
)
from guardedcron.builders.guard import (
    ENV_HOLDER,
    build_guard_container,
    build_keeper_container,
    build_run_volume,
    build_workload_mount,
    locks_in_cronjob,
)
from guardedcron.contract import GUARD_ERROR_RULE_INDEX, SKIP_RULE_INDEX

__all__ = [
    "ENV_HOLDER",
    "GUARD_ERROR_RULE_INDEX",
    "SKIP_RULE_INDEX",
    "build_cronjob",
    "build_guard_container",
    "build_job_template",
    "build_keeper_container",
    "build_owner_reference",
    "build_pod_failure_policy",
    "build_run_volume",
    "build_workload_mount",
    "locks_in_cronjob",
]
