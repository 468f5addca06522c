"""Run classification: every outcome from Jobs and Pods shaped like the API server's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from guardedcron import contract
from guardedcron.status import Outcome, RunRecord, classify_run
from tests.support import status_objects as k

SLOT = datetime(2025, 6, 2, 0, 30, tzinfo=UTC)  # 02:30 in Stockholm (CEST, +02:00)
CEST = timedelta(hours=2)
T0 = SLOT + timedelta(seconds=1)  # Job created
GUARD_START = T0 + timedelta(seconds=3)
GUARD_END = T0 + timedelta(seconds=4)
END = T0 + timedelta(minutes=12)
WINNER = "other-cluster/billing/nightly-invoices-29144730-abcde"


@pytest.fixture
def message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(summary: dict[str, Any]) -> str:
        return k.guard_message(summary, tmp_path, monkeypatch)
    return make


def scheduled_job(**kwargs: Any) -> dict[str, Any]:
    return k.job(slot_time=SLOT, created=T0, zone_offset=CEST, started=T0, **kwargs)


def guard(exit_code: int, text: str | None) -> dict[str, Any]:
    return k.container_status(contract.GUARD_CONTAINER,
                              state={"terminated": k.terminated(exit_code, GUARD_START, GUARD_END, text)})


def acquired_guard(message: Any, job: dict[str, Any], fence: int = 12) -> dict[str, Any]:
    return guard(0, message(k.acquired_summary(k.holder_of(job), fence, k.minute_of(SLOT))))


def running(name: str) -> dict[str, Any]:
    return k.container_status(name, state={"running": {"startedAt": k.ts(GUARD_END)}}, ready=True,
                              started=True)


def test_a_job_without_a_pod_is_running_and_waiting() -> None:
    job = scheduled_job(active=1)
    run = classify_run(job, [])
    assert run == RunRecord(job=job["metadata"]["name"], outcome=Outcome.RUNNING, reason="waiting for a pod",
                            slot=k.minute_of(SLOT), manual=False, scheduled_at=SLOT, started_at=T0)


def test_a_guard_still_deciding_gives_no_fence() -> None:
    job = scheduled_job(active=1)
    pod = k.pod(job, created=T0, phase="Pending", init_statuses=[
        k.container_status(contract.GUARD_CONTAINER, state={"running": {"startedAt": k.ts(GUARD_START)}},
                           started=True)])
    run = classify_run(job, [pod])
    assert (run.outcome, run.reason, run.fence, run.holder) == (Outcome.RUNNING, "guard deciding", None, None)
    assert not run.held_lease


def test_a_run_that_won_the_lease_shows_holder_fence_and_slot(message: Any) -> None:
    job = scheduled_job(active=1)
    pod = k.pod(job, created=T0, phase="Running",
                init_statuses=[acquired_guard(message, job, fence=12), running(contract.KEEPER_CONTAINER)],
                statuses=[running("task")])
    run = classify_run(job, [pod])
    assert run.outcome is Outcome.RUNNING
    assert run.reason == "workload running with fence 12"
    assert (run.holder, run.fence, run.slot) == (k.holder_of(job), 12, k.minute_of(SLOT))
    assert run.started_at == GUARD_END  # the lease was won when the guard exited
    assert run.finished_at is None and run.held_lease


def test_succeeded(message: Any) -> None:
    job = scheduled_job(conditions=k.complete_conditions(END), completion=END, counts={"succeeded": 1})
    pod = k.pod(job, created=T0, phase="Succeeded", init_statuses=[
        acquired_guard(message, job),
        k.container_status(contract.KEEPER_CONTAINER, state={"terminated": k.terminated(
            0, GUARD_END, END, message({"outcome": "released", "lock": k.LOCK, "holder": k.holder_of(job),
                                        "fence": 12, "renewals": 4}))})],
        statuses=[k.container_status("task", state={"terminated": k.terminated(0, GUARD_END, END)})])
    run = classify_run(job, [pod])
    assert (run.outcome, run.reason, run.fence, run.finished_at) == (
        Outcome.SUCCEEDED, "workload completed", 12, END)
    assert run.final


def test_workload_failure_names_the_container_and_exit_code(message: Any) -> None:
    job = scheduled_job(conditions=k.failed_conditions(
        "BackoffLimitExceeded", "Job has reached the specified backoff limit", END), counts={"failed": 1})
    pod = k.pod(job, created=T0, phase="Failed", init_statuses=[acquired_guard(message, job)],
                statuses=[k.container_status("task", state={"terminated": k.terminated(3, GUARD_END, END)})])
    run = classify_run(job, [pod])
    assert (run.outcome, run.reason, run.fence, run.finished_at) == (
        Outcome.FAILED, "container task exited 3 (Error)", 12, END)


def test_a_failed_user_init_container_is_the_workload_failing(message: Any) -> None:
    job = scheduled_job(conditions=k.failed_conditions(
        "BackoffLimitExceeded", "Job has reached the specified backoff limit", END))
    pod = k.pod(job, created=T0, phase="Failed", init_statuses=[
        acquired_guard(message, job),
        k.container_status("migrate", state={"terminated": k.terminated(
            137, GUARD_END, END, reason="OOMKilled")})])
    assert classify_run(job, [pod]).reason == "container migrate exited 137 (OOMKilled)"


def test_an_evicted_pod_is_named_when_no_container_failed(message: Any) -> None:
    job = scheduled_job(conditions=k.failed_conditions(
        "BackoffLimitExceeded", "Job has reached the specified backoff limit", END))
    pod = k.pod(job, created=T0, phase="Failed", init_statuses=[acquired_guard(message, job)],
                statuses=[k.container_status("task", state={"terminated": k.terminated(
                    0, GUARD_END, END, reason="ContainerStatusUnknown")})])
    pod["status"] |= {"reason": "Evicted", "message": "The node was low on resource: memory. "}
    run = classify_run(job, [pod])
    assert (run.outcome, run.reason) == (Outcome.FAILED, "pod Evicted: The node was low on resource: memory.")
    del pod["status"]["reason"]
    assert classify_run(job, [pod]).reason == (
        "BackoffLimitExceeded: Job has reached the specified backoff limit")


def test_skip_because_the_lease_is_held_names_the_holder_and_its_fence(message: Any) -> None:
    job = scheduled_job(conditions=k.failed_conditions(
        "PodFailurePolicy", k.rule_message(k.pod_name(scheduled_job()), 75, 0), END), counts={"failed": 1})
    text = message(k.skipped_summary(k.holder_of(job), WINNER, 41, k.minute_of(SLOT)))
    pod = k.pod(job, created=T0, phase="Failed", init_statuses=[guard(75, text)])
    run = classify_run(job, [pod])
    assert run.outcome is Outcome.SKIPPED
    assert run.reason == f"lease held by {WINNER} (fence 41)"
    assert (run.holder, run.fence, run.slot) == (WINNER, 41, k.minute_of(SLOT))
    assert run.finished_at == END and not run.held_lease


def test_a_skip_is_final_as_soon_as_the_guard_exits(message: Any) -> None:
    """podFailurePolicy will fail the Job at once; the record does not wait for it."""
    job = scheduled_job(active=1)
    text = message(k.skipped_summary(k.holder_of(job), WINNER, 41, k.minute_of(SLOT), reason="slot-claimed"))
    pod = k.pod(job, created=T0, phase="Failed", init_statuses=[guard(75, text)])
    run = classify_run(job, [pod])
    assert run.outcome is Outcome.SKIPPED
    assert run.reason == f"slot {k.minute_of(SLOT)} already ran under {WINNER} (fence 41)"
    assert run.finished_at == GUARD_END


def test_timed_out_keeps_the_fence(message: Any) -> None:
    job = scheduled_job(conditions=k.failed_conditions(
        "DeadlineExceeded", "Job was active longer than specified deadline", END), counts={"failed": 1})
    killed = k.container_status("task", state={"terminated": k.terminated(137, GUARD_END, END)})
    pod = k.pod(job, created=T0, phase="Failed", init_statuses=[acquired_guard(message, job)],
                statuses=[killed])
    run = classify_run(job, [pod])
    assert (run.outcome, run.fence) == (Outcome.TIMED_OUT, 12)
    assert run.reason == "active deadline exceeded (3600 s)"


@pytest.mark.parametrize(("exit_code", "meaning", "guard_reason"), [
    (69, "database unreachable", "cannot reach the database at db.internal:5432: connection refused"),
    (78, "database schema missing or outdated", "schema is missing: run `guardedcron db migrate`"),
    (64, "bad input", "--lease-seconds must be positive"),
    (70, "internal error", "unexpected error (ValueError): ..."),
])
def test_guard_errors(message: Any, exit_code: int, meaning: str, guard_reason: str) -> None:
    job = scheduled_job(conditions=k.failed_conditions(
        "PodFailurePolicy", k.rule_message(k.pod_name(scheduled_job()), exit_code, 1), END))
    text = message(k.error_summary(k.holder_of(job), exit_code, guard_reason))
    pod = k.pod(job, created=T0, phase="Failed", init_statuses=[guard(exit_code, text)])
    run = classify_run(job, [pod])
    assert run.outcome is Outcome.GUARD_ERROR
    assert run.reason == f"guard exited {exit_code} ({meaning}): {guard_reason}"
    assert run.fence is None and not run.held_lease


def test_a_crashed_guard_leaves_its_log_tail_and_is_a_guard_error() -> None:
    """FallbackToLogsOnError: no JSON, the last log lines instead."""
    job = scheduled_job(conditions=k.failed_conditions(
        "BackoffLimitExceeded", "Job has reached the specified backoff limit", END))
    log_tail = "Traceback (most recent call last):\n  File \"guardedcron\", line 1\nMemoryError\n"
    pod = k.pod(job, created=T0, phase="Failed", init_statuses=[guard(1, log_tail)])
    run = classify_run(job, [pod])
    assert (run.outcome, run.reason, run.holder) == (Outcome.GUARD_ERROR, "guard exited 1 (Error)", None)


def test_lease_lost_while_running_then_after_the_job_ends(message: Any) -> None:
    job = scheduled_job(active=1)
    lost = message({"outcome": "lost", "lock": k.LOCK, "holder": k.holder_of(job), "fence": 12,
                    "reason": f"lease taken over by {WINNER} with fence 13"})
    keeper = k.container_status(
        contract.KEEPER_CONTAINER, state={"running": {"startedAt": k.ts(END - timedelta(minutes=2))}},
        last_state={"terminated": k.terminated(76, GUARD_END, END - timedelta(minutes=2), lost)},
        restarts=1, ready=True, started=True)
    pod = k.pod(job, created=T0, phase="Running", init_statuses=[acquired_guard(message, job), keeper],
                statuses=[running("task")])
    run = classify_run(job, [pod])
    assert run.outcome is Outcome.LOST and not run.final
    assert run.reason == f"lease lost: lease taken over by {WINNER} with fence 13; workload still running"
    assert (run.holder, run.fence) == (k.holder_of(job), 12)

    done = scheduled_job(conditions=k.complete_conditions(END), completion=END)
    run = classify_run(done, [pod])
    assert (run.outcome, run.finished_at) == (Outcome.LOST, END)
    assert run.reason.endswith("; then Succeeded: workload completed")


def test_lease_lost_known_only_by_exit_code(message: Any) -> None:
    job = scheduled_job(active=1)
    keeper = k.container_status(contract.KEEPER_CONTAINER,
                                state={"terminated": k.terminated(76, GUARD_END, END, "killed")})
    pod = k.pod(job, created=T0, phase="Running", init_statuses=[acquired_guard(message, job), keeper],
                statuses=[running("task")])
    run = classify_run(job, [pod])
    assert run.outcome is Outcome.LOST
    assert run.reason.startswith("lease lost: keeper exited 76 (termination message is not JSON")


def test_a_keeper_that_released_is_not_a_loss(message: Any) -> None:
    job = scheduled_job(active=1)
    released = message({"outcome": "released", "lock": k.LOCK, "holder": k.holder_of(job), "fence": 12,
                        "renewals": 3})
    keeper = k.container_status(contract.KEEPER_CONTAINER,
                                state={"terminated": k.terminated(0, GUARD_END, END, released)})
    pod = k.pod(job, created=T0, phase="Running", init_statuses=[acquired_guard(message, job), keeper],
                statuses=[running("task")])
    assert classify_run(job, [pod]).outcome is Outcome.RUNNING


@pytest.mark.parametrize(("text", "why"), [
    (None, "no termination message"),
    ("", "no termination message"),
    ("lease acquired", "termination message is not JSON (the container's log tail?)"),
    ("[1, 2]", "termination message is JSON but not an object"),
])
def test_an_unreadable_guard_message_degrades_to_an_unknown_fence(text: str | None, why: str) -> None:
    job = scheduled_job(active=1)
    pod = k.pod(job, created=T0, phase="Running", init_statuses=[guard(0, text)], statuses=[running("task")])
    run = classify_run(job, [pod])
    assert (run.outcome, run.reason, run.fence, run.holder) == (
        Outcome.RUNNING, f"workload running with fence unknown: {why}", None, None)


def test_message_fields_are_checked_not_trusted(message: Any) -> None:
    job = scheduled_job(active=1)
    noisy = "ns/pod\x1b[31m" + "x" * 400
    text = message({"outcome": "acquired", "holder": noisy, "fence": "12", "slot": True})
    pod = k.pod(job, created=T0, phase="Running", init_statuses=[guard(0, text)], statuses=[running("task")])
    run = classify_run(job, [pod])
    assert run.fence is None and run.holder is None  # a string fence is no fence
    assert run.slot == k.minute_of(SLOT)  # from the Job name, not the bogus `true`
    text = message({"outcome": "acquired", "holder": "ns/pod\x1b[31m" + "x" * 400, "fence": 7})
    pod = k.pod(job, created=T0, phase="Running", init_statuses=[guard(0, text)], statuses=[running("task")])
    holder = classify_run(job, [pod]).holder
    assert holder is not None and "\x1b" not in holder and len(holder) == 300 and holder.endswith("…")


@pytest.mark.parametrize(("exit_code", "index", "outcome"), [
    (75, 0, Outcome.SKIPPED),
    (69, 1, Outcome.GUARD_ERROR),
])
def test_pod_gone_the_job_condition_still_tells_skip_from_guard_error(
        exit_code: int, index: int, outcome: Outcome) -> None:
    job = scheduled_job(conditions=k.failed_conditions(
        "PodFailurePolicy", k.rule_message(k.pod_name(scheduled_job()), exit_code, index), END))
    run = classify_run(job, [])
    assert run.outcome is outcome
    assert run.reason.startswith(f"guard exited {exit_code}") and run.reason.endswith("the pod is gone")
    assert run.finished_at == END


def test_pod_gone_after_success_says_holder_and_fence_are_unknown() -> None:
    job = scheduled_job(conditions=k.complete_conditions(END), completion=END)
    run = classify_run(job, [])
    assert (run.outcome, run.fence) == (Outcome.SUCCEEDED, None)
    assert run.reason == "workload completed; the pod is gone, so holder and fence are unknown"


@pytest.mark.parametrize("how", ["kubectl", "trigger", "no-annotation"])
def test_manual_runs(message: Any, how: str) -> None:
    job = k.job(slot_time=None, created=T0, started=T0, active=1,
                manual_annotation=None if how == "no-annotation" else how)
    pod = k.pod(job, created=T0, phase="Running",
                init_statuses=[guard(0, message(k.acquired_summary(k.holder_of(job), 13, None)))],
                statuses=[running("task")])
    run = classify_run(job, [pod])
    assert run.manual and run.slot is None and run.scheduled_at is None
    assert (run.outcome, run.fence) == (Outcome.RUNNING, 13)


def test_a_slot_named_job_without_the_annotation_is_scheduled() -> None:
    """Clusters before the annotation (GA in 1.32): the name alone, as the guard reads it."""
    job = scheduled_job(active=1)
    del job["metadata"]["annotations"][contract.ANNOTATION_SCHEDULED_TIMESTAMP]
    run = classify_run(job, [])
    assert (run.manual, run.slot, run.scheduled_at) == (False, k.minute_of(SLOT), SLOT)


def test_a_job_named_like_a_slot_but_made_by_hand_is_manual() -> None:
    job = scheduled_job(active=1, manual_annotation="trigger")
    run = classify_run(job, [])
    assert run.manual and run.slot is None


def test_scheduled_time_read_from_the_annotation_in_the_cronjobs_zone() -> None:
    job = k.job(slot_time=SLOT, created=T0, zone_offset=timedelta(hours=-4), name="renamed-by-someone")
    annotation = job["metadata"]["annotations"][contract.ANNOTATION_SCHEDULED_TIMESTAMP]
    assert annotation == "2025-06-01T20:30:00-04:00"
    run = classify_run(job, [])
    assert (run.scheduled_at, run.slot, run.manual) == (SLOT, k.minute_of(SLOT), False)


def test_the_pod_whose_guard_decided_is_the_one_read(message: Any) -> None:
    job = scheduled_job(active=1)
    newer_waiting = k.pod(job, created=T0 + timedelta(seconds=30), phase="Pending", suffix="zz9zz",
                          init_statuses=[k.container_status(contract.GUARD_CONTAINER, state=k.WAITING_INIT)])
    decided = k.pod(job, created=T0, phase="Running", init_statuses=[acquired_guard(message, job, fence=9)],
                    statuses=[running("task")])
    assert classify_run(job, [newer_waiting, decided]).fence == 9


def test_records_survive_a_trip_through_status(message: Any) -> None:
    job = scheduled_job(conditions=k.complete_conditions(END), completion=END)
    pod = k.pod(job, created=T0, phase="Succeeded", init_statuses=[acquired_guard(message, job)],
                statuses=[k.container_status("task", state={"terminated": k.terminated(0, GUARD_END, END)})])
    run = classify_run(job, [pod])
    item = k.json_roundtrip(run.to_status())
    assert item == {"job": job["metadata"]["name"], "outcome": "Succeeded", "reason": "workload completed",
                    "manual": False, "holder": k.holder_of(job), "fence": 12, "slot": k.minute_of(SLOT),
                    "startedAt": k.ts(GUARD_END), "finishedAt": k.ts(END)}
    assert RunRecord.from_status(item) == run


@pytest.mark.parametrize("item", [
    None, "x", {}, {"job": "a"}, {"job": "a", "outcome": "Exploded"}, {"outcome": "Succeeded"},
    {"job": "a", "outcome": ["Succeeded"]},
])
def test_records_edited_into_nonsense_are_dropped(item: object) -> None:
    assert RunRecord.from_status(item) is None
