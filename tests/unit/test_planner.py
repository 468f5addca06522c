"""The reconcile pass's decisions as table tests of the planner: no API server, no kopf.

`drive` plays the executor: it answers each action `plan_pass` yields with the result a
row chooses (the object applied or created, a refusal with an HTTP code, no answer),
and records the actions in order. What the pass asks for, in what order, and what it
returns follow from the view and those answers alone.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from guardedcron import contract
from guardedcron.builders import build_cronjob
from guardedcron.planner import Observed, PassResult, PassView, plan_pass
from guardedcron.planner.actions import (
    Action,
    ApplyCronJob,
    CreateJob,
    DeleteCronJob,
    DeleteJob,
    DeletePod,
    Done,
    FetchedRuns,
    FetchRuns,
    Forget,
    Log,
    PatchStatus,
    PostEvents,
    RecordChanges,
    RecordOutcomes,
    RecordSuspension,
    Refused,
    Remember,
)
from guardedcron.planner.cleanup import remove_skipped_jobs, stop_lost_workloads
from guardedcron.planner.once import Once
from guardedcron.spec import Settings, parse_guarded_cronjob
from guardedcron.spec.locks import SharedLock
from guardedcron.status.lease_loss import StopOrder
from guardedcron.status.skips import SkippedJob
from tests.support.gcj import DEFAULT_SETTINGS, base_gcj, put

NOW = datetime(2026, 12, 7, 3, 0, tzinfo=UTC)
SETTINGS = Settings(build=DEFAULT_SETTINGS)
Answer = Callable[[Action], Any]


class ServerError(Exception):
    pass


def gcj(**paths: Any) -> dict[str, Any]:
    body = put(base_gcj(), "metadata.creationTimestamp", "2026-12-07T02:59:00Z")
    for path, value in paths.items():
        body = put(body, path.replace("__", "."), value)
    return body


def stored(body: Any) -> dict[str, Any]:
    """An object as the API server returns it once stored: with a uid."""
    stored = copy.deepcopy(dict(body))
    stored["metadata"] = {**stored["metadata"], "uid": f"uid-of-{stored['metadata']['name']}"}
    return stored


def live_cronjob(body: dict[str, Any]) -> dict[str, Any]:
    """The CronJob the API server holds after the operator applied it."""
    return stored(build_cronjob(parse_guarded_cronjob(body), DEFAULT_SETTINGS))


def refused(code: int | None, message: str = "no", *, terminating: bool = False) -> Refused:
    return Refused(ServerError(f"{code} {message}"), code, message, namespace_terminating=terminating)


def accept(action: Action) -> Any:
    """The executor's answer when every request succeeds."""
    if isinstance(action, ApplyCronJob | CreateJob):
        return Done(stored(action.body))
    if isinstance(action, FetchRuns):
        return FetchedRuns([], {})
    if isinstance(action, RecordOutcomes):
        return []
    return None


def answering(**by_kind: Any) -> Answer:
    """`accept`, except for the action kinds named (class name: result)."""
    def answer(action: Action) -> Any:
        kind = type(action).__name__
        return by_kind[kind] if kind in by_kind else accept(action)
    return answer


def drive(view: PassView, answer: Answer = accept) -> tuple[list[Action], PassResult]:
    plan, actions, result = plan_pass(view), [], None
    try:
        while True:
            action = plan.send(result)
            actions.append(action)
            result = answer(action)
    except StopIteration as finished:
        return actions, finished.value


def view(body: dict[str, Any], cronjob: dict[str, Any] | None = None, *, settings: Settings = SETTINGS,
         written: dict[str, Any] | None = None, done: frozenset[str] = frozenset()) -> PassView:
    return PassView(observed=Observed(gcj=body, cronjob=cronjob), settings=settings, now=NOW,
                    written_status=written, done=done)


def kinds(actions: list[Action]) -> list[str]:
    return [type(a).__name__ for a in actions if not isinstance(a, Log)]


