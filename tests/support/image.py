"""Running the built guardedcron image the way Kubernetes runs it under the chart's and the
operator's security contexts: read-only root filesystem, no capabilities, no privilege
escalation, the image's own user, and writable places only where the pod gives them."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from guardedcron_devenv.docker_engine import COMMAND_TIMEOUT_S, START_TIMEOUT_S, DockerEngine
from guardedcron_devenv.image import BUILD_TIMEOUT_S
from guardedcron_devenv.python_base import DEBOOTSTRAP_TIMEOUT_S, IMPORT_TIMEOUT_S

REPO: Final = Path(__file__).resolve().parents[2]
# The session's first image test pays for a cold build; each step is bounded on its own.
IMAGE_TEST_TIMEOUT_S: Final = (
    START_TIMEOUT_S + DEBOOTSTRAP_TIMEOUT_S + IMPORT_TIMEOUT_S + BUILD_TIMEOUT_S + 5 * COMMAND_TIMEOUT_S
)
RESTRICTED: Final = ("--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges")


def run_in_image(
    engine: DockerEngine,
    image: str,
    args: Sequence[str] = (),
    *,
    entrypoint: str | None = None,
    network: str = "none",
    tmpfs: Sequence[str] = (),
    volumes: Sequence[str] = (),
    env_names: Sequence[str] = (),
    env: dict[str, str] | None = None,
    detach: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`docker run` of the image; env_names are passed by name only, their values taken from
    `env` in the client's environment, so a DSN never appears on a command line."""
    options = [*RESTRICTED, f"--network={network}"]
    options += [f"--tmpfs={mount}" for mount in tmpfs]
    options += [f"--volume={volume}" for volume in volumes]
    options += [f"--env={name}" for name in env_names]
    if entrypoint is not None:
        options.append(f"--entrypoint={entrypoint}")
    options.append("--detach" if detach else "--rm")
    return engine.run("run", *options, image, *args, env=env)
