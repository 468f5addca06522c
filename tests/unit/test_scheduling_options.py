"""spec.schedule with H, spec.dstPolicy and spec.runContext (issue 14) as the parser reads
them, the builders turn them into a CronJob and the status shows them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from guardedcron import contract
from guardedcron.builders.guard import mark_run_kind
from guardedcron.spec import SpecError, parse_guarded_cronjob
from guardedcron.spec.model import DstPolicy
from guardedcron.status import status_patch
from tests.support.gcj import DELETE, base_gcj, build, get, put
from tests.support.status_world import Runs, compute, the_gcj

POD = "spec.jobTemplate.spec.template.spec"


def gcj_with(**changes: Any) -> dict[str, Any]:
    obj = base_gcj()
    for path, value in changes.items():
        obj = put(obj, path.replace("__", "."), value)
    return obj


def guard_args(cronjob: dict[str, Any]) -> list[str]:
    init = get(cronjob, "spec.jobTemplate.spec.template.spec.initContainers")
    return next(c["args"] for c in init if c["name"] == contract.GUARD_CONTAINER)


def problems(obj: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as caught:
        parse_guarded_cronjob(obj)
    return [(p.field_path, p.message) for p in caught.value.problems]


# --- H ---------------------------------------------------------------------------------
def test_h_resolves_for_the_lock_and_the_cronjob_gets_the_concrete_schedule() -> None:
    parsed = parse_guarded_cronjob(gcj_with(spec__schedule="H H(1-5) * * *"))
    spec = parsed.spec
    assert spec.written_schedule == "H H(1-5) * * *"
    assert "H" not in spec.schedule_text and spec.schedule.text == spec.schedule_text
    cronjob = build(gcj_with(spec__schedule="H H(1-5) * * *"))
    assert get(cronjob, "spec.schedule") == spec.schedule_text
    assert get(cronjob, "metadata.annotations")[contract.ANNOTATION_WRITTEN_SCHEDULE] == (
        "H H(1-5) * * *")


def test_h_follows_the_effective_lock_not_the_object() -> None:
    def resolved(**changes: Any) -> str:
        return parse_guarded_cronjob(gcj_with(spec__schedule="H H * * *", **changes)
                                     ).spec.schedule_text

    # One shared lock: every namespace (and cluster) that takes it runs the same schedule.
    shared = {"spec__lease__sharedLock": "ledger-close"}
    assert resolved(metadata__namespace="a", **shared) == resolved(metadata__namespace="b", **shared)
    # lease.name is the lock inside the namespace: two GuardedCronJobs naming it agree.
    assert resolved(metadata__name="x", spec__lease__name="l") == resolved(
        metadata__name="y", spec__lease__name="l")
    # Different locks spread.
    assert len({resolved(spec__lease__name=f"job-{n}") for n in range(20)}) > 10


def test_without_h_nothing_is_added() -> None:
    parsed = parse_guarded_cronjob(base_gcj())
    assert parsed.spec.schedule_text == parsed.spec.written_schedule == "30 2 * * *"
    assert contract.ANNOTATION_WRITTEN_SCHEDULE not in get(build(base_gcj()), "metadata.annotations")


def test_a_bad_h_is_reported_at_spec_schedule_with_the_other_problems() -> None:
    found = problems(gcj_with(spec__schedule="H/90 * * * *", spec__lease__minHoldSeconds=99999))
    assert [path for path, _ in found] == ["spec.schedule", "spec.lease.minHoldSeconds"]
    assert "step 90 in 'H/90' must be from 1 to 60" in found[0][1]


def test_status_shows_the_resolved_schedule_only_for_h(runs: Runs) -> None:
    now = datetime(2025, 1, 10, 12, 0, tzinfo=UTC)
    hashed = the_gcj(schedule="H 3 * * *")
    status = compute([], None, now, gcj=hashed)
    resolved = parse_guarded_cronjob(hashed).spec.schedule_text
    assert status["resolvedSchedule"] == resolved
    minute = int(resolved.split()[0])
    assert status["nextScheduleTime"] == f"2025-01-11T02:{minute:02d}:00Z"  # 03:MM Stockholm
    plain = compute([], status, now)
    assert "resolvedSchedule" not in plain
    assert status_patch(status, plain)["resolvedSchedule"] is None


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Runs:
    return Runs(tmp_path, monkeypatch)


# --- dstPolicy ---------------------------------------------------------------------------
def test_dst_policy_defaults_to_twice_and_leaves_the_guard_as_it_was() -> None:
    assert parse_guarded_cronjob(base_gcj()).spec.dst_policy == DstPolicy("Twice")
    explicit = gcj_with(spec__dstPolicy={"repeatedTime": "Twice"})
    assert build(explicit) == build(base_gcj())


def test_repeated_time_once_gives_the_guard_its_zone() -> None:
    args = guard_args(build(gcj_with(spec__dstPolicy={"repeatedTime": "Once"})))
    assert args[-4:] == ["--time-zone", "Europe/Stockholm", "--repeated-time", "Once"]


def test_dst_policy_is_refused_without_a_time_zone_and_for_unknown_values() -> None:
    assert problems(gcj_with(spec__timeZone=DELETE, spec__dstPolicy={"repeatedTime": "Once"})) == [
        ("spec.dstPolicy", "needs spec.timeZone: without it the schedule is read in UTC, whose "
                           "clock is never set back or forward, so there is nothing to decide")]
    assert problems(gcj_with(spec__dstPolicy={"repeatedTime": "Thrice"})) == [
        ("spec.dstPolicy.repeatedTime", "must be one of Twice, Once, not 'Thrice'")]


# --- runContext ----------------------------------------------------------------------------
def test_run_context_env_goes_to_every_workload_container_first() -> None:
    obj = gcj_with(spec__runContext={"env": True})
    obj = put(obj, f"{POD}.containers[0].env", [{"name": "GUARDEDCRON_LOCK", "value": "mine"}])
    obj = put(obj, f"{POD}.initContainers", [{"name": "prepare", "image": "x"}])
    cronjob = build(obj)
    pod = get(cronjob, "spec.jobTemplate.spec.template.spec")
    expected = [
        {"name": contract.ENV_LOCK, "value": "billing/nightly-invoices"},
        {"name": contract.ENV_TIME_ZONE, "value": "Europe/Stockholm"},
        {"name": contract.ENV_SCHEDULE, "value": "30 2 * * *"},
        {"name": contract.ENV_GUARDED_CRONJOB, "value": "nightly-invoices"},
        {"name": contract.ENV_LEASE_FILE, "value": f"{contract.RUN_DIR}/{contract.LEASE_FILE}"},
        {"name": contract.ENV_FENCE_FILE, "value": f"{contract.RUN_DIR}/{contract.FENCE_FILE}"},
    ]
    # The container's own definition comes later, so it wins.
    assert pod["containers"][0]["env"] == [*expected, {"name": "GUARDEDCRON_LOCK", "value": "mine"}]
    user_init = next(c for c in pod["initContainers"] if c["name"] == "prepare")
    assert user_init["env"] == expected
    injected = [c for c in pod["initContainers"] if c["name"].startswith("guardedcron-")]
    assert all(contract.ENV_LOCK not in {e["name"] for e in c["env"]} for c in injected)
    assert guard_args(cronjob)[-2:] == ["--time-zone", "Europe/Stockholm"]


def test_run_context_env_in_utc_and_with_a_dollar_in_the_lock() -> None:
    obj = gcj_with(spec__runContext={"env": True}, spec__timeZone=DELETE,
                   spec__lease__name="price$(X)")
    pod = get(build(obj), "spec.jobTemplate.spec.template.spec")
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env[contract.ENV_TIME_ZONE] == "UTC"
    assert env[contract.ENV_LOCK] == "billing/price$$(X)"  # Kubernetes turns $$ into $


def test_run_context_env_false_is_the_cronjob_as_before() -> None:
    assert build(gcj_with(spec__runContext={"env": False})) == build(base_gcj())
    assert problems(gcj_with(spec__runContext={"env": "yes"})) == [
        ("spec.runContext.env", "must be true or false, not a string ('yes')")]


def test_mark_run_kind_tells_only_the_guard() -> None:
    cronjob = build(base_gcj())
    job = {"metadata": {"name": "nightly-invoices-29000000"}, "spec": cronjob["spec"]["jobTemplate"]["spec"]}
    marked = mark_run_kind(job, contract.RUN_KIND_CATCH_UP)
    assert guard_args({"spec": {"jobTemplate": marked}})[-2:] == ["--run-kind", "catch-up"]
    assert guard_args({"spec": {"jobTemplate": job}})[-2:] != ["--run-kind", "catch-up"]  # a copy