def reasons(actions: list[Action]) -> list[str]:
    return [str(e.reason) for a in actions if isinstance(a, PostEvents) for e in a.events]


def written_status(actions: list[Action]) -> dict[str, Any]:
    [patch] = [a for a in actions if isinstance(a, PatchStatus)]
    return dict(patch.status)


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    [found] = [c for c in status["conditions"] if c["type"] == kind]
    return found


# --- the CronJob ------------------------------------------------------------------------

def test_a_new_object_applies_its_cronjob_then_writes_status_once() -> None:
    actions, result = drive(view(gcj()))
    assert kinds(actions) == ["ApplyCronJob", "RecordSuspension", "PatchStatus", "RecordChanges"]
    assert result == PassResult(applied=True, status_written=True, apply_error=None)
    assert condition(written_status(actions), "Ready")["status"] == "True"


def test_a_pass_over_an_up_to_date_object_asks_for_nothing_but_its_gauges() -> None:
    body = gcj()
    first, _ = drive(view(body))
    actions, result = drive(view(body, live_cronjob(body), written=written_status(first)))
    assert kinds(actions) == ["RecordSuspension", "RecordChanges"]
    assert result == PassResult(applied=False, status_written=False, apply_error=None)


def test_a_cronjob_changed_by_hand_is_applied_again_with_the_reason() -> None:
    body = gcj()
    edited = put(live_cronjob(body), "spec.concurrencyPolicy", "Allow")
    actions, _ = drive(view(body, edited))
    [apply] = [a for a in actions if isinstance(a, ApplyCronJob)]
    assert "concurrencyPolicy" in apply.reason


@pytest.mark.parametrize(("answer", "applied", "error", "status_written", "events"), [
    (refused(422, "spec.jobTemplate: Invalid value"), False, "spec.jobTemplate: Invalid value", True,
     ["CronJobRejected"]),
    (refused(400, "bad request"), False, "bad request", True, ["CronJobRejected"]),
    (refused(403, "terminating", terminating=True), False, None, False, []),
])
def test_how_a_refused_apply_ends_the_pass(answer: Refused, applied: bool, error: str | None,
                                           status_written: bool, events: list[str]) -> None:
    actions, result = drive(view(gcj()), answering(ApplyCronJob=answer))
    assert (result.applied, result.apply_error, result.status_written) == (applied, error, status_written)
    assert reasons(actions) == events
    if status_written:
        assert condition(written_status(actions), "Stalled")["status"] == "True"


@pytest.mark.parametrize("code", [None, 409, 500, 503, 429, 403])
def test_an_apply_that_may_succeed_later_raises_for_kopf_to_retry(code: int | None) -> None:
    answer = refused(code)
    with pytest.raises(ServerError):
        drive(view(gcj()), answering(ApplyCronJob=answer))


def test_a_cronjob_of_that_name_not_ours_is_never_applied_over() -> None:
    body = gcj()
    foreign = put(live_cronjob(body), "metadata.ownerReferences", [])
    actions, result = drive(view(body, foreign))
    assert "ApplyCronJob" not in kinds(actions)
    assert result.not_owned and "not controlled by this GuardedCronJob" in (result.apply_error or "")
    assert reasons(actions) == ["CronJobNotOwned"]


def test_an_invalid_spec_leaves_the_cronjob_and_says_why_once_per_change() -> None:
    body = gcj(spec__schedule="61 * * * *")
    actions, result = drive(view(body, live_cronjob(gcj())))
    assert kinds(actions) == ["PatchStatus", "RecordChanges", "PostEvents"]
    assert reasons(actions) == ["SpecInvalid"]
    assert condition(written_status(actions), "Invalid")["status"] == "True"
    # The next pass over the same object: nothing to write, nothing to say.
    again, _ = drive(view(body, live_cronjob(gcj()), written=written_status(actions)))
    assert kinds(again) == ["RecordChanges"]
    assert not result.applied


