"""Turn a GuardedCronJob object into a `ParsedSpec`, or a `SpecError` listing every problem.

The input is the object as the API server returns it: schema defaults applied (for
manifests never admitted, see `apply_schema_defaults`). The checks repeat the CRD's CEL
rules, so `guardedcron render` gives the same answer offline as admission does, and add
what CEL cannot decide: whether the schedule parses and the time zone exists, and
whether the job template leaves room for the containers and volume guardedcron injects.
"""

from __future__ import annotations

import copy
import posixpath
import re
from collections.abc import Mapping
from datetime import UTC, tzinfo
from typing import Any, Literal, TypeVar, cast, get_args

from guardedcron import contract
from guardedcron.schedule import Schedule, ScheduleError, load_time_zone
from guardedcron.schedule.hashed import resolve_hashed
from guardedcron.spec.errors import SpecError
from guardedcron.spec.locks import (
    LEASE_NAME_FORBIDDEN,
    LEASE_NAME_MAX,
    SHARED_LOCK_NAME,
    SHARED_LOCK_NAME_MAX,
    SHARED_LOCK_NAME_RULE,
    namespace_lock,
    shared_lock,
)
from guardedcron.spec.model import (
    CatchUpPolicy,
    CatchUpSpec,
    DatabaseTls,
    DstPolicy,
    GuardedCronJobSpec,
    LeaseSpec,
    OnLost,
    ParsedSpec,
    RepeatedTime,
    SecretKeyRef,
    SkippedTime,
)
from guardedcron.spec.reserved import (
    RESERVED_CONTAINER_NAMES,
    RESERVED_MOUNT_PATH,
    RESERVED_TLS_VOLUME_NAMES,
    RESERVED_VOLUME_NAME,
    owner_labels,
)

API_VERSION = f"{contract.API_GROUP}/{contract.API_VERSION}"
DEFAULT_NAMESPACE = "default"
MIN_STARTING_DEADLINE_SECONDS = 10  # the CronJob controller looks every 10 s; less may never fire

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
# Limits the CRD schema sets too; repeated so that render answers as admission does.
MAX_SCHEDULE_LENGTH = 256
MAX_TIME_ZONE_LENGTH = 64
MAX_RECENT_RUNS = 100
MAX_MISSED_RUN_TOLERANCE_SECONDS = 86400
# The keeper renews every 1/contract.RENEWALS_PER_LEASE of the lease: 5 s leaves room for a slow round trip.
MIN_HEARTBEAT_LEASE_SECONDS = 5 * contract.RENEWALS_PER_LEASE
MAX_CONTAINERS = 64  # each of containers and initContainers
MAX_VOLUMES = 256
MAX_CONTAINER_NAME_LENGTH = 63
# spec.catchUp and spec.suspendAfterFailures (issue 14); the CRD sets the same bounds.
# A week back at most: slot claims are kept 90 days, so a slot run anywhere in the
# window is still known to every cluster's guard, and one gap stays a bounded walk.
MAX_CATCH_UP_WINDOW_SECONDS = 7 * 86400
MAX_CATCH_UP_RUNS = 100
MAX_SUSPEND_AFTER_FAILURES = 1000

_T = TypeVar("_T")
_MISSING: Any = object()


