"""The CLI's logins and the kubectl plugin on a real kube-apiserver.

A kubeconfig whose user is an exec credential plugin (as EKS, GKE and AKS write them:
a command that prints an ExecCredential) works with `guardedcron trigger` and with
`kubectl gcj`, run by the real kubectl from PATH; a plugin that fails gives one line
naming the failure, with no traceback and no token. No operator runs here: the test
makes the CronJob the operator would (`guardedcron render` with the object's uid), which
is all `trigger` needs, and writes the status `kubectl gcj runs` reads.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from guardedcron import contract
from guardedcron_devenv.controlplane import ControlPlane, build_kubeconfig
from guardedcron_devenv.tools import ensure_kubectl
from tests.e2e.cli_support import (
    GCJ,
    NAME,
    guarded_cronjob_with_its_cronjob,
    kubectl_gcj,
    plane_with_the_crd,
    run,
    write_runs,
)
from tests.e2e.harness import GUARDEDCRON, VENV_BIN, guarded_cronjob

pytestmark = pytest.mark.e2e

USER = "runner"
EXEC_API = "client.authentication.k8s.io/v1"


def exec_kubeconfig(plane: ControlPlane, path: Path, command: Path, namespace: str) -> Path:
    """A kubeconfig like a cloud provider's: the user is an exec plugin; a second context
    ("elsewhere") names another namespace."""
    config = yaml.safe_load(build_kubeconfig(
        plane.server, plane.ca_file,
        {"exec": {"apiVersion": EXEC_API, "command": str(command), "interactiveMode": "Never"}},
        "cloud", USER))
    [context] = config["contexts"]
    context["context"]["namespace"] = namespace
    config["contexts"].append({"name": "elsewhere",
                               "context": {**context["context"], "namespace": "elsewhere"}})
    path.write_text(yaml.safe_dump(config))
    return path


def write_plugin(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def cli_plane(control_plane_factory: Callable[[str], ControlPlane]) -> ControlPlane:
    return plane_with_the_crd(control_plane_factory, "cli-logins")


def grant_runner(plane: ControlPlane, namespace: str) -> str:
    """A service account with exactly a manual run's rights in `namespace`; its token."""
    plane.kubectl("create", "serviceaccount", USER, "-n", namespace)
    plane.kubectl("create", "role", "manual-runs", "-n", namespace, "--verb=get,list",
                  f"--resource={GCJ},cronjobs.batch")
    plane.kubectl("create", "role", "create-jobs", "-n", namespace, "--verb=create",
                  "--resource=jobs.batch")
    for role in ("manual-runs", "create-jobs"):
        plane.kubectl("create", "rolebinding", role, "-n", namespace, f"--role={role}",
                      f"--serviceaccount={namespace}:{USER}")
    return str(plane.kubectl("create", "token", USER, "-n", namespace).stdout.strip())


def manual_jobs(plane: ControlPlane, namespace: str) -> list[str]:
    jobs = plane.kubectl_json("get", "jobs", "-n", namespace)["items"]
    return sorted(j["metadata"]["name"] for j in jobs
                  if contract.ANNOTATION_MANUAL in (j["metadata"].get("annotations") or {}))


def test_trigger_logs_in_through_an_exec_plugin_and_reports_a_failing_one_in_one_line(
    cli_plane: ControlPlane, tmp_path: Path,
) -> None:
    namespace = "exec-login"
    guarded_cronjob_with_its_cronjob(cli_plane, namespace)
    token = grant_runner(cli_plane, namespace)
    (tmp_path / "token").write_text(token)
    seen = tmp_path / "exec-info.json"
    plugin = write_plugin(tmp_path / "login.sh", (
        f'printf "%s" "$KUBERNETES_EXEC_INFO" > {seen}\n'
        f'printf \'{{"apiVersion":"{EXEC_API}","kind":"ExecCredential",'
        f'"status":{{"token":"%s"}}}}\' "$(cat {tmp_path / "token"})"'))
    kubeconfig = exec_kubeconfig(cli_plane, tmp_path / "cloud.kubeconfig", plugin, namespace)

    # No -n: the namespace is the context's, as with kubectl.
    result = run([GUARDEDCRON, "trigger", NAME], kubeconfig)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["namespace"] == namespace and answer["guarded_cronjob"] == NAME
    assert manual_jobs(cli_plane, namespace) == [answer["job"]]
    # The plugin was asked the way the exec protocol asks.
    info = json.loads(seen.read_text())
    assert (info["apiVersion"], info["kind"]) == (EXEC_API, "ExecCredential")
    assert token not in result.stdout + result.stderr

    # A plugin that fails (an expired cloud session) and says too much on stderr.
    write_plugin(plugin, f'echo "login expired for token $(cat {tmp_path / "token"})" >&2\nexit 3')
    failed = run([GUARDEDCRON, "trigger", NAME], kubeconfig)
    assert failed.returncode == contract.EXIT_FAILURE, failed.stderr
    assert failed.stdout == ""
    [line] = failed.stderr.splitlines()
    assert line.startswith("guardedcron trigger: cannot log in with the kubeconfig's user: "
                           "exec: process returned 3. login expired for token "), line
    assert "Traceback" not in failed.stderr and token not in failed.stderr
    assert manual_jobs(cli_plane, namespace) == [answer["job"]]  # nothing more was created

    # A plugin whose answer is not an ExecCredential.
    write_plugin(plugin, "echo not json")
    garbled = run([GUARDEDCRON, "trigger", NAME], kubeconfig)
    assert garbled.returncode == contract.EXIT_FAILURE
    [line] = garbled.stderr.splitlines()
    assert "exec: failed to decode process output" in line, line


