"""The operator's own settings: what it puts into every CronJob besides the user's spec.

They live beside the spec because the builders need both and sit above this layer;
the handlers and `guardedcron render` read them from the environment once, through
`settings_from_env(os.environ)`, and pass the frozen value down.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from guardedcron import __version__
from guardedcron.spec.errors import Problem

ENV_GUARD_IMAGE = "GUARDEDCRON_GUARD_IMAGE"
ENV_GUARD_IMAGE_PULL_POLICY = "GUARDEDCRON_GUARD_IMAGE_PULL_POLICY"
ENV_CLUSTER_NAME = "GUARDEDCRON_CLUSTER_NAME"
ENV_GUARD_CPU_REQUEST = "GUARDEDCRON_GUARD_CPU_REQUEST"
ENV_GUARD_MEMORY_REQUEST = "GUARDEDCRON_GUARD_MEMORY_REQUEST"
ENV_GUARD_CPU_LIMIT = "GUARDEDCRON_GUARD_CPU_LIMIT"
ENV_GUARD_MEMORY_LIMIT = "GUARDEDCRON_GUARD_MEMORY_LIMIT"
ENV_GUARD_RUN_AS_USER = "GUARDEDCRON_GUARD_RUN_AS_USER"
ENV_RUN_VOLUME_SIZE_LIMIT = "GUARDEDCRON_RUN_VOLUME_SIZE_LIMIT"

# The operator's own image carries the guard CLI, so the default follows the release.
DEFAULT_GUARD_IMAGE = f"ghcr.io/guardedcron/guardedcron:{__version__}"
DEFAULTS: Mapping[str, str] = {
    ENV_GUARD_IMAGE: DEFAULT_GUARD_IMAGE,
    ENV_GUARD_IMAGE_PULL_POLICY: "IfNotPresent",
    ENV_CLUSTER_NAME: "",
    # A Python process with psycopg: about 30 MiB resident. The CPU limit is loose on
    # purpose: the guard's start-up delays every run, and throttling would stretch it.
    ENV_GUARD_CPU_REQUEST: "10m",
    ENV_GUARD_MEMORY_REQUEST: "48Mi",
    ENV_GUARD_CPU_LIMIT: "500m",
    ENV_GUARD_MEMORY_LIMIT: "128Mi",
    ENV_GUARD_RUN_AS_USER: "65532",  # the "nonroot" user of distroless-style images
    ENV_RUN_VOLUME_SIZE_LIMIT: "1Mi",  # holds two tiny files; counts against pod memory
}

PULL_POLICIES = ("Always", "IfNotPresent", "Never")
_QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE]\d+)?$")
# The holder is "<cluster>/<namespace>/<pod>": the cluster part may not hold a '/'.
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_IMAGE = re.compile(r"^[^\s$]+$")


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
    guard_run_as_user: int
    run_volume_size_limit: str


class SettingsError(ValueError):
    """Bad operator settings; each problem names the environment variable."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in problems))


def settings_from_env(env: Mapping[str, str]) -> OperatorSettings:
    """Read the settings from `env` (pass `os.environ`); unset or empty means the default,
    except for the resources, where an empty value leaves that request or limit unset."""
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
    user_text = read(ENV_GUARD_RUN_AS_USER)
    user = int(user_text) if user_text.isdigit() else 0
    if user < 1:  # the pod runs as non-root, so 0 is refused too
        problems.append(Problem(ENV_GUARD_RUN_AS_USER,
                                f"must be a user id above 0, not {user_text!r}"))

    if problems:
        raise SettingsError(problems)
    return OperatorSettings(
        guard_image=image, guard_image_pull_policy=pull_policy, cluster_name=cluster or None,
        guard_resources=resources, guard_run_as_user=user, run_volume_size_limit=size_limit,
    )