class _Reader:
    """Reads typed fields out of plain dicts and records a problem for each bad one."""

    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def problem(self, path: str, message: str) -> None:
        self.problems.append((path, message))

    def field(self, parent: Mapping[str, Any], key: str, path: str, kind: type[_T],
              *, required: bool) -> _T | None:
        value = parent.get(key, _MISSING)
        if value is _MISSING or (value is None and not required):
            if required:
                self.problem(path, "required")
            return None
        if not _is_instance(value, kind):
            self.problem(path, f"must be {_KIND_NAMES[kind]}, not {_describe(value)}")
            return None
        return cast(_T, value)

    def integer(self, parent: Mapping[str, Any], key: str, path: str, *,
                minimum: int, maximum: int | None = None) -> int | None:
        value = self.field(parent, key, path, int, required=True)
        if value is not None and value < minimum:
            self.problem(path, f"must be at least {minimum}, not {value}")
            return None
        if value is not None and maximum is not None and value > maximum:
            self.problem(path, f"must be at most {maximum}, not {value}")
            return None
        return value

    def text(self, parent: Mapping[str, Any], key: str, path: str, *, required: bool,
             max_length: int) -> str | None:
        value = self.field(parent, key, path, str, required=required)
        if value is not None and len(value) > max_length:
            self.problem(path, f"must be at most {max_length} characters, not {len(value)}")
            return None
        return value


_KIND_NAMES: dict[type, str] = {
    str: "a string", int: "an integer", bool: "true or false", dict: "an object", list: "a list",
}


def _is_instance(value: Any, kind: type) -> bool:
    if kind is int:  # YAML's true/false are Python bools, which are ints; not here
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    for kind, name in _KIND_NAMES.items():
        if _is_instance(value, kind):
            return f"{name} ({value!r})" if kind in (str, int, bool) else name
    return f"{type(value).__name__} ({value!r})"


def parse_guarded_cronjob(obj: Mapping[str, Any], *,
                          default_namespace: str = DEFAULT_NAMESPACE) -> ParsedSpec:
    """Check a GuardedCronJob object and return it typed; raise `SpecError` with all problems.

    `default_namespace` stands in for a missing metadata.namespace (manifests for render).
    """
    r = _Reader()
    if obj.get("apiVersion") != API_VERSION:
        r.problem("apiVersion", f"must be {API_VERSION}, not {obj.get('apiVersion')!r}")
    if obj.get("kind") != contract.KIND:
        r.problem("kind", f"must be {contract.KIND}, not {obj.get('kind')!r}")

    metadata = r.field(obj, "metadata", "metadata", dict, required=True)
    name = namespace = uid = generation = None
    if metadata is not None:
        name = _read_name(r, metadata)
        namespace = r.field(metadata, "namespace", "metadata.namespace", str, required=False)
        if namespace is not None and not _DNS_LABEL.match(namespace):
            r.problem("metadata.namespace", f"{namespace!r} is not a valid namespace name")
        uid = r.field(metadata, "uid", "metadata.uid", str, required=False)
        generation = r.field(metadata, "generation", "metadata.generation", int,
                             required=False)
    namespace = namespace or default_namespace

    spec_obj = r.field(obj, "spec", "spec", dict, required=True)
    # Checked even without a name, so that every problem is reported in one go.
    spec = _read_spec(r, spec_obj, name, namespace) if spec_obj is not None else None

    if r.problems:
        raise SpecError(r.problems)
    assert spec is not None and name is not None  # no problems means both were read
    return ParsedSpec(name=name, namespace=namespace, uid=uid or None,
                      generation=generation, spec=spec)


def _read_name(r: _Reader, metadata: Mapping[str, Any]) -> str | None:
    name = r.field(metadata, "name", "metadata.name", str, required=True)
    if name is None:
        return None
    if len(name) > contract.CRONJOB_NAME_MAX:
        r.problem("metadata.name", f"must be at most {contract.CRONJOB_NAME_MAX} characters "
                  f"(a CronJob's limit, so its Job names fit in 63), not {len(name)}")
    elif not _DNS_SUBDOMAIN.match(name):
        r.problem("metadata.name", f"{name!r} must consist of lower-case letters, digits, "
                  "'-' and '.', and start and end with a letter or digit")
    return name


