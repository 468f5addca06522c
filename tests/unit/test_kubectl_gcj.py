"""The pure halves of `kubectl gcj status`, `suspend`/`resume` and `report`: what they
print, built from API objects and database rows shaped like the real ones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from guardedcron.cli import gcj_status, gcj_suspend
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
    assert "Schedule:   30 2 * * *  (UTC (the operator's default))" in lines
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
