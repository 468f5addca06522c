"""Manual runs on a real control plane: `guardedcron trigger` (admin kubeconfig, and a
service account without rights) and the `guardedcron.io/trigger` annotation acted on by
the operator under the chart's RBAC. Each run is guarded (the lease's fence reaches the
workload's rows) and shows in status as manual."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from guardedcron import contract
from tests.e2e.harness import EAST, GUARDEDCRON, Cluster, Scenario, guarded_cronjob, job_condition, lock_of
from tests.e2e.operator_process import OperatorProcess
from tests.e2e.test_operator import (
    NAME,
    assert_no_refusals,
    create_gcj,
    final_run,
    run_in_status,
    status_of,
    wait_cronjob,
    wait_status,
)

pytestmark = pytest.mark.e2e


def trigger(kubeconfig: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.run([GUARDEDCRON, "trigger", *args], capture_output=True, text=True, env=env,
                          timeout=60, check=False)


def manual_jobs(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return [j for j in cluster.jobs(namespace)
            if contract.ANNOTATION_MANUAL in (j["metadata"].get("annotations") or {})]


def check_guarded_run(scenario: Scenario, cluster: Cluster, namespace: str, manifest: Mapping[str, Any],
                      job_name: str) -> dict[str, Any]:
    job = cluster.wait_job_finished(namespace, job_name)
    assert job_condition(job, "Complete")["status"] == "True"
    status = wait_status(cluster, namespace, f"{job_name} Succeeded", final_run(job_name, "Succeeded"))
    run = run_in_status(status, job_name)
    assert run is not None and run["manual"] is True and "slot" not in run
    rows = [r for r in scenario.db.work(lock_of(manifest)) if r.job == job_name]
    assert [r.item for r in rows] == [1, 2, 3] and {r.fence for r in rows} == {run["fence"]}, (rows, run)
    return status


def test_trigger_command_and_annotation_each_start_one_guarded_run(
    operator_scenario: Scenario, clusters: dict[str, Cluster],
    operators: dict[str, OperatorProcess],
) -> None:
    east = clusters[EAST]
    namespace = operator_scenario.namespace("manual", [east])
    # The keeper releases the lease when a run ends, so the next manual run can take it.
    manifest = guarded_cronjob(NAME, namespace, spec={"suspend": True}, lease={"heartbeat": True})
    create_gcj(east, manifest)
    cronjob = wait_cronjob(east, namespace)

    # The command, as a person with the admin kubeconfig runs it.
    result = trigger(east.plane.kubeconfig, NAME, "-n", namespace)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    job_name = answer["job"]
    assert answer == {"namespace": namespace, "guarded_cronjob": NAME, "job": job_name}
    assert job_name.startswith(f"{NAME}-manual-") and not job_name[-1].isdigit()
    job = east.job(namespace, job_name)
    assert job is not None
    [owner] = job["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("CronJob", cronjob["metadata"]["uid"], True)
    assert job["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"] == "manual"
    check_guarded_run(operator_scenario, east, namespace, manifest, job_name)

    # The annotation, as a GitOps tool would set it: one run per new token.
    east.kubectl("annotate", contract.PLURAL, NAME, "-n", namespace, f"{contract.ANNOTATION_TRIGGER}=t1")
    status = wait_status(east, namespace, "token t1 handled", lambda s: s.get("lastTriggerToken") == "t1")
    [by_token] = [j for j in manual_jobs(east, namespace)
                  if j["metadata"]["annotations"].get(contract.ANNOTATION_TRIGGER) == "t1"]
    check_guarded_run(operator_scenario, east, namespace, manifest, by_token["metadata"]["name"])

    # The same token again (a no-op apply of the annotation) makes nothing more.
    east.kubectl("annotate", "--overwrite", contract.PLURAL, NAME, "-n", namespace,
                 f"{contract.ANNOTATION_TRIGGER}=t1")
    east.kubectl("label", contract.PLURAL, NAME, "-n", namespace, "touched=yes")  # an update kopf sees
    wait_status(east, namespace, "two runs counted", lambda s: s["runCounts"]["succeeded"] == 2)
    assert len(manual_jobs(east, namespace)) == 2
    assert status_of(east, namespace)["lastTriggerToken"] == "t1"
    assert status["cronJobRef"] == {"name": NAME}
    assert_no_refusals(operators)


def test_trigger_command_refusals_come_with_the_api_servers_words(
    operator_scenario: Scenario, clusters: dict[str, Cluster],
    operators: dict[str, OperatorProcess], tmp_path: Path,
) -> None:
    east = clusters[EAST]
    namespace = operator_scenario.namespace("refused", [east])
    create_gcj(east, guarded_cronjob(NAME, namespace, spec={"suspend": True}))
    wait_cronjob(east, namespace)

    missing = trigger(east.plane.kubeconfig, "absent", "-n", namespace)
    assert missing.returncode == 1
    assert f"GuardedCronJob {namespace}/absent not found" in missing.stderr

    east.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    token = east.kubectl("create", "token", "nobody", "-n", namespace).stdout.strip()
    kubeconfig = east.plane.write_token_kubeconfig(tmp_path / "nobody", token, user="nobody")
    refused = trigger(kubeconfig, NAME, "-n", namespace)
    assert refused.returncode == 1
    assert "not allowed:" in refused.stderr
    assert f'User "system:serviceaccount:{namespace}:nobody" cannot get resource' in refused.stderr
    assert token not in refused.stderr and token not in refused.stdout
    assert manual_jobs(east, namespace) == []
    assert_no_refusals(operators)