def _read_spec(r: _Reader, spec: Mapping[str, Any], name: str | None, namespace: str
               ) -> GuardedCronJobSpec | None:
    schedule_text = r.text(spec, "schedule", "spec.schedule", required=True,
                           max_length=MAX_SCHEDULE_LENGTH)
    # Checked here with a stand-in lock, so that problems come in the order of the fields;
    # what `H` resolves to never decides whether a schedule is valid.
    checked = _read_schedule(r, _resolve_schedule(r, schedule_text, ""))
    time_zone = r.text(spec, "timeZone", "spec.timeZone", required=False,
                       max_length=MAX_TIME_ZONE_LENGTH)
    zone = _read_time_zone(r, time_zone)
    suspend = r.field(spec, "suspend", "spec.suspend", bool, required=True)

    policy = r.field(spec, "concurrencyPolicy", "spec.concurrencyPolicy", str, required=False)
    if policy is not None and policy != "Forbid":
        r.problem("spec.concurrencyPolicy",
                  f"must be Forbid (guardedcron never runs a job twice at once), not {policy!r}")

    starting = r.integer(spec, "startingDeadlineSeconds", "spec.startingDeadlineSeconds",
                         minimum=MIN_STARTING_DEADLINE_SECONDS)
    active = r.integer(spec, "activeDeadlineSeconds", "spec.activeDeadlineSeconds", minimum=1)
    successful = r.integer(spec, "successfulJobsHistoryLimit", "spec.successfulJobsHistoryLimit",
                           minimum=0)
    failed = r.integer(spec, "failedJobsHistoryLimit", "spec.failedJobsHistoryLimit", minimum=0)
    recent = r.integer(spec, "recentRunsLimit", "spec.recentRunsLimit", minimum=0,
                       maximum=MAX_RECENT_RUNS)
    tolerance = r.integer(spec, "missedRunToleranceSeconds", "spec.missedRunToleranceSeconds",
                          minimum=0, maximum=MAX_MISSED_RUN_TOLERANCE_SECONDS)

    lease_obj = r.field(spec, "lease", "spec.lease", dict, required=True)
    lease = (_read_lease(r, lease_obj, namespace, name or "", active)
             if lease_obj is not None else None)
    # `H` resolves from the effective lock, so every cluster sharing it agrees.
    resolved = (resolve_hashed(schedule_text, lease.name)
                if checked is not None and schedule_text is not None and lease is not None
                else None)
    schedule = Schedule.parse(resolved) if resolved is not None else None
    dst_policy = _read_dst_policy(r, spec, time_zone)
    run_context_env = _read_run_context(r, spec)
    check_in = _read_check_in(r, spec, lease_obj)

    template = r.field(spec, "jobTemplate", "spec.jobTemplate", dict, required=True)
    if template is not None:
        _check_job_template(r, template, active, owner_labels(name) if name else {})
    catch_up = _read_catch_up(r, spec)
    suspend_after = r.field(spec, "suspendAfterFailures", "spec.suspendAfterFailures", int,
                            required=False)
    if suspend_after is not None and not 1 <= suspend_after <= MAX_SUSPEND_AFTER_FAILURES:
        r.problem("spec.suspendAfterFailures", f"must be from 1 to {MAX_SUSPEND_AFTER_FAILURES} "
                  f"(leave it unset to never suspend), not {suspend_after}")

    if (schedule is None or schedule_text is None or suspend is None or starting is None
            or active is None or successful is None or failed is None or recent is None
            or tolerance is None or lease is None or template is None
            or zone is None or name is None or catch_up is None or resolved is None
            or dst_policy is None or run_context_env is None or check_in is False):
        return None
    return GuardedCronJobSpec(
        schedule=schedule, schedule_text=resolved, time_zone=time_zone, zone=zone,
        suspend=suspend, starting_deadline_seconds=starting, active_deadline_seconds=active,
        successful_jobs_history_limit=successful, failed_jobs_history_limit=failed,
        recent_runs_limit=recent, missed_run_tolerance_seconds=tolerance, lease=lease,
        job_template=copy.deepcopy(template), catch_up=catch_up,
        suspend_after_failures=suspend_after,
        written_schedule=schedule_text, dst_policy=dst_policy, run_context_env=run_context_env,
        check_in=check_in or None,
    )


