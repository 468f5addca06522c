"""The operator from the built image, as a container under the chart's restrictions, against
a real API server: read-only root filesystem, user 65532, no capabilities, only the chart's
16 MiB /tmp writable. It must answer its health probe, serve metrics and turn a
GuardedCronJob into a CronJob whose guard runs this very image.

The API server is the local control plane (tests/e2e's, started here on its own); the
container shares the host's network to reach it on loopback. Running the operator as a pod
of a real node, with in-cluster credentials, is the node tier's (issue 12).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from guardedcron import contract
from guardedcron_devenv.binaries import Paths, ensure_binaries
from guardedcron_devenv.controlplane import ControlPlane, free_port
from guardedcron_devenv.docker_engine import DockerEngine
from guardedcron_devenv.image import BuiltImage
from tests.support.image import IMAGE_TEST_TIMEOUT_S, REPO, RESTRICTED

pytestmark = [pytest.mark.image, pytest.mark.timeout(IMAGE_TEST_TIMEOUT_S)]

EXAMPLE = REPO / "examples" / "every-5-minutes-sync.yaml"  # GuardedCronJob shop/catalogue-sync
CRD = REPO / "crds" / "guardedcronjobs.guardedcron.io.yaml"
KUBECONFIG_IN_CONTAINER = "/etc/guardedcron/kubeconfig"
READY_TIMEOUT_S = 90.0  # the operator answers /healthz and has made the CronJob
KUBECTL_TIMEOUT_S = 60.0


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    binaries = ensure_binaries(quiet)
    with ControlPlane(binaries, name="image", progress=quiet,
                      logs_dir=tmp_path_factory.mktemp("image-controlplane-logs")) as plane:
        yield plane


def kubectl(plane: ControlPlane, *args: str) -> str:
    binaries: Paths = ensure_binaries(quiet)
    result = subprocess.run([str(binaries.kubectl), "--kubeconfig", str(plane.kubeconfig), *args],
                            capture_output=True, text=True, timeout=KUBECTL_TIMEOUT_S, check=False)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return int(answer.status), answer.read().decode(errors="replace")
    except OSError as error:
        return 0, str(error)


def test_the_operator_in_the_image_runs_read_only_and_makes_the_cronjob(
    docker_engine: DockerEngine, built_image: BuiltImage, control_plane: ControlPlane,
    tmp_path: Path,
) -> None:
    kubectl(control_plane, "apply", "-f", str(CRD))
    control_plane.wait_established(f"{contract.PLURAL}.{contract.API_GROUP}")
    kubectl(control_plane, "create", "namespace", "shop")
    kubectl(control_plane, "apply", "-f", str(EXAMPLE))

    # Readable by the image's user, as a mounted Secret would be.
    kubeconfig = tmp_path / "kubeconfig"
    shutil.copyfile(control_plane.kubeconfig, kubeconfig)
    kubeconfig.chmod(0o644)
    tmp_path.chmod(0o755)
    health_port, metrics_port = free_port(), free_port()
    started = docker_engine.run(
        "run", "--detach", *RESTRICTED, "--network=host", "--tmpfs=/tmp:size=16m",
        f"--volume={kubeconfig}:{KUBECONFIG_IN_CONTAINER}:ro",
        f"--env=KUBECONFIG={KUBECONFIG_IN_CONTAINER}",
        f"--env=GUARDEDCRON_METRICS_PORT={metrics_port}",
        f"--env=GUARDEDCRON_GUARD_IMAGE={built_image.tag}",
        "--env=POD_ID=image-test-operator",
        built_image.tag, "operator", f"--liveness=http://127.0.0.1:{health_port}/healthz",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    container = started.stdout.strip()
    try:
        cronjob = wait_for_operator(docker_engine, container, control_plane, health_port)
        status, metrics = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
        logs = docker_engine.run("logs", container)
        running = docker_engine.check("inspect", "--format", "{{.State.Running}}", container).strip()
    finally:
        docker_engine.run("rm", "--force", container)
    [guard] = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"][:1]
    assert guard["name"] == contract.GUARD_CONTAINER and guard["image"] == built_image.tag
    assert status == 200 and "guardedcron_" in metrics, metrics[:500]
    assert running == "true"
    output = logs.stdout + logs.stderr
    for sign in ("Read-only file system", "Traceback", "Permission denied"):
        assert sign not in output, output[-3000:]


def wait_for_operator(
    engine: DockerEngine, container: str, plane: ControlPlane, health_port: int
) -> dict[str, object]:
    """Healthy and the CronJob made, within READY_TIMEOUT_S; the container's log if not."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if engine.check("inspect", "--format", "{{.State.Running}}", container).strip() != "true":
            logs = engine.run("logs", container)
            raise AssertionError(f"the operator container exited:\n{(logs.stdout + logs.stderr)[-3000:]}")
        healthy = http_get(f"http://127.0.0.1:{health_port}/healthz")[0] == 200
        found = kubectl(plane, "get", "cronjobs", "-n", "shop", "-o", "json")
        items = json.loads(found)["items"]
        if healthy and items:
            cronjob: dict[str, object] = items[0]
            return cronjob
        if time.monotonic() > deadline:
            logs = engine.run("logs", container)
            raise AssertionError(
                f"within {READY_TIMEOUT_S:.0f} s: healthy={healthy}, cronjobs={len(items)}; "
                f"operator log:\n{(logs.stdout + logs.stderr)[-3000:]}"
            )
        time.sleep(1.0)
