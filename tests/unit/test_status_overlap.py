"""Overlap detection from fences and run lifetimes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from guardedcron.status import Outcome, Overlap, RunRecord, find_overlaps

T = datetime(2025, 6, 2, 0, 30, tzinfo=UTC)


def run(job: str, outcome: Outcome, fence: int | None, start_min: float | None,
        end_min: float | None = None) -> RunRecord:
    return RunRecord(
        job=job, outcome=outcome, reason="r", holder=f"billing/{job}-pod", fence=fence,
        started_at=None if start_min is None else T + timedelta(minutes=start_min),
        finished_at=None if end_min is None else T + timedelta(minutes=end_min),
    )


def test_two_running_runs_with_fences_overlap() -> None:
    a = run("a", Outcome.RUNNING, 7, 0)
    b = run("b", Outcome.RUNNING, 8, 5)
    assert find_overlaps([b, a]) == [Overlap(a, b)]
    assert Overlap(a, b).describe() == "run b (fence 8) started while run a (fence 7) was still active"


def test_a_later_fence_handed_out_before_the_earlier_run_ended() -> None:
    a = run("a", Outcome.SUCCEEDED, 7, 0, 30)
    b = run("b", Outcome.FAILED, 8, 29, 40)
    assert find_overlaps([a, b]) == [Overlap(a, b)]


def test_back_to_back_runs_do_not_overlap() -> None:
    a = run("a", Outcome.SUCCEEDED, 7, 0, 30)
    b = run("b", Outcome.SUCCEEDED, 8, 30, 45)  # started the second a ended
    c = run("c", Outcome.RUNNING, 9, 60)
    assert find_overlaps([a, b, c]) == []


def test_runs_that_never_won_the_lease_take_no_part() -> None:
    a = run("a", Outcome.RUNNING, 7, 0)
    skipped = run("s", Outcome.SKIPPED, 7, 1, 1)  # the winner's fence, not its own
    guard_error = run("g", Outcome.GUARD_ERROR, None, 2, 2)
    deciding = run("d", Outcome.RUNNING, None, 3)
    assert find_overlaps([a, skipped, guard_error, deciding]) == []


def test_a_lost_run_still_working_overlaps_the_run_that_took_over() -> None:
    lost = run("a", Outcome.LOST, 7, 0)
    taker = run("b", Outcome.RUNNING, 8, 20)
    timed_out = run("c", Outcome.TIMED_OUT, 9, 90, 150)
    assert find_overlaps([lost, taker, timed_out]) == [
        Overlap(lost, taker), Overlap(lost, timed_out), Overlap(taker, timed_out)]


def test_one_record_per_job() -> None:
    a = run("a", Outcome.RUNNING, 7, 0)
    assert find_overlaps([a, a]) == []
