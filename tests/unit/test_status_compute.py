"""compute_status over several passes: idle recomputes, bounded history, counts, conditions."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from guardedcron.status import get_condition, status_changed, status_patch
from tests.support import status_objects as k
from tests.support.status_world import Runs, compute, live_cronjob, slot, the_gcj


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Runs:
    return Runs(tmp_path, monkeypatch)


def condition(status: dict[str, Any], kind: str) -> tuple[str, str]:
    found = get_condition(status["conditions"], kind)
    assert found is not None, kind
    return found["status"], found["reason"]


def test_a_first_pass_over_a_healthy_guardedcronjob(runs: Runs) -> None:
    now = slot(20) + timedelta(minutes=20)
    status = compute([runs.succeeded(slot(19), 5), runs.succeeded(slot(20), 6)], None, now)
    newest = f"{k.CRONJOB}-{k.minute_of(slot(20))}"
    assert status["observedGeneration"] == 1
    assert status["cronJobRef"] == {"name": k.CRONJOB}
    assert status["nextScheduleTime"] == "2025-05-21T00:30:00Z"
    assert status["lastScheduleTime"] == "2025-05-20T00:30:00Z"
    assert status["lastSuccessfulTime"] == "2025-05-20T00:40:00Z"
    assert status["lastRun"]["job"] == newest and status["lastRun"]["fence"] == 6
    assert [r["job"] for r in status["recentRuns"]] == [newest, f"{k.CRONJOB}-{k.minute_of(slot(19))}"]
    assert status["runCounts"] == {"succeeded": 2, "failed": 0, "skipped": 0, "timedOut": 0, "lost": 0,
                                   "guardError": 0}
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("Ready", "True", "CronJobReady"), ("Invalid", "False", "SpecValid"), ("Stalled", "False", "Applied"),
        ("MissedRun", "False", "NoMissedRun"), ("Overlap", "False", "NoOverlap"),
        ("Degraded", "False", "GuardHealthy")]
    assert all(c["observedGeneration"] == 1 and c["lastTransitionTime"] == k.ts(now)
               for c in status["conditions"])


def test_an_idle_recompute_changes_nothing(runs: Runs) -> None:
    world = [runs.succeeded(slot(19), 5), runs.skipped(slot(20), 9), runs.running(slot(21), 7)]
    now = slot(21) + timedelta(minutes=1)
    first = compute(world, None, now)
    for later in (now + timedelta(seconds=10), now + timedelta(hours=3)):
        again = compute(world, first, later)
        assert again == first
        assert not status_changed(first, again)
        assert status_patch(first, again) == {}


def test_next_schedule_time_moves_when_the_schedule_does_and_across_dst(runs: Runs) -> None:
    before = compute([], None, datetime(2025, 3, 29, 12, 0, tzinfo=UTC))
    assert before["nextScheduleTime"] == "2025-03-31T00:30:00Z"  # no 02:30 on 30 March
    after = compute([], before, datetime(2025, 3, 31, 0, 30, tzinfo=UTC))
    assert after["nextScheduleTime"] == "2025-04-01T00:30:00Z"
    assert status_changed(before, after)
    suspended = compute([], after, datetime(2025, 3, 31, 1, 0, tzinfo=UTC), gcj=the_gcj(suspend=True))
    assert "nextScheduleTime" not in suspended
    assert status_patch(after, suspended)["nextScheduleTime"] is None
    assert condition(suspended, "MissedRun") == ("False", "Suspended")


def test_history_is_bounded_newest_first_and_outlives_the_jobs(runs: Runs) -> None:
    all_runs = [runs.succeeded(slot(day), day) for day in range(1, 16)]
    now = slot(15) + timedelta(minutes=30)
    first = compute(all_runs, None, now)
    assert [r["fence"] for r in first["recentRuns"]] == list(range(15, 5, -1))
    # The CronJob's history limit deleted all but 3 Jobs; the records stay.
    second = compute(all_runs[-3:], first, now + timedelta(minutes=1))
    assert second["recentRuns"] == first["recentRuns"]
    assert not status_changed(first, second)
    # A smaller limit trims at once.
    third = compute(all_runs[-3:], second, now + timedelta(minutes=2), gcj=the_gcj(recentRunsLimit=4))
    assert [r["fence"] for r in third["recentRuns"]] == [15, 14, 13, 12]
    assert third["lastRun"] == third["recentRuns"][0]


def test_run_counts_count_each_run_once_across_passes_and_deletions(runs: Runs) -> None:
    now = slot(12) + timedelta(minutes=5)
    world = [runs.succeeded(slot(10), 1), runs.guard_error(slot(11)), runs.running(slot(12), 2)]
    first = compute(world, None, now)
    assert first["runCounts"] == {"succeeded": 1, "failed": 0, "skipped": 0, "timedOut": 0, "lost": 0,
                                  "guardError": 1}
    again = compute(world, first, now + timedelta(seconds=5))
    assert again["runCounts"] == first["runCounts"]
    world[2] = runs.succeeded(slot(12), 2)
    finished = compute(world, again, now + timedelta(minutes=10))
    assert finished["runCounts"]["succeeded"] == 2
    deleted = compute([world[2]], finished, now + timedelta(minutes=11))
    assert deleted["runCounts"] == finished["runCounts"]


def test_with_no_history_kept_last_run_still_remembers_and_counts_once(runs: Runs) -> None:
    """recentRunsLimit 0: lastRun is the only memory. Runs seen through their life (the
    normal case, one pass per change) are each counted once; see docs/design.md."""
    gcj = the_gcj(recentRunsLimit=0)
    now = slot(12) + timedelta(minutes=30)
    status: dict[str, Any] | None = None
    steps = [
        [runs.running(slot(11), 1)],
        [runs.succeeded(slot(11), 1)],
        [runs.succeeded(slot(11), 1), runs.running(slot(12), 2)],
        [runs.succeeded(slot(11), 1), runs.succeeded(slot(12), 2)],
        [runs.succeeded(slot(11), 1), runs.succeeded(slot(12), 2)],
        [runs.succeeded(slot(12), 2)],
    ]
    for number, world in enumerate(steps):
        status = compute(world, status, now + timedelta(minutes=number), gcj=gcj)
        assert status["recentRuns"] == []
    assert status is not None
    assert status["lastRun"]["fence"] == 2 and status["runCounts"]["succeeded"] == 2


def test_a_final_record_never_changes_even_when_the_pod_is_gone(runs: Runs) -> None:
    job, pods = runs.succeeded(slot(10), 4)
    now = slot(10) + timedelta(minutes=30)
    first = compute([(job, pods)], None, now)
    second = compute([(job, [])], first, now + timedelta(minutes=1))
    assert second["recentRuns"] == first["recentRuns"] and second["lastRun"]["fence"] == 4


def test_a_running_job_deleted_before_its_end_is_closed_as_failed(runs: Runs) -> None:
    now = slot(10) + timedelta(minutes=3)
    first = compute([runs.running(slot(10), 4)], None, now)
    gone = compute([], first, now + timedelta(minutes=1))
    run = gone["lastRun"]
    assert run["outcome"] == "Failed" and run["finishedAt"] == k.ts(now + timedelta(minutes=1))
    assert run["reason"].startswith("Job deleted before it finished (last seen Running")
    assert gone["runCounts"]["failed"] == 1


def test_a_run_whose_pod_went_with_its_deadline_keeps_holder_and_fence(runs: Runs) -> None:
    # Found by the e2e takeover scenario: the Job controller deletes the pod at the
    # deadline, so the final pass sees no guard message; what the earlier pass read stays.
    now = slot(10) + timedelta(minutes=3)
    job, pods = runs.running(slot(10), 4)
    first = compute([(job, pods)], None, now)
    timed_out = copy.deepcopy(job)
    timed_out["status"] = {"active": 0, "failed": 1, "conditions": k.failed_conditions(
        "DeadlineExceeded", "Job was active longer than specified deadline", now)}
    final = compute([(timed_out, [])], first, now + timedelta(minutes=1))
    run, before = final["lastRun"], first["lastRun"]
    assert run["outcome"] == "TimedOut" and "finishedAt" in run
    assert (run["holder"], run["fence"], run["startedAt"]) == (
        before["holder"], 4, before["startedAt"])


def test_ready_follows_the_cronjob(runs: Runs) -> None:
    gcj = the_gcj()
    now = slot(10)
    assert condition(compute([], None, now, cronjob=None), "Ready") == ("False", "CronJobMissing")
    drifted = live_cronjob(gcj)
    drifted["spec"]["schedule"] = "0 3 * * *"
    status = compute([], None, now, cronjob=drifted)
    assert condition(status, "Ready") == ("False", "CronJobOutOfDate")
    assert "spec.schedule is '0 3 * * *', expected '30 2 * * *'" in status["conditions"][0]["message"]
    stranger = live_cronjob(gcj)
    stranger["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    assert condition(compute([], None, now, cronjob=stranger), "Ready") == ("False", "CronJobOutOfDate")
    unguarded = live_cronjob(gcj)
    del unguarded["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"]
    assert condition(compute([], None, now, cronjob=unguarded), "Ready") == ("False", "CronJobOutOfDate")


def test_a_refused_apply_is_stalled_and_not_ready() -> None:
    refusal = 'CronJob.batch "nightly-invoices" is invalid: spec.jobTemplate: Invalid value'
    status = compute([], None, slot(10), cronjob=None, apply_error=refusal)
    assert condition(status, "Stalled") == ("True", "CronJobRejected")
    assert condition(status, "Ready") == ("False", "CronJobRejected")
    stalled = get_condition(status["conditions"], "Stalled") or {}
    assert stalled["message"] == f"the CronJob cannot be applied: {refusal}"


def test_an_invalid_spec_is_reported_and_runs_are_still_tracked(runs: Runs) -> None:
    gcj = the_gcj(schedule="61 * * * *")
    now = slot(10) + timedelta(minutes=20)
    status = compute([runs.succeeded(slot(10), 3)], None, now, gcj=gcj)
    assert condition(status, "Invalid") == ("True", "SpecInvalid")
    assert (get_condition(status["conditions"], "Invalid") or {})["message"].startswith("spec.schedule: ")
    assert condition(status, "Ready") == ("False", "SpecInvalid")
    assert condition(status, "MissedRun") == ("Unknown", "SpecInvalid")
    assert "nextScheduleTime" not in status and status["lastRun"]["fence"] == 3


def test_conditions_keep_their_transition_time_and_follow_the_generation(runs: Runs) -> None:
    now = slot(10)
    first = compute([], None, now)
    gcj = the_gcj()
    gcj["metadata"]["generation"] = 2
    second = compute([], first, now + timedelta(hours=1), gcj=gcj)
    assert second["observedGeneration"] == 2
    assert all(c["observedGeneration"] == 2 and c["lastTransitionTime"] == k.ts(now)
               for c in second["conditions"])


def test_missed_run_condition(runs: Runs) -> None:
    now = slot(11) + timedelta(minutes=11)
    status = compute([runs.succeeded(slot(10), 3)], None, now)
    assert condition(status, "MissedRun") == ("True", "SlotMissed")
    message = (get_condition(status["conditions"], "MissedRun") or {})["message"]
    expected_job = f"{k.CRONJOB}-{k.minute_of(slot(11))}"
    assert message == (f"no run for the slot at 2025-05-11T00:30:00Z (Job {expected_job} "
                       "was never created); it was due by 2025-05-11T00:41:00Z")
    caught_up = compute([runs.succeeded(slot(10), 3), runs.running(slot(11), 4)], status,
                        now + timedelta(minutes=1))
    assert condition(caught_up, "MissedRun") == ("False", "NoMissedRun")


def test_overlap_condition_from_two_running_runs(runs: Runs) -> None:
    now = slot(10) + timedelta(minutes=5)
    manual = runs.running(slot(10) + timedelta(minutes=2), 5, manual=True)
    status = compute([runs.running(slot(10), 4), manual], None, now)
    assert condition(status, "Overlap") == ("True", "RunsOverlapped")
    assert (get_condition(status["conditions"], "Overlap") or {})["message"] == (
        f"run {k.CRONJOB}-manual-5 (fence 5) started while run {k.CRONJOB}-{k.minute_of(slot(10))} "
        "(fence 4) was still active")


def test_degraded_after_three_guard_errors_in_a_row(runs: Runs) -> None:
    now = slot(14) + timedelta(minutes=20)
    two = compute([runs.succeeded(slot(10), 1), runs.guard_error(slot(11)), runs.guard_error(slot(12))],
                  None, now)
    assert condition(two, "Degraded") == ("False", "GuardHealthy")
    three = compute([runs.guard_error(slot(13))], two, now)
    assert condition(three, "Degraded") == ("True", "RepeatedGuardErrors")
    assert (get_condition(three["conditions"], "Degraded") or {})["message"].startswith(
        "the last 3 runs could not reach a decision; latest: guard exited 69 (database unreachable)")
    healed = compute([runs.succeeded(slot(14), 2)], three, now)
    assert condition(healed, "Degraded") == ("False", "GuardHealthy")


def test_last_schedule_time_from_the_cronjob_when_newer(runs: Runs) -> None:
    gcj = the_gcj()
    now = slot(12) + timedelta(minutes=20)
    status = compute([runs.succeeded(slot(10), 1)], None, now, cronjob=live_cronjob(gcj, slot(12)))
    assert status["lastScheduleTime"] == k.ts(slot(12))
    # It never goes back, even when the CronJob is recreated without status.
    later = compute([runs.succeeded(slot(10), 1)], status, now, cronjob=live_cronjob(gcj))
    assert later["lastScheduleTime"] == k.ts(slot(12))


def test_status_patch_nulls_fields_that_went_away() -> None:
    old = {"lastRun": {"job": "a", "fence": 3, "holder": "h"}, "nextScheduleTime": "x",
           "kopf": {"progress": {}}}
    new = {"lastRun": {"job": "b", "holder": "h"}}
    assert status_patch(old, new) == {"lastRun": {"job": "b", "fence": None}, "nextScheduleTime": None}
    assert status_changed(old, copy.deepcopy(old)) is False
    assert status_changed({"kopf": 1}, {}) is False  # keys compute_status does not own


def test_a_slot_turned_away_by_another_slots_lease_is_reported_missed(runs: Runs) -> None:
    now = slot(20) + timedelta(minutes=20)
    held = compute([runs.succeeded(slot(19), 5), runs.skipped(slot(20), 6, "lease-held")], None, now)
    assert condition(held, "MissedRun") == ("True", "LeaseHeld")
    ran_elsewhere = compute([runs.succeeded(slot(19), 5), runs.skipped(slot(20), 6)], None, now)
    assert condition(ran_elsewhere, "MissedRun") == ("False", "NoMissedRun")
