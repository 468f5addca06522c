"""A GuardedCronJob as typed, validated values (see docs/design.md, "The GuardedCronJob API")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import tzinfo
from typing import Any, Literal

from guardedcron.schedule import Schedule

OnLost = Literal["Record", "StopWorkload"]
CatchUpPolicy = Literal["None", "Latest", "All"]
RepeatedTime = Literal["Twice", "Once"]
SkippedTime = Literal["Skip", "RunAtNextMinute"]


@dataclass(frozen=True)
class SecretKeyRef:
    """A key of a Secret in the GuardedCronJob's namespace; the pod reads it, the operator never."""

    name: str
    key: str


@dataclass(frozen=True)
class DatabaseTls:
    """spec.lease.tls: where the guard and the keeper read libpq's TLS files from (at
    least one of the two is set)."""

    ca: SecretKeyRef | None  # the CA certificate that signed the server's certificate
    client_secret: str | None  # a kubernetes.io/tls Secret: tls.crt and tls.key


@dataclass(frozen=True)
class LeaseSpec:
    # The lock in the database (spec.locks): "<namespace>/<lease.name or metadata.name>",
    # or "shared:<sharedLock>" for a shared lock, which the operator takes only when the
    # cluster admin's allow-list grants it to the namespace.
    name: str
    database_secret_ref: SecretKeyRef
    duration_seconds: int
    min_hold_seconds: int
    heartbeat: bool  # true adds the keeper sidecar that renews the lease
    on_lost: OnLost
    shared_lock: str | None = None  # spec.lease.sharedLock, the allow-list's name
    tls: DatabaseTls | None = None  # None: libpq's defaults


@dataclass(frozen=True)
class CatchUpSpec:
    """spec.catchUp: which missed slots the operator makes up (docs/design.md, "Catch-up")."""

    policy: CatchUpPolicy = "None"
    window_seconds: int = 3600  # how far back a missed slot still counts
    max_runs: int = 1  # make-up runs for one gap at most: the newest missed slots


@dataclass(frozen=True)
class DstPolicy:
    """spec.dstPolicy (docs/design.md, "Daylight-saving policy"); the default is what the
    CronJob controller does: a wall time the clock shows twice runs twice, one it skips
    does not run."""

    repeated_time: RepeatedTime = "Twice"
    skipped_time: SkippedTime = "Skip"


@dataclass(frozen=True)
class GuardedCronJobSpec:
    schedule: Schedule
    # What the CronJob gets: spec.schedule as written, with any `H` resolved for the lock.
    schedule_text: str
    time_zone: str | None  # IANA name as written; None: the controller's zone (UTC)
    zone: tzinfo  # the loaded time zone, or UTC when unset: for next fire times
    suspend: bool
    starting_deadline_seconds: int
    active_deadline_seconds: int
    successful_jobs_history_limit: int
    failed_jobs_history_limit: int
    recent_runs_limit: int
    missed_run_tolerance_seconds: int
    lease: LeaseSpec
    # The user's batch/v1 JobTemplateSpec, checked where guardedcron touches it; a private
    # deep copy, so builders may read it freely (they copy again before changing anything).
    job_template: Mapping[str, Any] = field(hash=False)
    catch_up: CatchUpSpec = CatchUpSpec()
    # Suspend the CronJob after this many failed runs in a row; None: never.
    suspend_after_failures: int | None = None
    # spec.schedule as written (with `H` unresolved); equal to schedule_text without `H`.
    written_schedule: str = ""
    dst_policy: DstPolicy = DstPolicy()
    # spec.runContext.env: the run context as environment variables in the workload too.
    run_context_env: bool = False
    # spec.checkIn.urlSecretRef: the Secret key holding the keeper's check-in URL; None:
    # the operator's default (GUARDEDCRON_CHECK_IN_SECRET_NAME), if any.
    check_in: SecretKeyRef | None = None


@dataclass(frozen=True)
class ParsedSpec:
    """What `parse_guarded_cronjob` returns: the object's identity and its checked spec."""

    name: str
    namespace: str
    uid: str | None  # None for a manifest never applied (render)
    generation: int | None
    spec: GuardedCronJobSpec
