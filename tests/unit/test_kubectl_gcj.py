"""The pure halves of `kubectl gcj status`, `suspend`/`resume` and `report`: what they
print, built from API objects and database rows shaped like the real ones."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from guardedcron import contract
from guardedcron.cli import gcj_status, gcj_suspend, support_report
from guardedcron.guard.history import Run
from tests.support.gcj import base_gcj

NOW = datetime(2026, 12, 7, 2, 0, tzinfo=UTC)
LOCK = "billing/nightly-invoices"


def gcj_with_status() -> dict[str, Any]:
    gcj = base_gcj()
    gcj["status"] = {
        "nextScheduleTime": "2026-12-08T01:30:00Z",
        "conditions": [{"type": "Ready", "status": "True", "reason": "CronJobReady",
                        "message": "CronJob  billing/nightly-invoices\nis up to date",
                        "lastTransitionTime": "2026-12-01T00:00:00Z", "observedGeneration": 1}],
        "recentRuns": [{"job": f"nightly-invoices-{i}", "outcome": "Succeeded", "fence": 10 - i,
                        "startedAt": f"2026-12-0{7 - i}T01:30:00Z"} for i in range(7)],
    }
    return gcj


def test_status_view_holds_the_schedule_conditions_the_last_five_runs_and_the_lease() -> None:
    lease = gcj_status.lease_from_row(LOCK, ("east/billing/job-1", 10, NOW + timedelta(minutes=5),
                                             None, NOW))
    view = gcj_status.status_view(gcj_with_status(), lock=LOCK, lease=lease, database_note=None)
    assert (view["schedule"], view["timeZone"], view["suspended"]) == (
        "30 2 * * *", "Europe/Stockholm", False)
    assert view["nextScheduleTime"] == "2026-12-08T01:30:00Z"
    assert view["conditions"] == [{"type": "Ready", "status": "True", "reason": "CronJobReady",
                                   "message": "CronJob  billing/nightly-invoices\nis up to date",
                                   "lastTransitionTime": "2026-12-01T00:00:00Z"}]
    assert [run["fence"] for run in view["recentRuns"]] == [10, 9, 8, 7, 6]
    assert view["lease"] == {"lock": LOCK, "taken": True, "held": True, "holder": "east/billing/job-1",
                             "fence": 10, "lockedUntil": "2026-12-07T02:05:00+00:00",
                             "releasedAt": None, "source": gcj_status.FROM_LEASES}

    lines = gcj_status.status_lines(view)
    assert "Schedule:   30 2 * * *  (Europe/Stockholm)" in lines
    assert "Suspended:  no" in lines
    assert ("Lease:      held by 'east/billing/job-1', fence 10, locked until "
            "2026-12-07T02:05:00+00:00  (from guardedcron.leases)") in lines
    ready = lines[lines.index("Conditions:") + 2].split()
    assert ready[:4] == ["Ready", "True", "CronJobReady", "2026-12-01T00:00:00Z"]
    assert " ".join(ready[4:]) == "CronJob billing/nightly-invoices is up to date"  # one line
    runs = lines[lines.index("Recent runs:") + 1:]
    assert runs[0].split()[:3] == ["JOB", "OUTCOME", "FENCE"] and len(runs) == 1 + 5


def test_lease_states_from_its_row() -> None:
    ended = NOW - timedelta(minutes=1)
    never = gcj_status.lease_from_row(LOCK, None)
    assert (never["taken"], gcj_status.lease_line(never)) == (False, "never taken")
    given_back = gcj_status.lease_from_row(LOCK, ("h", 3, ended, ended, NOW))
    assert (given_back["held"], given_back["releasedAt"]) == (False, ended.isoformat())
    assert gcj_status.lease_line(given_back) == f"released at {ended.isoformat()} by 'h', fence 3"
    ran_out = gcj_status.lease_from_row(LOCK, ("h", 3, ended, None, NOW))
    assert gcj_status.lease_line(ran_out) == f"ran out at {ended.isoformat()} (last held by 'h', fence 3)"


def test_a_role_that_reads_only_runs_gets_the_lease_from_the_newest_run() -> None:
    run = Run(id=1, lock=LOCK, slot=None, holder="h", fence=4, started_at=NOW, finished_at=None,
              outcome="running", reason="")
    lease = gcj_status.lease_from_run(LOCK, run)
    assert (lease["held"], lease["fence"], lease["lockedUntil"]) == (True, 4, None)
    assert gcj_status.lease_line(lease) == "held by 'h', fence 4"
    assert gcj_status.lease_from_run(LOCK, None)["taken"] is False


def test_status_without_the_database_says_why_and_without_status_says_so() -> None:
    gcj = base_gcj()
    gcj["spec"]["suspend"] = True
    del gcj["spec"]["timeZone"]
    view = gcj_status.status_view(gcj, lock=LOCK, lease=None,
                                  database_note="database not read (--no-database)")
    lines = gcj_status.status_lines(view)
    assert "Suspended:  yes" in lines
    assert "Schedule:   30 2 * * *  (UTC, the operator's default)" in lines
    assert "Database:   database not read (--no-database)" in lines
    assert not any(line.startswith("Lease:") for line in lines)
    assert lines[lines.index("Conditions:") + 1] == "  none yet (is the operator running?)"
    assert lines[-1] == "  none"


def test_lease_reference_names_the_lock_and_the_dsn_secret() -> None:
    lock, ref, problem = gcj_status.lease_reference(base_gcj())
    assert (lock, ref and (ref.name, ref.key), problem) == (LOCK, ("jobs-db", "dsn"), None)
    broken = base_gcj()
    broken["spec"]["schedule"] = "not a schedule"
    lock, ref, problem = gcj_status.lease_reference(broken)
    assert (lock, ref) == (None, None) and problem and "spec.schedule" in problem


def test_suspend_and_resume_lines_read_like_kubectl() -> None:
    answer = {"namespace": "billing", "guarded_cronjob": "nightly", "suspended": True, "changed": True}
    assert gcj_suspend.result_line(answer) == "guardedcronjob.guardedcron.io/nightly suspended"
    assert gcj_suspend.result_line({**answer, "suspended": False}) == (
        "guardedcronjob.guardedcron.io/nightly resumed")
    assert gcj_suspend.result_line({**answer, "changed": False}) == (
        "guardedcronjob.guardedcron.io/nightly was already suspended (no change)")


def test_a_gitops_manager_is_told_by_its_marks_and_only_then() -> None:
    gcj = base_gcj()
    assert gcj_suspend.gitops_manager(gcj) is None
    gcj["metadata"]["managedFields"] = [{"manager": "kubectl-client-side-apply"}]
    assert gcj_suspend.gitops_manager(gcj) is None
    gcj["metadata"]["managedFields"].append({"manager": "kustomize-controller"})
    assert gcj_suspend.gitops_manager(gcj) == "Flux (field manager kustomize-controller)"
    gcj["metadata"]["labels"] = {"argocd.argoproj.io/instance": "billing"}
    assert gcj_suspend.gitops_manager(gcj) == "Argo CD (label argocd.argoproj.io/instance)"


ENV_SECRET = "env-value-Hk38sQ"
DSN_PASSWORD = "dsn-pw-Lq52xZ"
URL_PASSWORD = "url-pw-Tm91cV"


def secretive_gcj() -> dict[str, Any]:
    """A GuardedCronJob whose spec, annotations and status carry secrets three ways."""
    gcj = base_gcj()
    dsn = f"postgresql://guard:{DSN_PASSWORD}@db:5432/jobs"
    [container] = gcj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    container["env"] = [{"name": "API_TOKEN", "value": ENV_SECRET},
                        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    container["args"] = [f"--dsn={dsn}", f"--hook=https://bot:{URL_PASSWORD}@hooks.example/x"]
    gcj["metadata"]["annotations"] = {support_report.LAST_APPLIED: json.dumps(gcj["spec"]), "team": "billing"}
    gcj["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    gcj["status"] = {"conditions": [{"type": "Ready", "status": "False",
                                     "message": f"cannot reach {dsn} password={DSN_PASSWORD}"}]}
    return gcj


def labelled(kind: str, name: str, owner: str) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": name, "namespace": "billing",
                                      "labels": {contract.LABEL_NAME: owner}}}


def test_the_report_holds_the_objects_of_its_guarded_cronjobs_and_no_secret() -> None:
    gcj = secretive_gcj()
    pod = labelled("Pod", "nightly-invoices-1-x", "nightly-invoices")
    pod["spec"] = {"nodeName": "n1", "containers": [{"name": "task", "image": "shop:1.42",
                                                     "env": [{"name": "T", "value": ENV_SECRET}]}]}
    pod["status"] = {"phase": "Succeeded"}
    events = [{"involvedObject": {"kind": "Job", "name": "nightly-invoices-1"}, "reason": "Completed",
               "message": f"posted to https://bot:{URL_PASSWORD}@hooks.example", "lastTimestamp": "t2"},
              {"involvedObject": {"kind": "Job", "name": "someone-else"}, "reason": "Completed"}]
    report = support_report.build_report(
        namespace="billing", plugin_version="1.2.3", server_version={"gitVersion": "v1.31.0"},
        guarded_cronjobs=[gcj], cronjobs=[labelled("CronJob", "nightly-invoices", "nightly-invoices")],
        jobs=[labelled("Job", "nightly-invoices-1", "nightly-invoices"),
              labelled("Job", "other-1", "other")],
        pods=[pod], events=events,
        deployments=[{"metadata": {"name": "guardedcron", "namespace": "ops"},
                      "spec": {"template": {"spec": {"containers": [{"image": "guardedcron:1.2.3"}]}}}}],
        logs={"ops/guardedcron-abc": ["started", f"connecting to postgresql://op:{DSN_PASSWORD}@db/x"]},
        notes=[], generated_at=NOW)
    text = json.dumps(report)
    for secret in (ENV_SECRET, DSN_PASSWORD, URL_PASSWORD):
        assert secret not in text, secret
    assert [job["metadata"]["name"] for job in report["jobs"]] == ["nightly-invoices-1"]
    assert [event["object"] for event in report["events"]] == ["Job/nightly-invoices-1"]
    assert report["pods"] == [{"metadata": pod["metadata"], "nodeName": "n1",
                               "containers": [{"name": "task", "image": "shop:1.42"}],
                               "status": {"phase": "Succeeded"}}]
    [shared] = report["guardedCronJobs"]
    assert "managedFields" not in shared["metadata"]
    assert shared["metadata"]["annotations"] == {support_report.LAST_APPLIED: "<redacted>", "team": "billing"}
    env = shared["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "API_TOKEN", "value": "<redacted>"},
                   {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    assert report["operator"]["deployments"][0]["images"] == ["guardedcron:1.2.3"]
    assert report["operator"]["logs"]["ops/guardedcron-abc"][0] == "started"
    assert (report["pluginVersion"], report["serverVersion"]) == ("1.2.3", {"gitVersion": "v1.31.0"})


def test_redacted_text_hides_the_userinfo_of_any_url_with_a_password() -> None:
    assert support_report.redacted_text("see https://bot:pw@h.example/x and http://h.example/y") == (
        "see https://<redacted>@h.example/x and http://h.example/y")
    assert support_report.redacted_text("amqp://u:p@mq:5672") == "amqp://<redacted>@mq:5672"


def test_a_secret_passed_as_a_flag_in_a_containers_command_or_args_is_hidden() -> None:
    container = {"name": "task", "command": ["/bin/run", "--api-token", "tk-5512"],
                 "args": ["--password", "Zq93-pw", "--user=billing", "--db-password=Kx71",
                          "-p", "8080", "--client-secret", "s3cr3t", "sh", "-c", "PGPASSWORD=Mm4 psql"]}
    shown = support_report.redacted({"spec": {"containers": [container]}})["spec"]["containers"][0]
    assert shown["command"] == ["/bin/run", "--api-token", "<redacted>"]
    assert shown["args"][:3] == ["--password", "<redacted>", "--user=billing"]
    assert shown["args"][3] in ("--db-password=<redacted>", "--db-password=***")
    assert shown["args"][4:] == ["-p", "8080", "--client-secret", "<redacted>",
                                 "sh", "-c", "PGPASSWORD=*** psql"]
    text = str(shown)
    assert not any(secret in text for secret in ("tk-5512", "Zq93-pw", "Kx71", "s3cr3t", "Mm4"))
