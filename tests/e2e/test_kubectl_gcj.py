"""`kubectl gcj status`, `suspend`/`resume`, `backfill` and `report` on a real
kube-apiserver and a real PostgreSQL, run by the real kubectl.

No operator runs: the GuardedCronJob's CronJob is the one `guardedcron render` makes and
its status is written by hand, as in test_cli_logins. The lease status reads is taken
with the guard library, in the database the object's Secret names.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from guardedcron import contract
from guardedcron.guard.lease import AcquireRequest, acquire
from guardedcron.status.times import format_time
from guardedcron_devenv.controlplane import ControlPlane
from tests.e2e.cli_support import (
    GCJ,
    NAME,
    guarded_cronjob_with_its_cronjob,
    kubectl_gcj,
    plane_with_the_crd,
    write_runs,
)
from tests.e2e.harness import DSN_KEY, DSN_SECRET, workload_container

pytestmark = pytest.mark.e2e

HOLDER = "east/status/nightly-29000000-abcde"
# Nothing listens on port 1: the connection is refused at once.
CLOSED_PORT_DSN = "postgresql://guard:Zq7-unreachable-pw@127.0.0.1:1/jobs"


@pytest.fixture(scope="module")
def plane(control_plane_factory: Callable[[str], ControlPlane]) -> ControlPlane:
    return plane_with_the_crd(control_plane_factory, "kubectl-gcj")


def put_dsn(plane: ControlPlane, namespace: str, dsn: str) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": DSN_SECRET, "namespace": namespace},
              "data": {DSN_KEY: base64.b64encode(dsn.encode()).decode()}}
    plane.kubectl("apply", "-f", "-", input=json.dumps(secret))


def password_of(dsn: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["password"])


def test_status_shows_the_object_its_runs_and_the_lease_the_database_holds(
    plane: ControlPlane, dsn: str, empty_dsn: str,
) -> None:
    namespace = "status"
    admin = plane.kubeconfig
    guarded_cronjob_with_its_cronjob(plane, namespace)
    write_runs(plane, namespace, [{"job": f"{NAME}-29000000", "outcome": "Succeeded", "fence": 1,
                                   "startedAt": "2026-12-01T04:00:00Z"}])
    put_dsn(plane, namespace, dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        taken = acquire(conn, AcquireRequest(lock=f"{namespace}/{NAME}", holder=HOLDER, lease_seconds=600))
    assert taken.acquired

    shown = kubectl_gcj(admin, "status", NAME, "-n", namespace, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert (view["name"], view["schedule"], view["suspended"], view["lock"]) == (
        NAME, "* * * * *", True, f"{namespace}/{NAME}")
    assert view["lease"]["held"] and view["lease"]["holder"] == HOLDER
    assert view["lease"]["fence"] == taken.fence and view["databaseNote"] is None
    assert [run["job"] for run in view["recentRuns"]] == [f"{NAME}-29000000"]
    text = kubectl_gcj(admin, "status", NAME, "-n", namespace)
    assert text.returncode == 0, text.stderr
    assert f"Lease:      held by '{HOLDER}', fence {taken.fence}, locked until " in text.stdout
    assert password_of(dsn) not in shown.stdout + text.stdout + text.stderr

    # The database cannot be reached: everything else, one line why, exit 0, no password.
    put_dsn(plane, namespace, CLOSED_PORT_DSN)
    unreachable = kubectl_gcj(admin, "status", NAME, "-n", namespace)
    assert unreachable.returncode == 0, unreachable.stderr
    [database] = [line for line in unreachable.stdout.splitlines() if line.startswith("Database:")]
    assert "cannot reach database guard@127.0.0.1:1/jobs" in database, database
    assert "Zq7-unreachable-pw" not in unreachable.stdout + unreachable.stderr
    assert "Recent runs:" in unreachable.stdout and "Lease:" not in unreachable.stdout
    put_dsn(plane, namespace, empty_dsn)  # a database without the schema
    unmigrated = json.loads(kubectl_gcj(admin, "status", NAME, "-n", namespace, "-o", "json").stdout)
    assert "schema" in unmigrated["databaseNote"] and "guardedcron db migrate" in unmigrated["databaseNote"]
    assert password_of(empty_dsn) not in unmigrated["databaseNote"]
    skipped = json.loads(kubectl_gcj(admin, "status", NAME, "-n", namespace, "--no-database",
                                     "-o", "json").stdout)
    assert (skipped["lease"], skipped["databaseNote"]) == (None, "database not read (--no-database)")
    plane.kubectl("delete", "secret", DSN_SECRET, "-n", namespace)
    no_secret = json.loads(kubectl_gcj(admin, "status", NAME, "-n", namespace, "-o", "json").stdout)
    assert no_secret["databaseNote"] == f"database not read: Secret {namespace}/{DSN_SECRET} not found"

    missing = kubectl_gcj(admin, "status", "absent", "-n", namespace)
    assert (missing.returncode, missing.stderr) == (
        contract.EXIT_FAILURE, f"kubectl gcj status: GuardedCronJob {namespace}/absent not found\n")
    assert kubectl_gcj(admin, "status", "Bad_Name").returncode == contract.EXIT_USAGE


def test_suspend_resume_and_backfill_change_the_object_as_kubectl_would(plane: ControlPlane) -> None:
    namespace = "edits"
    admin = plane.kubeconfig
    guarded_cronjob_with_its_cronjob(plane, namespace)  # made suspended

    def suspended() -> bool:
        return bool(plane.kubectl_json("get", GCJ, NAME, "-n", namespace)["spec"]["suspend"])

    again = kubectl_gcj(admin, "suspend", NAME, "-n", namespace)
    assert (again.returncode, again.stdout) == (
        0, f"guardedcronjob.guardedcron.io/{NAME} was already suspended (no change)\n"), again.stderr
    resumed = kubectl_gcj(admin, "resume", NAME, "-n", namespace)
    assert (resumed.returncode, resumed.stdout, resumed.stderr) == (
        0, f"guardedcronjob.guardedcron.io/{NAME} resumed\n", "")
    assert not suspended()
    # Argo CD's label: the edit is made, and stderr says it may not last.
    plane.kubectl("label", GCJ, NAME, "-n", namespace, "argocd.argoproj.io/instance=billing")
    paused = kubectl_gcj(admin, "suspend", NAME, "-n", namespace, "-o", "json")
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout) == {"namespace": namespace, "guarded_cronjob": NAME,
                                         "suspended": True, "changed": True}
    assert paused.stderr.startswith("kubectl gcj suspend: warning: this GuardedCronJob seems applied "
                                    "by Argo CD (label argocd.argoproj.io/instance)")
    assert suspended()
    absent = kubectl_gcj(admin, "resume", "absent", "-n", namespace)
    assert absent.returncode == contract.EXIT_FAILURE and absent.stderr.count("\n") == 1

    # backfill: guardedcron backfill's behaviour under kubectl's name.
    until = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)
    since = until - timedelta(minutes=3)
    window = ["--since", format_time(since), "--until", format_time(until), "--token", "bf-e2e"]
    dry = kubectl_gcj(admin, "backfill", NAME, "-n", namespace, *window, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["slots"] == 3
    assert contract.ANNOTATION_BACKFILL not in plane.kubectl_json(
        "get", GCJ, NAME, "-n", namespace)["metadata"].get("annotations", {})
    done = kubectl_gcj(admin, "backfill", NAME, "-n", namespace, *window)
    assert done.returncode == 0, done.stderr
    annotations = plane.kubectl_json("get", GCJ, NAME, "-n", namespace)["metadata"]["annotations"]
    assert annotations[contract.ANNOTATION_BACKFILL] == json.loads(done.stdout)["annotation"]
    backwards = kubectl_gcj(admin, "backfill", NAME, "-n", namespace, "--since", format_time(until),
                            "--until", format_time(since))
    assert backwards.returncode == contract.EXIT_USAGE
    assert backwards.stderr.startswith("kubectl gcj backfill: ")


def test_report_bundles_what_a_bug_report_needs_and_no_secret(plane: ControlPlane, tmp_path: Path) -> None:
    namespace = "report"
    admin = plane.kubeconfig
    secret_password, env_value, arg_password, url_password = (
        "Sp-4kq8w", "Ev-7hd2m", "Ap-9zx1c", "Up-3nb6v")
    container = workload_container()
    container["env"] = [*container["env"], {"name": "API_TOKEN", "value": env_value}]
    container["args"] = [*container["args"], f"--dsn=postgresql://guard:{arg_password}@db:5432/jobs"]
    guarded_cronjob_with_its_cronjob(plane, namespace, container=container)
    put_dsn(plane, namespace, f"postgresql://guard:{secret_password}@db:5432/jobs")
    triggered = kubectl_gcj(admin, "trigger", NAME, "-n", namespace)
    assert triggered.returncode == 0, triggered.stderr
    job = triggered.stdout.split()[0].removeprefix("job.batch/")
    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "hook", "namespace": namespace},
             "involvedObject": {"kind": contract.KIND, "name": NAME, "namespace": namespace},
             "reason": "CheckInFailed", "type": "Warning", "count": 1,
             "message": f"check-in to https://bot:{url_password}@hooks.example failed"}
    plane.kubectl("create", "-f", "-", input=json.dumps(event))

    shown = kubectl_gcj(admin, "report", NAME, "-n", namespace)
    assert shown.returncode == 0, shown.stderr
    for secret in (secret_password, env_value, arg_password, url_password):
        assert secret not in shown.stdout + shown.stderr, secret
    report = json.loads(shown.stdout)
    assert report["serverVersion"]["gitVersion"].startswith("v")
    assert [gcj["metadata"]["name"] for gcj in report["guardedCronJobs"]] == [NAME]
    assert report["guardedCronJobs"][0]["spec"]["schedule"] == "* * * * *"
    assert [cronjob["metadata"]["name"] for cronjob in report["cronJobs"]] == [NAME]
    assert [j["metadata"]["name"] for j in report["jobs"]] == [job]
    [hook] = [e for e in report["events"] if e["reason"] == "CheckInFailed"]
    assert hook["object"] == f"{contract.KIND}/{NAME}"
    assert "https://<redacted>@hooks.example" in hook["message"]
    # No operator runs on this control plane: said in one line, not a failure.
    assert any(note.startswith("no operator Deployment labelled") for note in report["notes"])

    bundle = tmp_path / "bundle.json"
    to_file = kubectl_gcj(admin, "report", "-n", namespace, "--output-file", str(bundle))
    assert (to_file.returncode, to_file.stdout) == (0, ""), to_file.stderr
    assert bundle.stat().st_mode & 0o777 == 0o600
    assert [gcj["metadata"]["name"] for gcj in json.loads(bundle.read_text())["guardedCronJobs"]] == [NAME]
    absent = kubectl_gcj(admin, "report", "absent", "-n", namespace)
    assert (absent.returncode, absent.stdout) == (contract.EXIT_FAILURE, ""), absent.stderr
