"""The contracts between guardedcron's parts, in one place.

The operator writes these names into the objects it builds, the guard reads and
writes the files and exit codes, and the status code reads them back from pods.
Changing a value here is a breaking change of the API: see docs/design.md.
"""

from __future__ import annotations

from typing import Final

API_GROUP: Final = "guardedcron.io"
API_VERSION: Final = "v1alpha1"
KIND: Final = "GuardedCronJob"
PLURAL: Final = "guardedcronjobs"

FIELD_MANAGER: Final = "guardedcron-operator"

# --- exit codes of the guard CLI (sysexits.h values, so shells and pods read them alike)
EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 64  # bad input: nothing was touched
EXIT_UNAVAILABLE: Final = 69  # database unreachable or login refused
EXIT_INTERNAL: Final = 70  # EX_SOFTWARE: a bug in guardedcron, told in one line without a traceback
EXIT_NOT_ACQUIRED: Final = 75  # lease held, or slot already claimed: skip this run
EXIT_LEASE_LOST: Final = 76  # keeper saw the lease taken over or could not renew in time
EXIT_SCHEMA: Final = 78  # schema missing or older than this tool

# --- bounds on a lease, for the CLI, the library, the SQL functions and the CRD alike.
# Below 0.1 s the database's microsecond intervals round a lease towards nothing; above
# seven days a holder that dies unseen would keep its job locked for longer than any run
# without a heartbeat should take (longer runs use the keeper, which renews a short lease).
MIN_LEASE_SECONDS: Final = 0.1
MAX_LEASE_SECONDS: Final = 7 * 24 * 3600
# Fences and slots are PostgreSQL bigints.
BIGINT_MAX: Final = 2**63 - 1

# --- bounds on the guard's waits for the database (docs/design.md, "Bounded waits").
# After connecting (--connect-timeout, libpq waits at least 2 s), each call gets this long
# for its answer, then exits 69. acquire's SQL may wait up to 5 s (its lock_timeout) for
# an in-flight fenced write of the previous holder, so it gets that plus 5 s.
ACQUIRE_CALL_SECONDS: Final = 10.0
HOLDER_CALL_SECONDS: Final = 5.0  # renew, release
KEEPER_STOP_SECONDS: Final = 2.0  # SIGTERM to exit, in every state of the keeper
ADMIN_CALL_SECONDS: Final = 60.0  # db migrate, db status, runs: all their statements together

# --- labels and annotations
LABEL_NAME: Final = f"{API_GROUP}/name"  # on CronJob, Job and Pod: the owning GuardedCronJob
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "guardedcron"
ANNOTATION_TRIGGER: Final = f"{API_GROUP}/trigger"  # set on a GuardedCronJob to start a manual run
ANNOTATION_LOCK: Final = f"{API_GROUP}/lock"  # on the CronJob: the lease name its runs take
ANNOTATION_MANUAL: Final = f"{API_GROUP}/manual"  # on Jobs made by `guardedcron trigger`
# Set by the Kubernetes CronJob controller on the Jobs it schedules (GA in 1.32).
ANNOTATION_SCHEDULED_TIMESTAMP: Final = "batch.kubernetes.io/cronjob-scheduled-timestamp"
LABEL_JOB_NAME: Final = "batch.kubernetes.io/job-name"

# --- the injected containers and the volume they share with the workload
GUARD_CONTAINER: Final = "guardedcron-guard"
KEEPER_CONTAINER: Final = "guardedcron-keeper"
RUN_VOLUME: Final = "guardedcron-run"
RUN_DIR: Final = "/var/run/guardedcron"
FENCE_FILE: Final = "fence"  # the integer fencing token alone
LEASE_FILE: Final = "lease.json"  # lock, holder, fence, slot, locked_until
LOST_FILE: Final = "lost"  # written by the keeper when the lease was lost

# Where Kubernetes reads a container's termination message from.
TERMINATION_LOG: Final = "/dev/termination-log"
TERMINATION_MESSAGE_MAX: Final = 4096

# --- environment of the guard
ENV_DSN: Final = "GUARDEDCRON_DSN"
ENV_POD_NAME: Final = "GUARDEDCRON_POD_NAME"
ENV_POD_NAMESPACE: Final = "GUARDEDCRON_POD_NAMESPACE"
ENV_JOB_NAME: Final = "GUARDEDCRON_JOB_NAME"
ENV_TERMINATION_LOG: Final = "GUARDEDCRON_TERMINATION_LOG"  # overrides TERMINATION_LOG (tests)

# CronJob names are capped so the controller's Job names fit in 63 characters.
CRONJOB_NAME_MAX: Final = 52