def _read_check_in(r: _Reader, spec: Mapping[str, Any], lease: Mapping[str, Any] | None
                   ) -> SecretKeyRef | Literal[False] | None:
    """spec.checkIn.urlSecretRef (None: unset); False when it is bad. The keeper sends the
    pings, so it needs spec.lease.heartbeat, as the CRD's rule says."""
    path = "spec.checkIn"
    check_in = r.field(spec, "checkIn", path, dict, required=False)
    if check_in is None:
        return False if spec.get("checkIn") is not None else None
    ref = _read_secret_key_ref(r, check_in, "urlSecretRef", f"{path}.urlSecretRef")
    if ref is None:
        return False
    if lease is not None and lease.get("heartbeat") is False:
        r.problem(path, "needs spec.lease.heartbeat true: the keeper sidecar sends the check-in "
                  "pings (start, and finish after it released the lease); without it no "
                  "container could ping")
        return False
    return ref


def _read_catch_up(r: _Reader, spec: Mapping[str, Any]) -> CatchUpSpec | None:
    """spec.catchUp; unset is policy None (no make-up runs, as before issue 14)."""
    path = "spec.catchUp"
    catch_up = r.field(spec, "catchUp", path, dict, required=False)
    if catch_up is None:
        return None if "catchUp" in spec and spec["catchUp"] is not None else CatchUpSpec()
    default = CatchUpSpec()
    policy = catch_up.get("policy", default.policy)
    if policy not in get_args(CatchUpPolicy):
        r.problem(f"{path}.policy", f"must be one of {', '.join(get_args(CatchUpPolicy))}, "
                  f"not {policy!r}")
        policy = None
    window = r.integer({**{"windowSeconds": default.window_seconds}, **catch_up}, "windowSeconds",
                       f"{path}.windowSeconds", minimum=60, maximum=MAX_CATCH_UP_WINDOW_SECONDS)
    runs = r.integer({**{"maxRuns": default.max_runs}, **catch_up}, "maxRuns", f"{path}.maxRuns",
                     minimum=1, maximum=MAX_CATCH_UP_RUNS)
    if runs is not None and runs > 1 and policy is not None and policy != "All":
        r.problem(f"{path}.maxRuns", f"above 1 needs {path}.policy All: None makes up nothing "
                  f"and Latest makes up one slot, not {runs}")
        runs = None
    if policy is None or window is None or runs is None:
        return None
    return CatchUpSpec(policy=cast(CatchUpPolicy, policy), window_seconds=window, max_runs=runs)


def _resolve_schedule(r: _Reader, text: str | None, lock: str) -> str | None:
    """spec.schedule with `H` resolved for `lock` (the text itself without `H`)."""
    if text is None:
        return None
    try:
        return resolve_hashed(text, lock)
    except ScheduleError as exc:
        r.problem("spec.schedule", f"{text!r} is not a valid cron schedule: {exc}")
        return None


def _read_dst_policy(r: _Reader, spec: Mapping[str, Any], time_zone: str | None
                     ) -> DstPolicy | None:
    """spec.dstPolicy; unset (or each field unset) is what the CronJob controller does."""
    path = "spec.dstPolicy"
    policy = r.field(spec, "dstPolicy", path, dict, required=False)
    if policy is None:
        return None if spec.get("dstPolicy") is not None else DstPolicy()
    default = DstPolicy()
    repeated = policy.get("repeatedTime", default.repeated_time)
    if repeated not in get_args(RepeatedTime):
        r.problem(f"{path}.repeatedTime",
                  f"must be one of {', '.join(get_args(RepeatedTime))}, not {repeated!r}")
        return None
    skipped = policy.get("skippedTime", default.skipped_time)
    if skipped not in get_args(SkippedTime):
        r.problem(f"{path}.skippedTime",
                  f"must be one of {', '.join(get_args(SkippedTime))}, not {skipped!r}")
        return None
    chosen = DstPolicy(repeated_time=cast(RepeatedTime, repeated),
                       skipped_time=cast(SkippedTime, skipped))
    if chosen != default and time_zone is None:
        r.problem(path, "needs spec.timeZone: without it the schedule is read in UTC, whose "
                  "clock is never set back or forward, so there is nothing to decide")
        return None
    return chosen


