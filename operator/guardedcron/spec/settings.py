"""The operator's settings: every environment variable and flag of `guardedcron operator`.

Two parts, read once and passed down frozen:
- `OperatorSettings`: what the operator puts into every CronJob besides the user's
  spec (the guard's image, resources, user...), from the environment only. The
  builders need it, and `guardedcron render` reads just this part
  (`settings_from_env`), so it lives beside the spec, below the builders.
- `Settings`: all of it, the above plus how the operator runs (namespaces, peering,
  metrics, switches), from the environment and the command line, whose flags win.
  `guardedcron operator` builds it once (`read_settings`) and the handlers' context
  carries it.
Every variable's name is here and nowhere else in the operator.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from guardedcron import __version__
from guardedcron.spec.errors import Problem
from guardedcron.spec.locks import (
    SHARED_LOCK_NAME,
    SHARED_LOCK_NAME_MAX,
    SHARED_LOCK_NAME_RULE,
    SharedLock,
)
from guardedcron.spec.model import SecretKeyRef

# How the operator runs.
ENV_NAMESPACES = "GUARDEDCRON_NAMESPACES"
ENV_PEERING = "GUARDEDCRON_PEERING"
ENV_PRIORITY = "GUARDEDCRON_PRIORITY"
ENV_POD_IP = "GUARDEDCRON_POD_IP"
ENV_METRICS_PORT = "GUARDEDCRON_METRICS_PORT"
ENV_LOG_LEVEL = "GUARDEDCRON_LOG_LEVEL"
ENV_STOP_WORKLOAD = "GUARDEDCRON_STOP_WORKLOAD"
ENV_OUTCOME_RECORDING = "GUARDEDCRON_OUTCOME_RECORDING"
# How many slots in a row without a success make guardedcron_success_overdue_timestamp_seconds
# pass (the chart writes it from metrics.prometheusRule.noSuccessSlots).
ENV_NO_SUCCESS_SLOTS = "GUARDEDCRON_NO_SUCCESS_SLOTS"
# The allow-list of locks shared across namespaces (spec.locks), as JSON:
# [{"name": "ledger-close", "namespaces": ["finance", "billing"]}]; the chart writes it
# from its value `sharedLocks`.
ENV_SHARED_LOCKS = "GUARDEDCRON_SHARED_LOCKS"
CHART_VALUE_SHARED_LOCKS = "sharedLocks"
SHARED_LOCKS_SETTING = (f"the chart value {CHART_VALUE_SHARED_LOCKS} (the operator's "
                        f"environment variable {ENV_SHARED_LOCKS})")
# What goes into every CronJob.
ENV_GUARD_IMAGE = "GUARDEDCRON_GUARD_IMAGE"
ENV_GUARD_IMAGE_PULL_POLICY = "GUARDEDCRON_GUARD_IMAGE_PULL_POLICY"
# Comma-separated Secret names added to every run pod's imagePullSecrets (chart value
# guard.imagePullSecrets); each must exist in the job's own namespace.
ENV_GUARD_IMAGE_PULL_SECRETS = "GUARDEDCRON_GUARD_IMAGE_PULL_SECRETS"
ENV_CLUSTER_NAME = "GUARDEDCRON_CLUSTER_NAME"
ENV_GUARD_CPU_REQUEST = "GUARDEDCRON_GUARD_CPU_REQUEST"
ENV_GUARD_MEMORY_REQUEST = "GUARDEDCRON_GUARD_MEMORY_REQUEST"
ENV_GUARD_CPU_LIMIT = "GUARDEDCRON_GUARD_CPU_LIMIT"
ENV_GUARD_MEMORY_LIMIT = "GUARDEDCRON_GUARD_MEMORY_LIMIT"
# Empty: no runAsUser/runAsGroup on the guard and keeper, so the pod's own or the
# platform's (OpenShift assigns one) applies; unset: the default below.
ENV_GUARD_RUN_AS_USER = "GUARDEDCRON_GUARD_RUN_AS_USER"
ENV_RUN_VOLUME_SIZE_LIMIT = "GUARDEDCRON_RUN_VOLUME_SIZE_LIMIT"
# The check-in URL's Secret for jobs that name none (chart value checkIn.secretName/.secretKey).
ENV_CHECK_IN_SECRET_NAME = "GUARDEDCRON_CHECK_IN_SECRET_NAME"
ENV_CHECK_IN_SECRET_KEY = "GUARDEDCRON_CHECK_IN_SECRET_KEY"

BOOLEANS: Mapping[str, bool] = {"true": True, "false": False, "": False}
PRIORITY_FROM_POD_IP = "pod-ip"
DEFAULT_METRICS_PORT = 9090
DEFAULT_LOG_LEVEL = "info"
DEFAULT_NO_SUCCESS_SLOTS = 2
MAX_NO_SUCCESS_SLOTS = 1000  # as the chart's schema; each pass walks this many fire times
LOG_LEVELS: Mapping[str, int] = {
    "debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
}
_IPV6_PRIORITY_BITS = 31

# The operator's own image carries the guard CLI, so the default follows the release.
DEFAULT_GUARD_IMAGE = f"ghcr.io/guardedcron/guardedcron:{__version__}"
DEFAULTS: Mapping[str, str] = {
    ENV_GUARD_IMAGE: DEFAULT_GUARD_IMAGE,
    ENV_GUARD_IMAGE_PULL_POLICY: "IfNotPresent",
    ENV_GUARD_IMAGE_PULL_SECRETS: "",  # none
    ENV_CLUSTER_NAME: "",
    # A Python process with psycopg: about 30 MiB resident. The CPU limit is loose on
    # purpose: the guard's start-up delays every run, and throttling would stretch it.
    ENV_GUARD_CPU_REQUEST: "10m",
    ENV_GUARD_MEMORY_REQUEST: "48Mi",
    ENV_GUARD_CPU_LIMIT: "500m",
    ENV_GUARD_MEMORY_LIMIT: "128Mi",
    ENV_GUARD_RUN_AS_USER: "65532",  # the "nonroot" user of distroless-style images
    ENV_RUN_VOLUME_SIZE_LIMIT: "1Mi",  # holds two tiny files; counts against pod memory
    ENV_CHECK_IN_SECRET_NAME: "",  # no default check-in
    ENV_CHECK_IN_SECRET_KEY: "url",
}

PULL_POLICIES = ("Always", "IfNotPresent", "Never")
MAX_USER_ID = 2**31 - 1  # the API server refuses a runAsUser above this
_QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE]\d+)?$")
# The holder is "<cluster>/<namespace>/<pod>": the cluster part may not hold a '/'.
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_IMAGE = re.compile(r"^[^\s$]+$")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a namespace name, whole
# As the CRD's secretKeyRef fields (spec/parse.py): a Secret name and a key in it.
_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


@dataclass(frozen=True)
class GuardResources:
    """Requests and limits of the injected guard and keeper; None leaves that one unset."""

    cpu_request: str | None
    memory_request: str | None
    cpu_limit: str | None
    memory_limit: str | None


@dataclass(frozen=True)
class OperatorSettings:
    guard_image: str
    guard_image_pull_policy: str
    cluster_name: str | None  # prefixes lease holders, so two clusters sharing a database differ
    guard_resources: GuardResources
    guard_run_as_user: int | None  # None: leave the user and group to the pod or the platform
    run_volume_size_limit: str
    # The Secret (in each job's namespace) of the check-in URL for jobs whose spec.checkIn
    # names none; None: no default check-in. Applied by the builder, never to the spec.
    check_in_secret: SecretKeyRef | None = None
    # Added, after the user's own, to every run pod's imagePullSecrets: the guard's image
    # may need them whatever the workload's image does.
    guard_image_pull_secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Flags:
    """What `guardedcron operator`'s command line gave, each winning over its variable;
    None (or empty, or False): not given."""

    namespaces: tuple[str, ...] = ()  # --namespace, repeatable; over $GUARDEDCRON_NAMESPACES
    peering: str | None = None  # --peering
    standalone: bool = False  # --standalone: no peering, whatever $GUARDEDCRON_PEERING says
    priority: str | None = None  # --priority
    metrics_port: str | None = None  # --metrics-port
    log_level: str | None = None  # --log-level
    liveness: str | None = None  # --liveness (no variable)


@dataclass(frozen=True)
class Settings:
    """Every setting of `guardedcron operator`; the defaults are an empty environment's."""

    build: OperatorSettings  # what goes into every CronJob
    namespaces: tuple[str, ...] = ()  # exact names watched; empty: the whole cluster
    peering: str | None = None  # kopf peering object; None: standalone
    priority: int = 0  # peering priority
    metrics_port: int = DEFAULT_METRICS_PORT  # 0: no metrics endpoint
    log_level: str = DEFAULT_LOG_LEVEL  # a key of LOG_LEVELS
    liveness: str | None = None  # kopf's health endpoint URL
    # Allowed to delete pods for spec.lease.onLost: StopWorkload (the chart grants it).
    stop_workload: bool = False
    # Reads DSN Secrets to record finished runs in the database (the chart grants it).
    outcome_recording: bool = False
    # The cluster admin's allow-list: which namespaces may take which shared locks.
    shared_locks: tuple[SharedLock, ...] = ()
    # Slots in a row without a success before the success-overdue deadline passes.
    no_success_slots: int = DEFAULT_NO_SUCCESS_SLOTS


