"""The containers and volume guardedcron injects into every run's pod (pure).

See docs/design.md, "Generated CronJob": the guard takes the lease before any workload
container starts, the optional keeper renews it, and the shared volume hands the fence
token to the workload.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

from guardedcron import contract
from guardedcron.objects import get_path
from guardedcron.spec import OperatorSettings, ParsedSpec, SecretKeyRef

# Composed in the pod from the downward API, so each pod holds the lease under its own name.
ENV_HOLDER = "GUARDEDCRON_HOLDER"
GUARD_COMMAND = "guardedcron"
FENCE_PATH = f"{contract.RUN_DIR}/{contract.FENCE_FILE}"
KEEPER_READY_PATH = f"{contract.RUN_DIR}/{contract.KEEPER_READY_FILE}"
# libpq's own variables for its TLS files (a DSN's sslrootcert, sslcert, sslkey win over them).
ENV_LIBPQ_ROOT_CERT = "PGSSLROOTCERT"
ENV_LIBPQ_CERT = "PGSSLCERT"
ENV_LIBPQ_KEY = "PGSSLKEY"
# Secret volumes' files readable by any user: the guard's user is the platform's or the
# image's choice and the pod need not set fsGroup (the key is copied, see ENV_TLS_KEY_SOURCE).
TLS_SECRET_MODE = 0o444


def literal_arg(value: str) -> str:
    """Protect a literal from Kubernetes' $(VAR) expansion in command and args."""
    return value.replace("$", "$$")


def build_guard_container(parsed: ParsedSpec, settings: OperatorSettings) -> dict[str, Any]:
    """The first init container: `guardedcron acquire`, exit 75 when the run must be skipped."""
    lease = parsed.spec.lease
    args = [
        "acquire",
        "--lock", literal_arg(lease.name),
        "--holder", f"$({ENV_HOLDER})",
        "--lease-seconds", str(lease.duration_seconds),
        "--min-hold-seconds", str(lease.min_hold_seconds),
        "--job-name", f"$({contract.ENV_JOB_NAME})",
        "--cronjob", literal_arg(parsed.name),
        "--out", contract.RUN_DIR,
        *_run_context_args(parsed),
    ]
    env = [*_identity_env(settings, with_job_name=True), _dsn_env(parsed), *_tls_env(parsed)]
    return _injected_container(contract.GUARD_CONTAINER, args, env, settings,
                               _tls_mounts(parsed))


def _run_context_args(parsed: ParsedSpec) -> list[str]:
    """The guard's time zone, when it needs it: for repeatedTime Once (its slot key), for
    skippedTime RunAtNextMinute (the runs the operator starts name a wall time, which the
    guard checks and turns into their scheduled time) or for spec.runContext.env (the
    scheduled time in lease.json). Otherwise none, so that the CronJob of a spec using
    none of them stays as it was."""
    spec = parsed.spec
    once = spec.dst_policy.repeated_time == "Once"
    skipped = spec.dst_policy.skipped_time == "RunAtNextMinute"
    if not (once or skipped or spec.run_context_env):
        return []
    args = ["--time-zone", literal_arg(spec.time_zone or "UTC")]
    return [*args, "--repeated-time", "Once"] if once else args


def run_context_env(parsed: ParsedSpec) -> list[dict[str, Any]]:
    """The run context's static values for the workload's containers (spec.runContext.env;
    docs/design.md, "Run context"); the per-run values are in lease.json."""
    if not parsed.spec.run_context_env:
        return []
    values = (
        (contract.ENV_LOCK, parsed.spec.lease.name),
        (contract.ENV_TIME_ZONE, parsed.spec.time_zone or "UTC"),
        (contract.ENV_SCHEDULE, parsed.spec.schedule_text),
        (contract.ENV_GUARDED_CRONJOB, parsed.name),
        (contract.ENV_LEASE_FILE, f"{contract.RUN_DIR}/{contract.LEASE_FILE}"),
        (contract.ENV_FENCE_FILE, FENCE_PATH),
    )
    # Kubernetes expands $(VAR) in env values too: a lock with '$' must stay literal.
    return [{"name": name, "value": literal_arg(value)} for name, value in values]