def _read_run_context(r: _Reader, spec: Mapping[str, Any]) -> bool | None:
    """spec.runContext.env; unset is false (the CronJob as before issue 14)."""
    context = r.field(spec, "runContext", "spec.runContext", dict, required=False)
    if context is None:
        return None if spec.get("runContext") is not None else False
    env = r.field(context, "env", "spec.runContext.env", bool, required=False)
    if env is None:
        return None if context.get("env") is not None else False
    return env


def _read_schedule(r: _Reader, text: str | None) -> Schedule | None:
    if text is None:
        return None
    try:  # refuses TZ= prefixes and @every too, with their own reasons
        return Schedule.parse(text)
    except ScheduleError as exc:
        r.problem("spec.schedule", f"{text!r} is not a valid cron schedule: {exc}")
        return None


def _read_time_zone(r: _Reader, name: str | None) -> tzinfo | None:
    if name is None:
        return UTC  # what the controller uses without spec.timeZone (see docs/design.md)
    try:
        return load_time_zone(name)
    except ScheduleError as exc:
        r.problem("spec.timeZone", str(exc))  # names the zone and says what is wrong
        return None


def _read_lease(r: _Reader, lease: Mapping[str, Any], namespace: str, gcj_name: str,
                active_deadline: int | None) -> LeaseSpec | None:
    ref = _read_secret_ref(r, lease)
    tls = _read_tls(r, lease)
    lock = _read_lock(r, lease, namespace, gcj_name)
    duration = _lease_seconds(r, lease, "durationSeconds", minimum=1)
    min_hold = _lease_seconds(r, lease, "minHoldSeconds", minimum=0)
    heartbeat = r.field(lease, "heartbeat", "spec.lease.heartbeat", bool, required=True)
    on_lost = r.field(lease, "onLost", "spec.lease.onLost", str, required=True)
    if on_lost is not None and on_lost not in get_args(OnLost):
        r.problem("spec.lease.onLost",
                  f"must be one of {', '.join(get_args(OnLost))}, not {on_lost!r}")
        on_lost = None

    if heartbeat and duration is not None and duration < MIN_HEARTBEAT_LEASE_SECONDS:
        r.problem("spec.lease.durationSeconds",
                  f"must be at least {MIN_HEARTBEAT_LEASE_SECONDS} when spec.lease.heartbeat is "
                  f"true (the keeper renews every 1/{contract.RENEWALS_PER_LEASE} of it), not {duration}")
    if duration is not None and min_hold is not None and min_hold > duration:
        r.problem("spec.lease.minHoldSeconds",
                  f"must be at most spec.lease.durationSeconds ({duration}), not {min_hold}")
    if (heartbeat is False and duration is not None and active_deadline is not None
            and duration <= active_deadline):
        r.problem("spec.lease.durationSeconds",
                  f"must exceed spec.activeDeadlineSeconds ({active_deadline}) when "
                  f"spec.lease.heartbeat is false, not {duration}: the lease would run out "
                  "while the job may still be running")

    if (ref is None or lock is None or duration is None or min_hold is None
            or heartbeat is None or on_lost is None or min_hold > duration or tls is False):
        return None
    return LeaseSpec(name=lock[0], database_secret_ref=ref, duration_seconds=duration,
                     min_hold_seconds=min_hold, heartbeat=heartbeat,
                     on_lost=cast(OnLost, on_lost), shared_lock=lock[1], tls=tls)


