"""What the e2e tests of the CLI against a control plane share (test_cli_logins,
test_kubectl_gcj): a control plane with the CRD, a GuardedCronJob with the CronJob the
operator would make (no operator runs), its status' runs, and `kubectl gcj` run by the
real kubectl with the plugin on PATH."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from guardedcron import contract
from guardedcron_devenv.controlplane import ControlPlane
from guardedcron_devenv.tools import ensure_kubectl
from tests.e2e.harness import CRD_DIR, GUARDEDCRON, VENV_BIN, guarded_cronjob

NAME = "nightly"
GCJ = f"{contract.PLURAL}.{contract.API_GROUP}"


def plane_with_the_crd(control_plane_factory: Callable[[str], ControlPlane], name: str) -> ControlPlane:
    """A control plane of its own, with the CRD applied by kubectl (the primary one gets
    the chart's CRD from Helm, which will not adopt a kubectl-made one)."""
    plane = control_plane_factory(name)
    plane.kubectl("apply", "-f", str(CRD_DIR))
    plane.wait_established(GCJ)
    return plane


def run(command: list[str], kubeconfig: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), **extra_env}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)


def guarded_cronjob_with_its_cronjob(plane: ControlPlane, namespace: str, *,
                                     container: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The GuardedCronJob (suspended; `container` replaces the workload's) and the CronJob
    it controls, as the operator would make it."""
    plane.kubectl("create", "namespace", namespace)
    manifest = guarded_cronjob(NAME, namespace, spec={"suspend": True}, container=container)
    plane.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    live: dict[str, Any] = plane.kubectl_json("get", GCJ, NAME, "-n", namespace)
    rendered = subprocess.run([GUARDEDCRON, "render", "-f", "-"], input=json.dumps(live),
                              capture_output=True, text=True, timeout=60, check=True).stdout
    plane.kubectl("apply", "-f", "-", input=rendered)
    return live


def kubectl_gcj(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real kubectl, with the plugin on PATH as pip installs it (next to guardedcron)."""
    kubectl = ensure_kubectl()
    path = os.pathsep.join([str(VENV_BIN), str(kubectl.parent), os.environ.get("PATH", "")])
    return run([str(kubectl), "gcj", *args], kubeconfig, PATH=path)


def write_runs(plane: ControlPlane, namespace: str, runs: list[Mapping[str, Any]]) -> None:
    plane.kubectl("patch", GCJ, NAME, "-n", namespace, "--subresource=status", "--type=merge",
                  "-p", json.dumps({"status": {"recentRuns": runs, "lastRun": runs[0]}}))