# --- locks ------------------------------------------------------------------------------

def test_a_shared_lock_not_granted_gets_no_cronjob_and_one_event_per_process() -> None:
    body = gcj(spec__lease__sharedLock="ledger")
    settings = Settings(build=DEFAULT_SETTINGS, shared_locks=(SharedLock("ledger", frozenset({"finance"})),))
    actions, _ = drive(view(body, settings=settings))
    assert "ApplyCronJob" not in kinds(actions)
    assert reasons(actions) == ["LockNotAllowed"]
    marks = {a.key for a in actions if isinstance(a, Remember)}
    again, _ = drive(view(body, settings=settings, written=written_status(actions), done=frozenset(marks)))
    assert reasons(again) == []


def test_our_cronjob_taking_a_lock_no_longer_granted_is_deleted() -> None:
    granted = Settings(build=DEFAULT_SETTINGS, shared_locks=(SharedLock("ledger", frozenset({"billing"})),))
    body = gcj(spec__lease__sharedLock="ledger")
    cronjob = drive(view(body, settings=granted))[0][0]
    assert isinstance(cronjob, ApplyCronJob)
    actions, _ = drive(view(body, dict(cronjob.body), settings=SETTINGS))
    [delete] = [a for a in actions if isinstance(a, DeleteCronJob)]
    assert (delete.namespace, delete.name) == ("billing", "nightly-invoices")
    assert "LockNotAllowed" in reasons(actions)


# --- the manual trigger -----------------------------------------------------------------



def triggered(token: str) -> dict[str, Any]:
    body = gcj()
    body["metadata"]["annotations"] = {contract.ANNOTATION_TRIGGER: token}
    return body


@pytest.mark.parametrize(("answer", "handled", "events"), [
    (None, "t1", ["ManualRunCreated"]),  # created
    (refused(409), "t1", []),  # made by an earlier pass: done, said then
    (refused(422, "invalid"), None, ["TriggerFailed"]),
    (refused(403, "terminating", terminating=True), None, []),
])
def test_a_trigger_token_makes_one_job(answer: Refused | None, handled: str | None,
                                      events: list[str]) -> None:
    body = triggered("t1")
    answer_job = answering(**({"CreateJob": answer} if answer is not None else {}))
    actions, _ = drive(view(body, live_cronjob(body)), answer_job)
    [create] = [a for a in actions if isinstance(a, CreateJob)]
    assert create.body["metadata"]["annotations"][contract.ANNOTATION_TRIGGER] == "t1"
    assert written_status(actions).get("lastTriggerToken") == handled
    assert reasons(actions) == events


def test_a_trigger_token_already_handled_or_waiting_for_its_cronjob_makes_none() -> None:
    body = triggered("t1")
    handled = drive(view(body, live_cronjob(body)))[0]
    again, _ = drive(view(body, live_cronjob(body), written=written_status(handled)))
    assert "CreateJob" not in kinds(again)
    no_cronjob, _ = drive(view(body), answering(ApplyCronJob=refused(422)))
    assert "CreateJob" not in kinds(no_cronjob)


def test_a_trigger_without_an_answer_raises_for_kopf_to_retry() -> None:
    body = triggered("t1")
    with pytest.raises(ServerError):
        drive(view(body, live_cronjob(body)), answering(CreateJob=refused(None)))


# --- runs status has open that the cache lacks -----------------------------------------

def test_an_open_run_missing_from_the_cache_is_fetched_before_status_is_computed() -> None:
    body = gcj()
    open_run = {"job": "nightly-invoices-29900000", "startedAt": "2026-12-07T02:30:00Z",
                "outcome": "Running"}
    written = {"recentRuns": [open_run]}
    actions, _ = drive(view(body, live_cronjob(body), written=written))
    [fetch] = [a for a in actions if isinstance(a, FetchRuns)]
    assert fetch == FetchRuns("billing", "nightly-invoices", ("nightly-invoices-29900000",))
    assert kinds(actions).index("FetchRuns") < kinds(actions).index("PatchStatus")


