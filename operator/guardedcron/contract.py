"""The contracts between guardedcron's parts, in one place.

The operator writes these names into the objects it builds, the guard reads and
writes the files and exit codes, and the status code reads them back from pods.
Changing a value here is a breaking change of the API: see docs/design.md.

Every fact that two parts must spell alike lives here and nowhere else: the guard, the
builders and the status code import it. It sits at the bottom of the layers and imports
nothing but the standard library (import-linter keeps it so), so that any part, the
guard in its own container included, can read it.
"""

from __future__ import annotations

import re
from enum import StrEnum
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
EXIT_NOT_GRANTED: Final = 77  # EX_NOPERM: the database role may not use this lock (db grant)
EXIT_SCHEMA: Final = 78  # schema missing or older than this tool
EXIT_INTERRUPTED: Final = 130  # 128 + SIGINT, as a shell reports it: interrupted, told in one line

# --- SQLSTATEs the guardedcron SQL functions raise (docs/design.md, "Least privilege")
SQLSTATE_NOT_GRANTED: Final = "GC003"  # the session's role holds no grant covering the lock

# --- podFailurePolicy: guard exit codes that fail the Job at once, one FailJob rule each.
# The Job's failure message names the rule by its index ("... matching FailJob rule at
# index N"), which tells a skip from a guard error once the pod is gone. Kubernetes wants
# each rule's codes sorted and unique.
SKIP_EXIT_CODES: Final = (EXIT_NOT_ACQUIRED,)
GUARD_ERROR_EXIT_CODES: Final = (EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_INTERNAL, EXIT_NOT_GRANTED, EXIT_SCHEMA)
FAIL_JOB_RULES: Final = (SKIP_EXIT_CODES, GUARD_ERROR_EXIT_CODES)  # in podFailurePolicy.rules order
SKIP_RULE_INDEX: Final = FAIL_JOB_RULES.index(SKIP_EXIT_CODES)
GUARD_ERROR_RULE_INDEX: Final = FAIL_JOB_RULES.index(GUARD_ERROR_EXIT_CODES)

# --- bounds on a lease, for the CLI, the library, the SQL functions and the CRD alike.
# Below 0.1 s the database's microsecond intervals round a lease towards nothing; above
# seven days a holder that dies unseen would keep its job locked for longer than any run
# without a heartbeat should take (longer runs use the keeper, which renews a short lease).
MIN_LEASE_SECONDS: Final = 0.1
MAX_LEASE_SECONDS: Final = 7 * 24 * 3600
# Fences and slots are PostgreSQL bigints.
BIGINT_MAX: Final = 2**63 - 1

# The keeper renews this many times per lease length (every third of it): a renewal that
# fails leaves two more chances before the lease could run out. The CRD's minimum
# heartbeat lease is chosen from it.
RENEWALS_PER_LEASE: Final = 3

# --- bounds on the guard's waits for the database (docs/design.md, "Bounded waits").
# After connecting (--connect-timeout, libpq waits at least 2 s), each call gets this long
# for its answer, then exits 69. acquire's SQL may wait up to 5 s (its lock_timeout) for
# an in-flight fenced write of the previous holder, so it gets that plus 5 s.
ACQUIRE_CALL_SECONDS: Final = 10.0
HOLDER_CALL_SECONDS: Final = 5.0  # renew, release
KEEPER_STOP_SECONDS: Final = 8.0  # SIGTERM to exit, in every state of the keeper
ADMIN_CALL_SECONDS: Final = 60.0  # db migrate, db status, runs: all their statements together