def _read_tls(r: _Reader, lease: Mapping[str, Any]) -> DatabaseTls | Literal[False] | None:
    """spec.lease.tls (None: unset); False when it is bad. The same rules as the CRD's."""
    path = "spec.lease.tls"
    tls = r.field(lease, "tls", path, dict, required=False)
    if tls is None:
        return False if lease.get("tls") is not None else None
    ca = None
    ca_ref = tls.get("caSecretRef")
    if ca_ref is not None:
        ca = _read_secret_key_ref(r, tls, "caSecretRef", f"{path}.caSecretRef")
        if ca is None:
            return False
    client = None
    if tls.get("clientCertSecretRef") is not None:
        client_path = f"{path}.clientCertSecretRef"
        ref = r.field(tls, "clientCertSecretRef", client_path, dict, required=True)
        client = (r.field(ref, "name", f"{client_path}.name", str, required=True)
                  if ref is not None else None)
        if client is not None and not _DNS_SUBDOMAIN.match(client):
            r.problem(f"{client_path}.name", f"{client!r} is not a valid Secret name")
            client = None
        if client is None:
            return False
    if ca is None and client is None:
        r.problem(path, "needs caSecretRef, clientCertSecretRef or both; leave spec.lease.tls "
                  "unset to use libpq's defaults")
        return False
    return DatabaseTls(ca=ca, client_secret=client)


def _read_lock(r: _Reader, lease: Mapping[str, Any], namespace: str, gcj_name: str
               ) -> tuple[str, str | None] | None:
    """(the effective lock, the shared lock's name or None); the same rules as the CRD's."""
    name = r.field(lease, "name", "spec.lease.name", str, required=False)
    shared = r.field(lease, "sharedLock", "spec.lease.sharedLock", str, required=False)
    good = True
    if name is not None and shared is not None:
        r.problem("spec.lease.sharedLock",
                  "must not be set together with spec.lease.name: a run takes either a lock of "
                  "its namespace or a shared lock from the cluster admin's allow-list")
        good = False
    if name is not None and not name:
        r.problem("spec.lease.name", "must not be empty")
        good = False
    elif name is not None and len(name) > LEASE_NAME_MAX:
        r.problem("spec.lease.name", f"must be at most {LEASE_NAME_MAX} characters, not "
                  f"{len(name)}: the lock is \"<namespace>/<lease.name>\"")
        good = False
    elif name is not None and LEASE_NAME_FORBIDDEN.search(name):
        r.problem("spec.lease.name",
                  f"{name!r} must not contain '/', ':' or control characters: lease.name names "
                  f"a lock inside namespace {namespace} (the lock is "
                  f"\"{namespace_lock(namespace, '<lease.name>')}\"); "
                  "to share a lock with other namespaces, set spec.lease.sharedLock to a "
                  "name the cluster admin's allow-list grants this namespace")
        good = False
    if shared is not None and (len(shared) > SHARED_LOCK_NAME_MAX
                               or not SHARED_LOCK_NAME.fullmatch(shared)):
        r.problem("spec.lease.sharedLock",
                  f"{shared!r} is not a shared lock name: {SHARED_LOCK_NAME_RULE}")
        good = False
    if not good:
        return None
    if shared is not None:
        return shared_lock(shared), shared
    return namespace_lock(namespace, name or gcj_name), None


def _lease_seconds(r: _Reader, lease: Mapping[str, Any], key: str, *, minimum: int
                   ) -> int | None:
    path = f"spec.lease.{key}"
    value = r.integer(lease, key, path, minimum=minimum)
    if value is not None and value > contract.MAX_LEASE_SECONDS:
        r.problem(path, f"must be at most {contract.MAX_LEASE_SECONDS} (7 days), not {value}: "
                  "a run whose pod dies unseen keeps the job locked until its lease ends; "
                  "longer runs use spec.lease.heartbeat, which keeps a short lease alive")
        return None
    return value