class SettingsError(ValueError):
    """Bad operator settings; each problem names the environment variable."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in problems))


def settings_from_env(env: Mapping[str, str]) -> OperatorSettings:
    """Read the settings from `env` (pass `os.environ`); unset or empty means the default,
    except for the resources and the user, where an empty value leaves that field unset."""
    problems: list[Problem] = []

    def read(name: str, *, empty_is_default: bool = True) -> str:
        value = env.get(name)
        if value is None or (empty_is_default and value == ""):
            return DEFAULTS[name]
        return value.strip()

    image = read(ENV_GUARD_IMAGE)
    if not _IMAGE.match(image):
        problems.append(Problem(ENV_GUARD_IMAGE, f"{image!r} is not an image reference"))
    pull_policy = read(ENV_GUARD_IMAGE_PULL_POLICY)
    if pull_policy not in PULL_POLICIES:
        problems.append(Problem(ENV_GUARD_IMAGE_PULL_POLICY,
                                f"must be one of {', '.join(PULL_POLICIES)}, not {pull_policy!r}"))
    cluster = read(ENV_CLUSTER_NAME)
    if cluster and not _CLUSTER_NAME.match(cluster):
        problems.append(Problem(ENV_CLUSTER_NAME,
                                f"{cluster!r} must be 1-63 letters, digits, '-', '_' or '.', "
                                "starting and ending with a letter or digit"))

    def quantity(name: str, *, optional: bool) -> str | None:
        value = read(name, empty_is_default=not optional)
        if optional and value == "":
            return None
        if not _QUANTITY.match(value):
            problems.append(Problem(name, f"{value!r} is not a Kubernetes quantity"))
        return value

    resources = GuardResources(
        cpu_request=quantity(ENV_GUARD_CPU_REQUEST, optional=True),
        memory_request=quantity(ENV_GUARD_MEMORY_REQUEST, optional=True),
        cpu_limit=quantity(ENV_GUARD_CPU_LIMIT, optional=True),
        memory_limit=quantity(ENV_GUARD_MEMORY_LIMIT, optional=True),
    )
    size_limit = quantity(ENV_RUN_VOLUME_SIZE_LIMIT, optional=False) or ""
    user_text = read(ENV_GUARD_RUN_AS_USER, empty_is_default=False)
    user = int(user_text) if user_text.isascii() and user_text.isdigit() else None
    if user_text and (user is None or not 1 <= user <= MAX_USER_ID):  # runAsNonRoot: not 0
        problems.append(Problem(ENV_GUARD_RUN_AS_USER,
                                f"must be a user id above 0 (at most {MAX_USER_ID}) or empty "
                                f"to leave it to the platform, not {user_text!r}"))

    pull_secrets = tuple(dict.fromkeys(
        name.strip() for name in read(ENV_GUARD_IMAGE_PULL_SECRETS).split(",") if name.strip()))
    for bad in (n for n in pull_secrets if len(n) > 253 or not _SECRET_NAME.fullmatch(n)):
        problems.append(Problem(ENV_GUARD_IMAGE_PULL_SECRETS,
                                f"{bad!r} is not a Secret name (a comma-separated list is expected)"))

    check_in_name = read(ENV_CHECK_IN_SECRET_NAME)
    check_in_key = read(ENV_CHECK_IN_SECRET_KEY)
    if check_in_name and (len(check_in_name) > 253 or not _SECRET_NAME.fullmatch(check_in_name)):
        problems.append(Problem(ENV_CHECK_IN_SECRET_NAME, f"{check_in_name!r} is not a Secret name"))
    if len(check_in_key) > 253 or not _SECRET_KEY.fullmatch(check_in_key):
        problems.append(Problem(ENV_CHECK_IN_SECRET_KEY, f"{check_in_key!r} is not a Secret key "
                                "(letters, digits, '-', '_' and '.')"))

    if problems:
        raise SettingsError(problems)
    return OperatorSettings(
        guard_image=image, guard_image_pull_policy=pull_policy, cluster_name=cluster or None,
        guard_resources=resources, guard_run_as_user=user, run_volume_size_limit=size_limit,
        check_in_secret=SecretKeyRef(name=check_in_name, key=check_in_key) if check_in_name else None,
        guard_image_pull_secrets=pull_secrets,
    )


def read_settings(env: Mapping[str, str], flags: Flags = Flags()) -> Settings:
    """Every setting, from `env` (pass `os.environ`) and the command line's `flags`, which
    win; every bad value is a problem naming the variable or flag it came from, those of
    how the operator runs first."""
    problems: list[Problem] = []

    def pick(flag: str, variable: str) -> tuple[str, str]:
        value = getattr(flags, flag)
        if value is not None:
            return str(value), "--" + flag.replace("_", "-")
        return env.get(variable, "").strip(), variable

    if flags.namespaces:
        names, source = [n.strip() for n in flags.namespaces], "--namespace"
    else:
        names, source = [n.strip() for n in env.get(ENV_NAMESPACES, "").split(",")], ENV_NAMESPACES
    namespaces = tuple(dict.fromkeys(n for n in names if n))
    for bad in (n for n in namespaces if not _is_dns_label(n)):
        problems.append(Problem(source, f"{bad!r} is not a namespace name"))

    peering = None if flags.standalone else pick("peering", ENV_PEERING)[0] or None

    priority_text, priority_source = pick("priority", ENV_PRIORITY)
    priority = 0
    if priority_text == PRIORITY_FROM_POD_IP:
        pod_ip = env.get(ENV_POD_IP, "").strip()
        try:
            priority = priority_from_ip(pod_ip)
        except ValueError:
            problems.append(Problem(ENV_POD_IP, f"{pod_ip!r} is not an IP address "
                                                f"({priority_source} is {PRIORITY_FROM_POD_IP})"))
    elif priority_text:
        try:
            priority = int(priority_text)
        except ValueError:
            problems.append(Problem(priority_source,
                                    f"must be an integer or {PRIORITY_FROM_POD_IP}, not {priority_text!r}"))

    port_text, port_source = pick("metrics_port", ENV_METRICS_PORT)
    port = DEFAULT_METRICS_PORT
    if port_text:
        port = int(port_text) if port_text.isdigit() else -1
        if not 0 <= port <= 65535:
            problems.append(Problem(port_source,
                                    f"must be a port number 0-65535 (0: off), not {port_text!r}"))

    level, level_source = pick("log_level", ENV_LOG_LEVEL)
    level = level.lower() or DEFAULT_LOG_LEVEL
    if level not in LOG_LEVELS:
        problems.append(Problem(level_source, f"must be one of {', '.join(LOG_LEVELS)}, not {level!r}"))

    switches: dict[str, bool] = {}
    for variable in (ENV_STOP_WORKLOAD, ENV_OUTCOME_RECORDING):
        text = env.get(variable, "").strip().lower()
        if text not in BOOLEANS:
            problems.append(Problem(variable, f"must be true or false, not {text!r}"))
        switches[variable] = BOOLEANS.get(text, False)

    shared_locks = read_shared_locks(env.get(ENV_SHARED_LOCKS, ""), problems)
    no_success_slots = read_no_success_slots(env.get(ENV_NO_SUCCESS_SLOTS, "").strip(), problems)

    build: OperatorSettings | None = None
    try:
        build = settings_from_env(env)
    except SettingsError as error:
        problems.extend(error.problems)
    if problems or build is None:
        raise SettingsError(problems)
    return Settings(build=build, namespaces=namespaces, peering=peering, priority=priority,
                    metrics_port=port, log_level=level, liveness=flags.liveness,
                    stop_workload=switches[ENV_STOP_WORKLOAD],
                    outcome_recording=switches[ENV_OUTCOME_RECORDING],
                    shared_locks=shared_locks, no_success_slots=no_success_slots)


def read_shared_locks(text: str, problems: list[Problem]) -> tuple[SharedLock, ...]:
    """The allow-list from its JSON text (empty: none); each problem is added to `problems`
    naming the variable and the entry, and a bad allow-list grants nothing."""
    if not text.strip():
        return ()
    try:
        entries: Any = json.loads(text)
    except ValueError as error:
        problems.append(Problem(ENV_SHARED_LOCKS, f"is not JSON ({error}); expected a list "
                                'such as [{"name": "ledger-close", "namespaces": ["finance", '
                                '"billing"]}]'))
        return ()
    if not isinstance(entries, list):
        problems.append(Problem(ENV_SHARED_LOCKS, "must be a JSON list of "
                                '{"name": ..., "namespaces": [...]} objects'))
        return ()
    found: list[Problem] = []
    result: dict[str, SharedLock] = {}
    for index, entry in enumerate(entries):
        where = f"{ENV_SHARED_LOCKS}[{index}]"
        if not isinstance(entry, dict) or set(entry) != {"name", "namespaces"}:
            found.append(Problem(where, 'must be an object with exactly "name" and "namespaces"'))
            continue
        name, namespaces = entry["name"], entry["namespaces"]
        if not isinstance(name, str) or len(name) > SHARED_LOCK_NAME_MAX \
                or not SHARED_LOCK_NAME.fullmatch(name):
            found.append(Problem(f"{where}.name",
                                 f"{name!r} is not a shared lock name: {SHARED_LOCK_NAME_RULE}"))
        elif name in result:
            found.append(Problem(f"{where}.name", f"{name!r} is listed twice; list it once "
                                 "with all its namespaces"))
        if not isinstance(namespaces, list) or not namespaces:
            found.append(Problem(f"{where}.namespaces", "must be a non-empty list of namespaces"))
            continue
        bad = [n for n in namespaces if not isinstance(n, str) or not _is_dns_label(n)]
        if bad:
            found.append(Problem(f"{where}.namespaces",
                                 f"{', '.join(map(repr, bad))} is not a namespace name"))
        elif isinstance(name, str):
            result.setdefault(name, SharedLock(name=name, namespaces=frozenset(namespaces)))
    problems.extend(found)
    return () if found else tuple(result.values())


def read_no_success_slots(text: str, problems: list[Problem]) -> int:
    """The slot count from its text (empty: the default); a bad one is a problem."""
    if not text:
        return DEFAULT_NO_SUCCESS_SLOTS
    if text.isdigit() and 1 <= int(text) <= MAX_NO_SUCCESS_SLOTS:
        return int(text)
    problems.append(Problem(ENV_NO_SUCCESS_SLOTS,
                            f"must be a whole number 1-{MAX_NO_SUCCESS_SLOTS}, not {text!r}"))
    return DEFAULT_NO_SUCCESS_SLOTS


def priority_from_ip(text: str) -> int:
    """A peering priority unique per pod: the IPv4 address as an integer, or the low 31
    bits of an IPv6 one. kopf pauses every operator of equal priority, so they must differ."""
    address = ipaddress.ip_address(text)
    value = int(address)
    return value if address.version == 4 else value & ((1 << _IPV6_PRIORITY_BITS) - 1)


def _is_dns_label(name: str) -> bool:
    return _DNS_LABEL.fullmatch(name) is not None