def mark_run_kind(job: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """A copy of a Job built from the CronJob's template whose guard says, in lease.json,
    that the operator started it for a past slot or a skipped wall time (`kind`:
    contract.RUN_KIND_CATCH_UP, RUN_KIND_BACKFILL or RUN_KIND_SKIPPED_TIME)."""
    marked = copy.deepcopy(dict(job))
    containers = get_path(marked, "spec", "template", "spec", "initContainers")
    for container in containers if isinstance(containers, list) else ():
        if isinstance(container, dict) and container.get("name") == contract.GUARD_CONTAINER:
            container["args"] = [*(container.get("args") or ()),
                                 contract.GUARD_RUN_KIND_FLAG, kind]
    return marked


def build_keeper_container(parsed: ParsedSpec, settings: OperatorSettings) -> dict[str, Any]:
    """The native sidecar (`restartPolicy: Always`) that renews the lease while the workload
    runs and releases it when the pod ends; it reads the fence the guard wrote, since no
    one knows it when the pod is created. The workload waits for its startupProbe."""
    lease = parsed.spec.lease
    args = [
        "keep",
        "--lock", literal_arg(lease.name),
        "--holder", f"$({ENV_HOLDER})",
        "--fence-file", FENCE_PATH,
        "--lease-seconds", str(lease.duration_seconds),
        "--out", contract.RUN_DIR,
    ]
    env = [*_identity_env(settings, with_job_name=False), _dsn_env(parsed), *_tls_env(parsed)]
    check_in = parsed.spec.check_in or settings.check_in_secret
    if check_in is not None:
        args.append(contract.KEEPER_CHECK_IN_FLAG)
        env.append(_check_in_env(check_in))
    container = _injected_container(contract.KEEPER_CONTAINER, args, env, settings,
                                    _tls_mounts(parsed))
    container["restartPolicy"] = "Always"
    container["startupProbe"] = build_keeper_startup_probe()
    return container


def build_keeper_startup_probe() -> dict[str, Any]:
    """The kubelet starts a native sidecar's followers (the workload) only once its
    startupProbe passes: here, once the keeper says SIGTERM would release the lease. All
    of the probe's fields are written, as the API server would default them."""
    return {
        "exec": {"command": ["test", "-e", KEEPER_READY_PATH]},
        "periodSeconds": 1,
        "timeoutSeconds": 1,
        "successThreshold": 1,
        "failureThreshold": contract.KEEPER_STARTUP_PROBES,
    }


def locks_in_cronjob(cronjob: Mapping[str, Any]) -> set[str]:
    """Every lock a live CronJob's runs would take, read back from where the builders put
    it: the lock annotation and the `--lock` of each injected container (unescaped)."""
    locks: set[str] = set()
    annotation = ((cronjob.get("metadata") or {}).get("annotations") or {}).get(
        contract.ANNOTATION_LOCK)
    if isinstance(annotation, str):
        locks.add(annotation)
    containers = get_path(cronjob, "spec", "jobTemplate", "spec", "template", "spec",
                          "initContainers")
    for container in containers if isinstance(containers, list) else ():
        if not isinstance(container, Mapping) or container.get("name") not in (
                contract.GUARD_CONTAINER, contract.KEEPER_CONTAINER):
            continue
        args = container.get("args")
        args = args if isinstance(args, list) else []
        for flag, value in pairwise(args):
            if flag == "--lock" and isinstance(value, str):
                locks.add(value.replace("$$", "$"))
    return locks


def merge_image_pull_secrets(own: Any, settings: OperatorSettings) -> list[Any]:
    """The pod's imagePullSecrets: the user's own in their order, then the operator's (the
    guard's image may need them); a name listed twice is kept once, where it came first,
    since server-side apply refuses a list keyed by name that repeats one. An entry
    without a name is left as written, for the API server to refuse."""
    items = [*(own if isinstance(own, list) else ()),
             *({"name": name} for name in settings.guard_image_pull_secrets)]
    merged: dict[object, Any] = {}
    for index, item in enumerate(items):
        name = item.get("name") if isinstance(item, Mapping) else None
        key = name if isinstance(name, str) and name else ("as written", index)
        merged.setdefault(key, dict(item) if isinstance(item, Mapping) else item)
    return list(merged.values())


def build_run_volume(settings: OperatorSettings) -> dict[str, Any]:
    """Memory-backed, so the fence never touches the node's disk, and small."""
    return {
        "name": contract.RUN_VOLUME,
        "emptyDir": {"medium": "Memory", "sizeLimit": settings.run_volume_size_limit},
    }


def build_tls_volumes(parsed: ParsedSpec, settings: OperatorSettings) -> list[dict[str, Any]]:
    """spec.lease.tls's Secrets, each key at a fixed file name, and the memory-backed volume
    the guard and the keeper copy the client key into (only they mount these); none
    without spec.lease.tls."""
    tls = parsed.spec.lease.tls
    if tls is None:
        return []
    volumes = []
    if tls.ca is not None:
        volumes.append(_secret_volume(contract.TLS_CA_VOLUME, tls.ca.name,
                                      {tls.ca.key: contract.TLS_CA_FILE}))
    if tls.client_secret is not None:
        files = {contract.TLS_CLIENT_CERT_FILE: contract.TLS_CLIENT_CERT_FILE,
                 contract.TLS_CLIENT_KEY_FILE: contract.TLS_CLIENT_KEY_FILE}
        volumes.append(_secret_volume(contract.TLS_CLIENT_VOLUME, tls.client_secret, files))
        volumes.append({"name": contract.TLS_KEY_VOLUME,
                        "emptyDir": {"medium": "Memory",
                                     "sizeLimit": settings.run_volume_size_limit}})
    return volumes


def _secret_volume(name: str, secret: str, files: Mapping[str, str]) -> dict[str, Any]:
    # Only the keys named, so a Secret without one fails the pod's start with the kubelet
    # naming the key, rather than the guard later with a missing file.
    return {"name": name,
            "secret": {"secretName": secret, "defaultMode": TLS_SECRET_MODE,
                       "items": [{"key": key, "path": path} for key, path in files.items()]}}


def _tls_mounts(parsed: ParsedSpec) -> list[dict[str, Any]]:
    tls = parsed.spec.lease.tls
    if tls is None:
        return []
    mounts = []
    if tls.ca is not None:
        mounts.append({"name": contract.TLS_CA_VOLUME, "mountPath": contract.TLS_CA_DIR,
                       "readOnly": True})
    if tls.client_secret is not None:
        mounts.append({"name": contract.TLS_CLIENT_VOLUME, "mountPath": contract.TLS_CLIENT_DIR,
                       "readOnly": True})
        mounts.append({"name": contract.TLS_KEY_VOLUME, "mountPath": contract.TLS_KEY_DIR})
    return mounts


def _tls_env(parsed: ParsedSpec) -> list[dict[str, Any]]:
    """libpq pointed at spec.lease.tls's files; the client key at the copy the guard makes."""
    tls = parsed.spec.lease.tls
    if tls is None:
        return []
    env = []
    if tls.ca is not None:
        env.append({"name": ENV_LIBPQ_ROOT_CERT,
                    "value": f"{contract.TLS_CA_DIR}/{contract.TLS_CA_FILE}"})
    if tls.client_secret is not None:
        env += [
            {"name": ENV_LIBPQ_CERT,
             "value": f"{contract.TLS_CLIENT_DIR}/{contract.TLS_CLIENT_CERT_FILE}"},
            {"name": ENV_LIBPQ_KEY, "value": f"{contract.TLS_KEY_DIR}/{contract.TLS_CLIENT_KEY_FILE}"},
            {"name": contract.ENV_TLS_KEY_SOURCE,
             "value": f"{contract.TLS_CLIENT_DIR}/{contract.TLS_CLIENT_KEY_FILE}"},
        ]
    return env


def build_workload_mount() -> dict[str, Any]:
    """The run volume as the workload sees it: readable, never writable."""
    return {"name": contract.RUN_VOLUME, "mountPath": contract.RUN_DIR, "readOnly": True}


def _injected_container(name: str, args: list[str], env: list[dict[str, Any]],
                        settings: OperatorSettings,
                        tls_mounts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": name,
        "image": settings.guard_image,
        "imagePullPolicy": settings.guard_image_pull_policy,
        "command": [GUARD_COMMAND],
        "args": args,
        "env": env,
        "resources": _resources(settings),
        "securityContext": _restricted_security_context(settings),
        # The guard's own one-line result when it wrote one, else the tail of its log.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": contract.RUN_VOLUME, "mountPath": contract.RUN_DIR},
                         *tls_mounts],
    }