def _read_secret_ref(r: _Reader, lease: Mapping[str, Any]) -> SecretKeyRef | None:
    return _read_secret_key_ref(r, lease, "databaseSecretRef", "spec.lease.databaseSecretRef")


def _read_secret_key_ref(r: _Reader, parent: Mapping[str, Any], field: str, path: str
                         ) -> SecretKeyRef | None:
    ref = r.field(parent, field, path, dict, required=True)
    if ref is None:
        return None
    name = r.field(ref, "name", f"{path}.name", str, required=True)
    key = r.field(ref, "key", f"{path}.key", str, required=True)
    if name is not None and not _DNS_SUBDOMAIN.match(name):
        r.problem(f"{path}.name", f"{name!r} is not a valid Secret name")
        name = None
    if key is not None and not _SECRET_KEY.match(key):
        r.problem(f"{path}.key", f"{key!r} is not a valid Secret key "
                  "(letters, digits, '-', '_' and '.')")
        key = None
    if name is None or key is None:
        return None
    return SecretKeyRef(name=name, key=key)


def _check_job_template(r: _Reader, template: Mapping[str, Any], active_deadline: int | None,
                        labels: Mapping[str, str]) -> None:
    path = "spec.jobTemplate"
    _check_template_labels(r, template, f"{path}.metadata", labels)
    job = r.field(template, "spec", f"{path}.spec", dict, required=True)
    if job is None:
        return
    path = f"{path}.spec"
    _expect(r, job, "backoffLimit", path, 0,
            "a failed run is not retried: the next run is the next schedule")
    for key in ("parallelism", "completions"):
        _expect(r, job, key, path, 1, "one pod per run, so one guard decides the run")
    _expect(r, job, "podReplacementPolicy", path, "Failed",
            "no replacement pod may start while the old one is still terminating")
    if job.get("podFailurePolicy") is not None:
        r.problem(f"{path}.podFailurePolicy",
                  "must not be set: guardedcron sets it to fail the Job when the guard skips "
                  "or fails")
    deadline = r.field(job, "activeDeadlineSeconds", f"{path}.activeDeadlineSeconds", int,
                       required=False)
    if deadline is not None and active_deadline is not None and deadline != active_deadline:
        r.problem(f"{path}.activeDeadlineSeconds",
                  f"must be unset or equal to spec.activeDeadlineSeconds ({active_deadline}), "
                  f"not {deadline}")

    pod = r.field(job, "template", f"{path}.template", dict, required=True)
    if pod is None:
        return
    path = f"{path}.template"
    _check_template_labels(r, pod, f"{path}.metadata", labels)
    pod_spec = r.field(pod, "spec", f"{path}.spec", dict, required=True)
    if pod_spec is not None:
        _check_pod_spec(r, pod_spec, f"{path}.spec")


def _expect(r: _Reader, parent: Mapping[str, Any], key: str, path: str, wanted: object,
            why: str) -> None:
    value = parent.get(key)
    if value is not None and (value != wanted or type(value) is not type(wanted)):
        r.problem(f"{path}.{key}", f"must be unset or {wanted} ({why}), not {value!r}")


def _check_template_labels(r: _Reader, template: Mapping[str, Any], path: str,
                           owned: Mapping[str, str]) -> None:
    metadata = r.field(template, "metadata", path, dict, required=False)
    if metadata is None:
        return
    for key in ("labels", "annotations"):
        values = r.field(metadata, key, f"{path}.{key}", dict, required=False) or {}
        for name, value in values.items():
            if not isinstance(value, str):
                r.problem(f"{path}.{key}[{name}]", f"must be a string, not {_describe(value)}")
    labels = metadata.get("labels") or {}
    if not isinstance(labels, dict):
        return
    for key, value in owned.items():
        if key in labels and labels[key] != value:
            r.problem(f"{path}.labels[{key}]",
                      f"is {labels[key]!r}, but guardedcron sets this label to {value!r} to "
                      "link the run to its GuardedCronJob; remove it")