def test_kubectl_gcj_trigger_runs_and_render_read_like_kubectl(
    cli_plane: ControlPlane, tmp_path: Path,
) -> None:
    namespace = "plugin"
    guarded_cronjob_with_its_cronjob(cli_plane, namespace)
    token = grant_runner(cli_plane, namespace)
    plugin = write_plugin(tmp_path / "login.sh", (
        f'printf \'{{"apiVersion":"{EXEC_API}","kind":"ExecCredential",'
        f'"status":{{"token":"%s"}}}}\' "{token}"'))
    kubeconfig = exec_kubeconfig(cli_plane, tmp_path / "cloud.kubeconfig", plugin, namespace)
    admin = cli_plane.kubeconfig

    assert (VENV_BIN / "kubectl-gcj").is_file()
    listed = subprocess.run([str(ensure_kubectl()), "plugin", "list"], capture_output=True, text=True,
                            env={**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"},
                            timeout=60, check=False)
    assert str(VENV_BIN / "kubectl-gcj") in listed.stdout, listed.stdout + listed.stderr

    # trigger: the context's namespace, kubectl's words for what it made.
    triggered = kubectl_gcj(kubeconfig, "trigger", NAME)
    assert triggered.returncode == 0, triggered.stderr
    [job] = manual_jobs(cli_plane, namespace)
    assert triggered.stdout == f"job.batch/{job} created\n"
    as_json = kubectl_gcj(kubeconfig, "trigger", NAME, "-o", "json")
    assert json.loads(as_json.stdout)["namespace"] == namespace
    # --context picks another context, hence its namespace, where there is no such object.
    other = kubectl_gcj(kubeconfig, "trigger", NAME, "--context", "elsewhere")
    assert other.returncode == contract.EXIT_FAILURE
    assert other.stderr.strip().startswith("kubectl gcj trigger: ")
    assert "elsewhere" in other.stderr and token not in other.stderr

    # runs: from the status the operator keeps; none yet.
    empty = kubectl_gcj(kubeconfig, "runs", NAME)
    assert (empty.returncode, empty.stdout) == (0, ""), empty.stderr
    assert empty.stderr == f"No runs found in {namespace} namespace.\n"
    runs = [{"job": job, "outcome": "Succeeded", "fence": 7, "manual": True,
             "startedAt": "2026-12-01T05:00:00Z", "finishedAt": "2026-12-01T05:00:09Z",
             "reason": "exit 0"},
            {"job": f"{NAME}-29000000", "outcome": "Skipped", "fence": 6, "slot": 29000000,
             "startedAt": "2026-12-01T04:00:00Z", "reason": "lease held"}]
    write_runs(cli_plane, namespace, runs)
    table = kubectl_gcj(kubeconfig, "runs", NAME)
    assert table.returncode == 0, table.stderr
    head, first, second = table.stdout.splitlines()
    assert head.split() == ["GUARDEDCRONJOB", "JOB", "OUTCOME", "FENCE", "MANUAL", "STARTED",
                            "FINISHED", "REASON"]
    assert first.split() == [NAME, job, "Succeeded", "7", "yes", "2026-12-01T05:00:00Z",
                             "2026-12-01T05:00:09Z", "exit", "0"]
    assert second.split()[:5] == [NAME, f"{NAME}-29000000", "Skipped", "6", "no"]
    # -n names the namespace; -A reads every one and says which (the admin may list them).
    assert kubectl_gcj(kubeconfig, "runs", "-n", namespace, "-o", "json").returncode == 0
    everywhere = kubectl_gcj(admin, "runs", "-A")
    assert everywhere.returncode == 0, everywhere.stderr
    assert everywhere.stdout.splitlines()[0].split()[:2] == ["NAMESPACE", "GUARDEDCRONJOB"]
    assert [namespace, NAME, job] in [line.split()[:3] for line in everywhere.stdout.splitlines()]
    items = json.loads(kubectl_gcj(admin, "runs", "-A", "-o", "json").stdout)["items"]
    assert {(i["namespace"], i["guardedCronJob"], i["job"]) for i in items} >= {
        (namespace, NAME, job), (namespace, NAME, f"{NAME}-29000000")}
    mixed = kubectl_gcj(kubeconfig, "runs", NAME, "-A")
    assert mixed.returncode == contract.EXIT_USAGE and "-A" in mixed.stderr

    # render: a manifest without a namespace gets the context's, and no login is needed.
    manifest = guarded_cronjob(NAME, namespace)
    del manifest["metadata"]["namespace"]
    (tmp_path / "gcj.yaml").write_text(yaml.safe_dump(manifest))
    write_plugin(plugin, "exit 9")  # would fail any login
    rendered = kubectl_gcj(kubeconfig, "render", "-f", str(tmp_path / "gcj.yaml"))
    assert rendered.returncode == 0, rendered.stderr
    [cronjob] = list(yaml.safe_load_all(rendered.stdout))
    assert (cronjob["kind"], cronjob["metadata"]["namespace"]) == ("CronJob", namespace)
    elsewhere = kubectl_gcj(kubeconfig, "render", "-f", str(tmp_path / "gcj.yaml"), "--context",
                            "elsewhere")
    assert next(yaml.safe_load_all(elsewhere.stdout))["metadata"]["namespace"] == "elsewhere"