def _identity_env(settings: OperatorSettings, *, with_job_name: bool) -> list[dict[str, Any]]:
    # Order matters: Kubernetes expands $(VAR) only from variables defined earlier.
    env = [
        _field_env(contract.ENV_POD_NAMESPACE, "metadata.namespace"),
        _field_env(contract.ENV_POD_NAME, "metadata.name"),
    ]
    if with_job_name:
        env.append(_field_env(contract.ENV_JOB_NAME,
                              f"metadata.labels['{contract.LABEL_JOB_NAME}']"))
    pod = f"$({contract.ENV_POD_NAMESPACE})/$({contract.ENV_POD_NAME})"
    holder = f"{settings.cluster_name}/{pod}" if settings.cluster_name else pod
    env.append({"name": ENV_HOLDER, "value": holder})
    return env


def _field_env(name: str, field_path: str) -> dict[str, Any]:
    # apiVersion is what the API server would default; writing it keeps desired == live.
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}}


def _dsn_env(parsed: ParsedSpec) -> dict[str, Any]:
    # The kubelet reads the Secret for the pod; the operator never sees the DSN.
    ref = parsed.spec.lease.database_secret_ref
    return {"name": contract.ENV_DSN,
            "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def _check_in_env(ref: SecretKeyRef) -> dict[str, Any]:
    # The URL carries the check's key: env from the Secret, never args. Optional, so that a
    # missing Secret costs the pings (the keeper says so; the external service pages for
    # the missed ones) and never the run: the keeper starts after the lease is won, and a
    # keeper that cannot start would leave the lease held until it ran out.
    return {"name": contract.ENV_CHECK_IN_URL,
            "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key, "optional": True}}}


def _resources(settings: OperatorSettings) -> dict[str, Any]:
    amounts = settings.guard_resources
    requests = {k: v for k, v in (("cpu", amounts.cpu_request),
                                  ("memory", amounts.memory_request)) if v is not None}
    limits = {k: v for k, v in (("cpu", amounts.cpu_limit),
                                ("memory", amounts.memory_limit)) if v is not None}
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def _restricted_security_context(settings: OperatorSettings) -> dict[str, Any]:
    """Meets the Pod Security Standard "restricted", so namespaces enforcing it accept the pod.
    Without a user id in the settings the user and group are left out: the pod's
    securityContext, the platform (OpenShift's restricted SCC assigns a uid from the
    namespace's range and refuses any other) or the image's USER decides, still non-root."""
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }
    if settings.guard_run_as_user is not None:
        context["runAsUser"] = settings.guard_run_as_user
        context["runAsGroup"] = settings.guard_run_as_user
    return context | {"seccompProfile": {"type": "RuntimeDefault"}}