def _check_pod_spec(r: _Reader, pod_spec: Mapping[str, Any], path: str) -> None:
    _expect(r, pod_spec, "restartPolicy", path, "Never",
            "a failed container must fail the run, not restart inside it")
    init_containers = _read_named_list(r, pod_spec, "initContainers", path, required=False,
                                       max_items=MAX_CONTAINERS)
    containers = _read_named_list(r, pod_spec, "containers", path, required=True,
                                  max_items=MAX_CONTAINERS)
    if pod_spec.get("containers") == []:
        r.problem(f"{path}.containers", "must list at least one container")
    volumes = _read_named_list(r, pod_spec, "volumes", path, required=False,
                               max_items=MAX_VOLUMES)

    for list_path, items in (*init_containers.items(), *containers.items()):
        for index, container in enumerate(items):
            item_path = f"{list_path}[{index}]"
            if container.get("name") in RESERVED_CONTAINER_NAMES:
                r.problem(f"{item_path}.name",
                          f"{container['name']!r} is reserved for the container guardedcron "
                          "injects; rename this container")
            _check_mounts(r, container, item_path)
    for list_path, items in volumes.items():
        for index, volume in enumerate(items):
            if volume.get("name") == RESERVED_VOLUME_NAME:
                r.problem(f"{list_path}[{index}].name",
                          f"{RESERVED_VOLUME_NAME!r} is reserved for the volume guardedcron "
                          f"mounts at {contract.RUN_DIR}; rename this volume")
            elif volume.get("name") in RESERVED_TLS_VOLUME_NAMES:
                r.problem(f"{list_path}[{index}].name",
                          f"{volume['name']!r} is reserved for the volumes guardedcron gives "
                          "the guard and the keeper for spec.lease.tls; rename this volume")


def _read_named_list(r: _Reader, parent: Mapping[str, Any], key: str, path: str, *,
                     required: bool, max_items: int) -> dict[str, list[dict[str, Any]]]:
    """{path: items} when `key` is a list of objects that each have a name; else {}."""
    path = f"{path}.{key}"
    items = r.field(parent, key, path, list, required=required)
    if items is None:
        return {}
    good = True
    if len(items) > max_items:
        r.problem(path, f"must have at most {max_items} items, not {len(items)}")
        good = False
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            r.problem(f"{path}[{index}]", f"must be an object, not {_describe(item)}")
            good = False
        elif r.text(item, "name", f"{path}[{index}].name", required=True,
                    max_length=MAX_CONTAINER_NAME_LENGTH) is None:
            good = False
    return {path: items} if good else {}


def _check_mounts(r: _Reader, container: Mapping[str, Any], path: str) -> None:
    mounts = r.field(container, "volumeMounts", f"{path}.volumeMounts", list, required=False)
    for index, mount in enumerate(mounts or ()):
        mount_path = f"{path}.volumeMounts[{index}]"
        if not isinstance(mount, dict):
            r.problem(mount_path, f"must be an object, not {_describe(mount)}")
            continue
        if mount.get("name") == RESERVED_VOLUME_NAME:
            r.problem(f"{mount_path}.name",
                      f"{RESERVED_VOLUME_NAME!r} is reserved: guardedcron mounts it in every "
                      f"container at {contract.RUN_DIR}; remove this mount")
        target = mount.get("mountPath")
        if isinstance(target, str) and posixpath.normpath(target) == RESERVED_MOUNT_PATH:
            r.problem(f"{mount_path}.mountPath",
                      f"{RESERVED_MOUNT_PATH} is reserved for the fence and lease files "
                      "guardedcron mounts there; mount this volume elsewhere")