# --- labels and annotations
LABEL_NAME: Final = f"{API_GROUP}/name"  # on CronJob, Job and Pod: the owning GuardedCronJob
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "guardedcron"
ANNOTATION_TRIGGER: Final = f"{API_GROUP}/trigger"  # set on a GuardedCronJob to start a manual run
ANNOTATION_LOCK: Final = f"{API_GROUP}/lock"  # on the CronJob: the lease name its runs take
ANNOTATION_MANUAL: Final = f"{API_GROUP}/manual"  # on Jobs made by `guardedcron trigger`
# Issue 14, catch-up and backfill (docs/design.md, "Catch-up and backfill"): on a GuardedCronJob,
# `<token>:<since>/<until>` asks for one backfill per token; on a Job the operator started
# for a past slot, the run kind says why it exists (the CronJob controller's own Jobs and
# manual runs never carry it). The Job's name is `<cronjob>-<slot>`, so its guard claims
# the slot like a scheduled run's would.
ANNOTATION_BACKFILL: Final = f"{API_GROUP}/backfill"
ANNOTATION_RUN_KIND: Final = f"{API_GROUP}/run-kind"
# Days the guard keeps run history and slot claims (its `--retain-days` default; the
# builders never pass the flag, so every guard keeps claims this long). A past slot whose
# claim is gone would run a second time, so catch-up and backfill start only slots newer
# than now - (SLOT_CLAIM_RETAIN_DAYS - SLOT_CLAIM_MARGIN_DAYS) days. The margin covers
# the operator's clock ahead of the database's and a winner's retention batch deleting
# claims at that very moment.
SLOT_CLAIM_RETAIN_DAYS: Final = 90
SLOT_CLAIM_MARGIN_DAYS: Final = 1
RUN_KIND_CATCH_UP: Final = "catch-up"
RUN_KIND_BACKFILL: Final = "backfill"
# A wall time the clock skipped (spec.dstPolicy.skippedTime RunAtNextMinute): its Job's
# guard claims the wall time's own key (schedule.dst.skipped_time_slot), never a minute's.
RUN_KIND_SKIPPED_TIME: Final = "skipped-time"
# Issue 14, stop after repeated failures: a new value resumes a CronJob the operator
# suspended after spec.suspendAfterFailures failed runs in a row (once per value).
ANNOTATION_RESUME: Final = f"{API_GROUP}/resume"
# kopf keeps its handler progress and last-handled spec under this prefix; a pass never reads them.
KOPF_ANNOTATION_PREFIX: Final = f"operator.{API_GROUP}"
# kubectl's mark on a Job made with `create job --from=cronjob/NAME` (value "manual");
# the CronJob controller never sets it. `guardedcron trigger` sets it too, as kubectl does.
ANNOTATION_KUBECTL_INSTANTIATE: Final = "cronjob.kubernetes.io/instantiate"
INSTANTIATE_MANUAL: Final = "manual"
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
# Written by the keeper once SIGTERM would make it release the lease; the keeper's
# startupProbe waits for it, so no workload container starts before then (a workload
# that ended while the keeper was still starting left the lease held to its end).
KEEPER_READY_FILE: Final = "keeper-ready"
# The kubelet probes for it every second, this many times, before it restarts the keeper;
# the workload waits meanwhile (docs/design.md, "The keeper's start").
KEEPER_STARTUP_PROBES: Final = 60

# Where Kubernetes reads a container's termination message from.
TERMINATION_LOG: Final = "/dev/termination-log"
TERMINATION_MESSAGE_MAX: Final = 4096

# --- environment of the guard
ENV_DSN: Final = "GUARDEDCRON_DSN"
ENV_POD_NAME: Final = "GUARDEDCRON_POD_NAME"
ENV_POD_NAMESPACE: Final = "GUARDEDCRON_POD_NAMESPACE"
ENV_JOB_NAME: Final = "GUARDEDCRON_JOB_NAME"
ENV_TERMINATION_LOG: Final = "GUARDEDCRON_TERMINATION_LOG"  # overrides TERMINATION_LOG (tests)
# The keeper's check-in URL (spec.checkIn, docs/design.md "Check-in pings"): a secret, so
# only ever in the environment (from a Secret), never in args, logs or messages.
ENV_CHECK_IN_URL: Final = "GUARDEDCRON_CHECK_IN_URL"
KEEPER_CHECK_IN_FLAG: Final = "--check-in"
# TLS towards PostgreSQL (spec.lease.tls; docs/design.md, "Generated CronJob", TLS): the guard
# and the keeper get the CA and the client certificate as read-only Secret volumes and
# libpq's own variables pointing at them. A Secret volume's key file is world-readable
# (no fsGroup) or group-readable (with one), and libpq refuses such a key: the guard and
# the keeper copy it, mode 0600, from ENV_TLS_KEY_SOURCE to PGSSLKEY in a memory-backed
# volume of their own (never the run volume: the workload must not read the key) before
# connecting.
ENV_TLS_KEY_SOURCE: Final = "GUARDEDCRON_TLS_KEY_SOURCE"
TLS_CA_VOLUME: Final = "guardedcron-tls-ca"
TLS_CA_DIR: Final = "/etc/guardedcron/tls/ca"
TLS_CA_FILE: Final = "ca.crt"
TLS_CLIENT_VOLUME: Final = "guardedcron-tls-client"
TLS_CLIENT_DIR: Final = "/etc/guardedcron/tls/client"
TLS_CLIENT_CERT_FILE: Final = "tls.crt"  # the keys of a kubernetes.io/tls Secret
TLS_CLIENT_KEY_FILE: Final = "tls.key"
TLS_KEY_VOLUME: Final = "guardedcron-tls-key"
TLS_KEY_DIR: Final = "/var/run/guardedcron-tls"