# --- the order of the pass --------------------------------------------------------------

def test_status_is_written_before_the_events_and_the_metrics_follow_the_write() -> None:
    body = triggered("t2")
    actions, _ = drive(view(body))
    order = kinds(actions)
    assert order.index("ApplyCronJob") < order.index("CreateJob") < order.index("PatchStatus")
    assert order.index("PatchStatus") < order.index("RecordChanges") < order.index("PostEvents")
    assert order[-1] == "PostEvents"
    assert isinstance(actions[-1], PostEvents)
    assert [a for a in actions if isinstance(a, RecordSuspension)] == [
        RecordSuspension("billing", "nightly-invoices", None)]
    assert any(isinstance(a, RecordChanges) for a in actions)


# --- after the status write: pods of lost runs, Jobs of skipped runs ---------------------

def run_sub_plan(plan: Any, answer: Any) -> tuple[list[Action], Any]:
    actions, result = [], None
    try:
        while True:
            action = plan.send(result)
            actions.append(action)
            result = answer if isinstance(action, DeletePod | DeleteJob) else None
    except StopIteration as finished:
        return actions, finished.value


ORDER = StopOrder(job="nightly-invoices-1", pod="nightly-invoices-1-abcde", pod_uid="p1",
                  reason="lease taken over")


@pytest.mark.parametrize(("answer", "events", "asked_again"), [
    (None, ["WorkloadStopped"], False),
    (refused(404), [], False),  # gone already
    (refused(None), [], True),  # no answer: the next pass asks again, no Event
    (refused(503), ["StopWorkloadFailed"], True),
    (refused(429), ["StopWorkloadFailed"], True),
    (refused(403, "forbidden"), ["StopWorkloadFailed"], False),
])
def test_a_lost_runs_pod_is_stopped_once(answer: Refused | None, events: list[str],
                                         asked_again: bool) -> None:
    actions, said = run_sub_plan(stop_lost_workloads([ORDER], namespace="billing", once=Once(()),
                                                     allowed=True), answer)
    assert DeletePod("billing", ORDER.pod, "p1") in actions
    assert [str(e.reason) for e in said] == events
    assert any(isinstance(a, Forget) for a in actions) == asked_again


def test_a_pod_already_asked_to_stop_or_not_ours_to_stop_is_not_deleted() -> None:
    key = f"stop\n{ORDER.pod}"
    actions, said = run_sub_plan(stop_lost_workloads([ORDER], namespace="billing", once=Once({key}),
                                                     allowed=True), None)
    assert (actions, said) == ([], [])
    actions, said = run_sub_plan(stop_lost_workloads([ORDER], namespace="billing", once=Once(()),
                                                     allowed=False), None)
    assert not any(isinstance(a, DeletePod) for a in actions)
    assert [str(e.reason) for e in said] == ["StopWorkloadFailed"]


@pytest.mark.parametrize(("answer", "events", "asked_again"), [
    (None, [], False),
    (refused(404), [], False),
    (refused(409), [], False),  # the name is a newer Job's
    (refused(None), [], True),
    (refused(500), [], True),
    (refused(403, "forbidden"), ["SkippedJobKept"], False),
])
def test_a_skipped_runs_job_is_removed_once(answer: Refused | None, events: list[str],
                                           asked_again: bool) -> None:
    removal = SkippedJob(job="nightly-invoices-2", uid="j2")
    actions, said = run_sub_plan(remove_skipped_jobs([removal], namespace="billing", once=Once(())), answer)
    assert DeleteJob("billing", "nightly-invoices-2", "j2") in actions
    assert [str(e.reason) for e in said] == events
    assert any(isinstance(a, Forget) for a in actions) == asked_again
