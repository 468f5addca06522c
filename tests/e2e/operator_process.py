"""The operator as the chart would run it, but as a subprocess of the test.

`helm template` renders the chart (the real helm binary); the ServiceAccount and its
(Cluster)Role and binding are applied to the cluster, and the operator runs with a
token of that ServiceAccount, so it can do exactly what the chart grants: a verb the
chart forgot fails the scenario that needs it. The command line and environment are
the rendered Deployment's, with the two ports moved to free loopback ports (two
operators run side by side) and the guard image left as the chart sets it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from guardedcron_devenv.controlplane import free_port
from guardedcron_devenv.tools import ensure_helm
from tests.e2e.harness import CHART_DIR, GUARDEDCRON, Cluster, iter_yaml, wait_for

RELEASE = "guardedcron"
INSTALL_NAMESPACE = "guardedcron-system"
RBAC_KINDS = frozenset({"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                        "RoleBinding"})
OPERATOR_CONTAINER = "operator"
READY_TIMEOUT_SECONDS = 90.0
STOP_GRACE_SECONDS = 10.0
# How the API server words an RBAC denial ('... is forbidden: User "system:serviceaccount:
# ns:name" cannot patch resource ...'); other 403s (a terminating namespace) are not RBAC.
RBAC_DENIAL = re.compile(r'forbidden: User "[^"]+" cannot ')


def render_chart(values: Mapping[str, str], release: str = RELEASE) -> list[dict[str, Any]]:
    command = [str(ensure_helm()), "template", release, str(CHART_DIR),
               "--namespace", INSTALL_NAMESPACE]
    for key, value in values.items():
        command += ["--set", f"{key}={value}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"helm template failed: {result.stderr}"
    return list(iter_yaml(result.stdout))


def deployment_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [deployment] = [o for o in objects if o["kind"] == "Deployment"]
    containers = deployment["spec"]["template"]["spec"]["containers"]
    [container] = [c for c in containers if c["name"] == OPERATOR_CONTAINER]
    return dict(container)


class OperatorProcess:
    """One cluster's operator: installed (RBAC), started, killed, restarted by the test."""

    def __init__(self, cluster: Cluster, workdir: Path, *, release: str = RELEASE,
                 without: tuple[str, str] | None = None,
                 values: Mapping[str, str] | None = None) -> None:
        """`without=(resource, verb)` takes that grant out of the chart's rules (to show
        that a missing permission is noticed); `values` are more `--set` chart values."""
        self.cluster = cluster
        self.workdir = workdir
        self.log_path = workdir / "operator.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        objects = render_chart({"clusterName": cluster.name, "crds.enabled": "false",
                                **(values or {})}, release)
        self.rbac = [o for o in objects if o["kind"] in RBAC_KINDS]
        if without is not None:
            for role in (o for o in self.rbac if o["kind"] in ("ClusterRole", "Role")):
                for rule in role["rules"]:
                    if without[0] in rule.get("resources", ()):
                        rule["verbs"] = [v for v in rule["verbs"] if v != without[1]]
        container = deployment_container(objects)
        self.args: list[str] = list(container.get("args") or [])
        # Plain values only; POD_ID (kopf's peer name) comes from the downward API there.
        self.chart_env = {e["name"]: str(e["value"]) for e in container.get("env") or []
                          if "value" in e}
        self.guard_image = self.chart_env["GUARDEDCRON_GUARD_IMAGE"]
        self.health_port = 0
        self.metrics_port = 0

    def install(self) -> None:
        """The chart's ServiceAccount and RBAC, and a kubeconfig holding that account's token."""
        self.cluster.apply({"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": INSTALL_NAMESPACE}})
        self.cluster.apply(*self.rbac)
        [account] = [o["metadata"]["name"] for o in self.rbac if o["kind"] == "ServiceAccount"]
        token = self.cluster.kubectl("create", "token", account, "-n", INSTALL_NAMESPACE,
                                     "--duration=12h").stdout.strip()
        self.kubeconfig = self.cluster.plane.write_token_kubeconfig(
            self.workdir / "operator.kubeconfig", token, user=f"{INSTALL_NAMESPACE}:{account}")

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        self.health_port = free_port()
        self.metrics_port = free_port()
        args = [a for a in self.args if not a.startswith("--liveness")]
        args.append(f"--liveness=http://127.0.0.1:{self.health_port}/healthz")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.workdir),
            "KUBECONFIG": str(self.kubeconfig),
            **self.chart_env,
            "GUARDEDCRON_METRICS_PORT": str(self.metrics_port),
            "POD_ID": f"{self.cluster.name}-operator-{self.starts}",
        }
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts}: guardedcron {' '.join(args)}\n".encode())
            log.flush()
            self.process = subprocess.Popen([GUARDEDCRON, *args], env=env, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=self.workdir,
                                            start_new_session=True)
        wait_for(f"the operator of {self.cluster.name} answers its health probe", self._healthy,
                 READY_TIMEOUT_SECONDS, interval=0.5)

    def _healthy(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise AssertionError(f"the operator of {self.cluster.name} exited "
                                 f"({None if self.process is None else self.process.returncode}):"
                                 f"\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz",
                                        timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no clean-up, as when the node under the operator's pod dies."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.kill()

    def metrics(self) -> str:
        """/metrics of the running process (its series start again at each start)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as answer:
            return str(answer.read().decode())

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 80) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def refusals(self) -> list[str]:
        """Log lines where RBAC refused the operator something."""
        return [line for line in self.log_text().splitlines() if RBAC_DENIAL.search(line)]

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None