# --- the run context (issue 14; docs/design.md, "Run context"): what a run's workload can
# read without parsing Job names. In lease.json always (keys below); as environment
# variables of the workload's containers, with static values, when spec.runContext.env.
KEY_RUN_KIND: Final = "run_kind"  # RUN_KIND_* below
KEY_MANUAL: Final = "manual"  # true for a run started by hand (no slot)
KEY_SCHEDULED_TIME: Final = "scheduled_time"  # RFC 3339 in the job's zone; null if unknown
KEY_SCHEDULED_TIME_UTC: Final = "scheduled_time_utc"  # RFC 3339 in UTC; null for manual runs
KEY_TIME_ZONE: Final = "time_zone"  # the job's IANA zone; null when the guard was not told
RUN_KIND_SCHEDULED: Final = "scheduled"  # a Job the CronJob controller made for its slot
RUN_KIND_MANUAL: Final = "manual"  # `guardedcron trigger`, the trigger annotation, kubectl
# The guard's `--run-kind`: catch-up, backfill and skipped-time Jobs say so (RUN_KIND_CATCH_UP,
# RUN_KIND_BACKFILL, RUN_KIND_SKIPPED_TIME); a Job without it is scheduled when its name
# has a slot, else manual.
GUARD_RUN_KIND_FLAG: Final = "--run-kind"
# On a CronJob whose GuardedCronJob's schedule uses H: spec.schedule as written (the
# CronJob's own schedule is the resolved one).
ANNOTATION_WRITTEN_SCHEDULE: Final = f"{API_GROUP}/schedule"
ENV_LOCK: Final = "GUARDEDCRON_LOCK"
ENV_TIME_ZONE: Final = "GUARDEDCRON_TIME_ZONE"  # the IANA name; UTC when spec.timeZone is unset
ENV_SCHEDULE: Final = "GUARDEDCRON_SCHEDULE"  # the concrete schedule (H resolved)
ENV_GUARDED_CRONJOB: Final = "GUARDEDCRON_GUARDED_CRONJOB"  # the GuardedCronJob's name
ENV_LEASE_FILE: Final = "GUARDEDCRON_LEASE_FILE"  # the path of lease.json
ENV_FENCE_FILE: Final = "GUARDEDCRON_FENCE_FILE"  # the path of the fence file

# --- names and text
# CronJob names are capped so the controller's Job names fit in 63 characters.
CRONJOB_NAME_MAX: Final = 52
# Lock and holder names, trigger tokens and Kubernetes object names (a DNS subdomain).
NAME_MAX: Final = 253
# C0 controls and DEL: refused in names, replaced in text the status shows.
CONTROL_CHARACTERS: Final = re.compile(r"[\x00-\x1f\x7f]")
# Lock names the operator gives (docs/design.md, "Multi-tenant clusters"): a namespace's
# own locks are "<namespace>/<lease.name>", a shared lock from the cluster admin's
# allow-list is "shared:<name>". A namespace is a DNS label (no ':'), so the two never
# meet; PostgreSQL grants a tenant its "<namespace>/" prefix and a shared lock by name.
NAMESPACE_LOCK_SEPARATOR: Final = "/"
SHARED_LOCK_PREFIX: Final = "shared:"
# Namespaces are DNS labels: at most 63 characters.
NAMESPACE_MAX: Final = 63


# --- what the guard and the keeper write and the operator reads ---------------------------
# Keys of their JSON: the stdout line, <out>/lease.json and the termination message, which
# the operator reads from the pod's status (guardedcron.status.reports).
KEY_OUTCOME: Final = "outcome"
KEY_REASON: Final = "reason"
KEY_LOCK: Final = "lock"
KEY_HOLDER: Final = "holder"
KEY_FENCE: Final = "fence"
KEY_SLOT: Final = "slot"
KEY_REQUESTER: Final = "requester"  # on a skip: the holder name this pod asked with
KEY_EXIT_CODE: Final = "exitCode"
KEY_ACQUIRED: Final = "acquired"  # acquire's stdout line; renew's and release's say these two
KEY_RENEWED: Final = "renewed"
KEY_RELEASED: Final = "released"
KEY_LOCKED_UNTIL: Final = "locked_until"
KEY_RUN_ID: Final = "run_id"
KEY_RENEWALS: Final = "renewals"
KEY_TRUNCATED: Final = "truncated"  # a message cut down to its outcome to fit
# In lease.json only, for the keeper's first deadline (docs/design.md, "The keeper's timing").
KEY_SENT_MONOTONIC: Final = "sent_monotonic"
KEY_REMAINING_SECONDS: Final = "remaining_seconds"


