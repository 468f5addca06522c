"""Stop after repeated failures (status/suspension.py), with an injected clock, and how the
CronJob and the status show it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from guardedcron.builders import build_cronjob
from guardedcron.spec import parse_guarded_cronjob
from guardedcron.status import RunRecord, SchedulingStatus, compute_status
from guardedcron.status.conditions import SUSPENDED, get_condition
from guardedcron.status.runs import Outcome
from guardedcron.status.suspension import decide_suspension, failure_streak
from tests.support.gcj import DEFAULT_SETTINGS, base_gcj, put

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def run(n: int, outcome: Outcome, *, minutes_ago: int | None = None) -> RunRecord:
    finished = NOW - timedelta(minutes=minutes_ago if minutes_ago is not None else 100 - n)
    return RunRecord(job=f"job-{n}", outcome=outcome, reason="x", started_at=finished - timedelta(minutes=1),
                     finished_at=finished)


def newest_first(*runs: RunRecord) -> list[RunRecord]:
    return sorted(runs, key=lambda r: r.finished_at or NOW, reverse=True)


def decide(runs: list[RunRecord], *, threshold: int | None = 3, previous: dict | None = None,
           generation: int = 1, token: str | None = None, now: datetime = NOW):  # type: ignore[no-untyped-def]
    return decide_suspension(threshold, runs_newest_first=runs, previous=previous, generation=generation,
                             resume_token=token, now=now)


def test_failed_timed_out_and_lost_count_skipped_and_guard_error_neither_count_nor_break() -> None:
    runs = newest_first(run(1, Outcome.SUCCEEDED), run(2, Outcome.FAILED), run(3, Outcome.SKIPPED),
                        run(4, Outcome.TIMED_OUT), run(5, Outcome.GUARD_ERROR), run(6, Outcome.LOST))
    assert [r.job for r in failure_streak(runs, count_from=None)] == ["job-6", "job-4", "job-2"]
    decision = decide(runs)
    assert decision.suspended and decision.failed_runs == ("job-6", "job-4", "job-2")
    assert decision.note is not None and decision.note[0] == "SuspendedAfterFailures"
    assert "job-6 (Lost), job-4 (TimedOut), job-2 (Failed)" in decision.note[1]


def test_a_success_breaks_the_streak_and_a_running_run_is_not_counted() -> None:
    runs = newest_first(run(1, Outcome.FAILED), run(2, Outcome.FAILED), run(3, Outcome.SUCCEEDED),
                        run(4, Outcome.FAILED), run(5, Outcome.FAILED))
    running = RunRecord(job="job-6", outcome=Outcome.RUNNING, reason="x", started_at=NOW)
    assert not decide([running, *runs]).suspended
    assert decide(newest_first(run(1, Outcome.FAILED), *runs[:2]), threshold=2).suspended


def test_unset_never_suspends() -> None:
    runs = newest_first(*(run(n, Outcome.FAILED) for n in range(10)))
    decision = decide(runs, threshold=None)
    assert not decision.suspended and decision.status is None


def test_stays_suspended_until_a_new_resume_token_then_counts_from_the_resume() -> None:
    runs = newest_first(*(run(n, Outcome.FAILED) for n in range(3)))
    suspended = decide(runs)
    # Still suspended on later passes, with the same status (nothing to write).
    later = decide(runs, previous=suspended.status, now=NOW + timedelta(hours=1))
    assert later.suspended and later.status == suspended.status and later.note is None
    resumed = decide(runs, previous=suspended.status, token="r1", now=NOW + timedelta(hours=1))
    assert not resumed.suspended and resumed.note is not None and "'r1'" in resumed.note[1]
    # The old failures no longer count; the token is used up.
    again = decide(runs, previous=resumed.status, token="r1", now=NOW + timedelta(hours=2))
    assert not again.suspended and again.note is None
    new_failures = [run(n, Outcome.FAILED, minutes_ago=-60 - n) for n in (12, 11, 10)]
    assert decide([*new_failures, *runs], previous=resumed.status, token="r1",
                  now=NOW + timedelta(hours=3)).suspended


def test_a_token_seen_while_running_does_not_lift_a_later_suspension() -> None:
    quiet = decide([], token="r1")
    assert quiet.status == {"lastResumeToken": "r1"}
    runs = newest_first(*(run(n, Outcome.FAILED) for n in range(3)))
    suspended = decide(runs, previous=quiet.status, token="r1")
    assert suspended.suspended
    assert decide(runs, previous=suspended.status, token="r1").suspended


def test_a_new_generation_resumes() -> None:
    runs = newest_first(*(run(n, Outcome.FAILED) for n in range(3)))
    suspended = decide(runs, generation=4)
    resumed = decide(runs, previous=suspended.status, generation=5)
    assert not resumed.suspended and "generation 5" in (resumed.note or ("", ""))[1]


def test_the_cronjob_is_suspended_and_status_says_why() -> None:
    body = put(base_gcj(), "spec.suspendAfterFailures", 2)
    parsed = parse_guarded_cronjob(body)
    assert build_cronjob(parsed, DEFAULT_SETTINGS)["spec"]["suspend"] is False
    cronjob = build_cronjob(parsed, DEFAULT_SETTINGS, suspended_for_failures=True)
    assert cronjob["spec"]["suspend"] is True
    cronjob["metadata"]["creationTimestamp"] = "2026-11-01T00:00:00Z"
    scheduling = SchedulingStatus(failures={"suspended": True, "failedRuns": ["job-2", "job-1"]},
                                  suspended_for_failures=True, failed_runs=("job-2", "job-1"))
    change = compute_status(gcj=body, parsed=parsed, cronjob=cronjob, jobs=[], pods_by_job={},
                            previous_status=None, now=NOW, scheduling=scheduling)
    condition = get_condition(change.status["conditions"], SUSPENDED)
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "RepeatedFailures")
    assert "job-2, job-1" in condition["message"]
    ready = get_condition(change.status["conditions"], "Ready")
    assert ready is not None and ready["status"] == "True", ready  # the suspended CronJob is as wanted
    missed = get_condition(change.status["conditions"], "MissedRun")
    assert missed is not None and missed["reason"] == "Suspended"
    assert "nextScheduleTime" not in change.status
    assert change.status["failures"]["failedRuns"] == ["job-2", "job-1"]


def test_without_the_field_no_suspended_condition_appears() -> None:
    parsed = parse_guarded_cronjob(base_gcj())
    change = compute_status(gcj=base_gcj(), parsed=parsed, cronjob=None, jobs=[], pods_by_job={},
                            previous_status=None, now=NOW, scheduling=SchedulingStatus())
    assert get_condition(change.status["conditions"], SUSPENDED) is None
    assert not {"failures", "catchUp", "backfill"} & set(change.status)