class GuardOutcome(StrEnum):
    """The guard's (acquire's) termination-message outcome."""

    ACQUIRED = "acquired"
    SKIPPED = "skipped"  # exit 75; holder and fence name the winner
    ERROR = "error"  # any other non-zero exit; the reason says why


class KeeperOutcome(StrEnum):
    """The keeper's termination-message outcome."""

    LOST = "lost"  # exit 76 (or waits, by policy): the lease went
    RELEASED = "released"  # stopped and released the lease it held
    NOT_HOLDER = "not-holder"  # stopped, but the lease was no longer its own


class AcquireReason(StrEnum):
    """Why acquire answered as it did: from the SQL acquire functions, row-busy from the library."""

    ACQUIRED = "acquired"
    ALREADY_HELD = "already-held"  # the same holder asked again for the same slot
    LEASE_HELD = "lease-held"
    SLOT_CLAIMED = "slot-claimed"  # the scheduled minute already ran, under its fence
    ROW_BUSY = "row-busy"  # the previous holder's fenced write had the row locked


class ReleaseOutcome(StrEnum):
    """What a release records in the run's history row."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    FINISHED = "finished"  # ended, without saying how the workload did


# --- the slot a Job stands for --------------------------------------------------------
# The CronJob controller names a scheduled Job `<cronjob>-<minutes since the epoch>`; any
# other name (kubectl create job --from, guardedcron trigger) is a manual run: no slot.
_SLOT_SUFFIX: Final = re.compile(r"-([0-9]+)")
_BIGINT_DIGITS: Final = len(str(BIGINT_MAX))


class SlotOutOfRange(ValueError):
    """A Job name of the scheduled shape whose minute is past what a slot (a bigint) holds."""

    def __init__(self, digits: str) -> None:
        super().__init__(f"the scheduled minute {digits[:40]!r} is past {BIGINT_MAX}")
        self.digits = digits


def slot_from_job_name(job_name: str, cronjob: str) -> int | None:
    """The scheduled minute of a Job the CronJob `cronjob` made, read from its name; None
    for any other name. The guard claims this slot, and the status reads the same one.

    Raises SlotOutOfRange when the minute does not fit a PostgreSQL bigint: the guard
    refuses such a name (exit 64) rather than claim a slot the database cannot hold.
    """
    if not cronjob or not job_name.startswith(cronjob):
        return None
    match = _SLOT_SUFFIX.fullmatch(job_name, len(cronjob))
    if match is None:
        return None
    digits = match.group(1)
    # Compared on the significant digits first, so that no length of name costs more than
    # that (and int() never sees more digits than it converts).
    significant = digits.lstrip("0") or "0"
    if len(significant) > _BIGINT_DIGITS or int(significant) > BIGINT_MAX:
        raise SlotOutOfRange(digits)
    return int(significant)


# --- a Job the operator starts for a past slot (issue 14; docs/design.md, "Catch-up and
# backfill"): `<cronjob>-<slot>-<c|b><attempt>`, the CronJob part shortened to fit 63
# characters. Never the controller's `<cronjob>-<slot>`: its guard gets the slot with
# --slot, and its Job carries the slot in ANNOTATION_SCHEDULED_TIMESTAMP.
ATTEMPT_LETTERS: Final = {RUN_KIND_CATCH_UP: "c", RUN_KIND_BACKFILL: "b", RUN_KIND_SKIPPED_TIME: "s"}
_ATTEMPT_SUFFIX: Final = re.compile(r"-([0-9]+)-([cbs])([0-9]+)$")
_JOB_NAME_MAX: Final = 63


def attempt_job_name(cronjob: str, slot: int, kind: str, attempt: int) -> str:
    suffix = f"-{slot}-{ATTEMPT_LETTERS[kind]}{attempt}"
    return f"{cronjob[:_JOB_NAME_MAX - len(suffix)].rstrip('-')}{suffix}"


def attempt_of(job_name: str) -> tuple[int, str, int] | None:
    """(slot, run kind, attempt) of an attempt's Job name; None for any other name."""
    match = _ATTEMPT_SUFFIX.search(job_name)
    if match is None:
        return None
    kind = next(k for k, letter in ATTEMPT_LETTERS.items() if letter == match.group(2))
    return int(match.group(1)), kind, int(match.group(3))
