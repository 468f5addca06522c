"""dstPolicy.repeatedTime and skippedTime on a real control plane, across real clock changes.

The CronJob controller and the API server are Go programs: libfaketime does not move
their clock, but Go reads time zones from $ZONEINFO first. So this module compiles
(with zic, from libc-bin) a zone of its own, `Guardedcron/Fold`, whose clock is set
back by two minutes a few minutes from now, and starts a control plane of its own with
$ZONEINFO pointing at it (`ControlPlane(zoneinfo=...)`). The guard, a Python process,
reads the same file through $PYTHONTZPATH. Two CronJobs rendered by `guardedcron
render` fire every minute in that zone: with repeatedTime Twice both showings of the two
repeated wall-clock minutes run (as CronJobs do), with Once the second showings find
their slot claimed and are skipped; the minute after runs again.

For skippedTime a second zone, `Guardedcron/Spring`, jumps two minutes ahead a few
minutes from now, and the operator itself runs (as the chart would, its zone files on
$PYTHONTZPATH, as an image's tzdata): the wall minute the jump skips runs at the first
minute after it with RunAtNextMinute, exactly once for two GuardedCronJobs sharing a
lock, and not at all with Skip; the schedule's own minute right after the jump runs too.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time
import zoneinfo
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from guardedcron import contract
from guardedcron.schedule.dst import skipped_time_slot, slot_of, slot_time
from guardedcron.status.times import format_time
from guardedcron_devenv.binaries import Paths
from guardedcron_devenv.controlplane import ControlPlane
from guardedcron_devenv.kubelet import Image
from tests.e2e import harness
from tests.e2e.harness import (
    FAILURE_LOGS,
    GUARD_IMAGE,
    Cluster,
    Scenario,
    WorkDb,
    guarded_cronjob,
    job_finished,
    lock_of,
    slot_job_name,
    termination_json,
    wait_for,
)
from tests.e2e.operator_process import OperatorProcess
from tests.e2e.test_operator import create_gcj, status_of, wait_cronjob, wait_status

pytestmark = pytest.mark.e2e

ZONE = "Guardedcron/Fold"
FOLD_MINUTES = 2
# From the apply to the first repeated minute: room for the namespace, the kubelet and
# the CronJob controller's first look, which must all come before the fold.
LEAD_MINUTES = 3
FINISH_SECONDS = 120
# The keeper releases the lease when a run ends; a keeper stopped while still starting
# (the workload takes about a second) cannot, and the lease then lasts durationSeconds:
# short, so that it is gone by the next minute (a 3900 s lease turned every later run of
# a job away in a run of this module on a loaded machine).
LEASE = {"heartbeat": True, "durationSeconds": 30}


@pytest.fixture(scope="module")
def zone_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoneinfo")


@pytest.fixture(scope="module")
def fold_plane(kube_binaries: Paths, zone_dir: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(kube_binaries, name="dst", zoneinfo=zone_dir, progress=lambda line: None,
                      logs_dir=tmp_path_factory.mktemp("controlplane-dst-logs")) as plane:
        yield plane


def compile_fold_zone(zone_dir: Path, back_at: datetime) -> None:
    """`ZONE`: UTC+0:02 until `back_at` (UTC), UTC after it, so the wall-clock minutes of
    the two minutes before `back_at` are shown again in the two minutes after it."""
    zic = shutil.which("zic") or "/usr/sbin/zic"
    source = zone_dir / "fold.zi"
    until = f"{back_at:%Y %b %d %H:%M}u"
    source.write_text(f"Zone {ZONE} 0:0{FOLD_MINUTES} - GCF {until}\n"
                      f"{' ' * (len(ZONE) + 6)}0:00 - GCU\n")
    result = subprocess.run([zic, "-b", "fat", "-d", str(zone_dir), str(source)],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, f"{zic} failed: {result.stderr}"


def python_zone(zone_dir: Path) -> str:
    """$PYTHONTZPATH for processes that must know `ZONE` (render, the guard)."""
    return ":".join([str(zone_dir), *zoneinfo.TZPATH])


def with_guard_env(cronjob: dict[str, Any], name: str, value: str) -> dict[str, Any]:
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    [guard] = [c for c in pod["initContainers"] if c["name"] == contract.GUARD_CONTAINER]
    guard["env"] = [*guard["env"], {"name": name, "value": value}]
    return cronjob


# A control plane of its own (about 1 min), the lead, the fold, the minute after, and the
# last Job's run: at most 12 minutes.
@pytest.mark.timeout(720)
def test_repeated_wall_minutes_run_once_with_once_and_twice_with_twice(
        fold_plane: ControlPlane, zone_dir: Path, e2e_db: WorkDb,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if time.time() % 60 > 40:  # apply early in a minute: the lead is whole minutes
        time.sleep(61 - time.time() % 60)
    now_slot = slot_of(datetime.now(UTC))
    back_slot = now_slot + LEAD_MINUTES + FOLD_MINUTES  # the instant the clock is set back
    compile_fold_zone(zone_dir, slot_time(back_slot))
    monkeypatch.setenv("PYTHONTZPATH", python_zone(zone_dir))
    first = [back_slot - 2, back_slot - 1]  # first showings of the repeated minutes
    second = [back_slot, back_slot + 1]  # their second showings
    after = back_slot + 2

    cluster = Cluster("dst", fold_plane, e2e_db.dsn)
    with Scenario({"dst": cluster}, e2e_db) as scenario:
        namespace = scenario.namespace("fold", [cluster])
        jobs: dict[str, Any] = {}
        for name, policy in (("once", "Once"), ("twice", "Twice")):
            gcj = guarded_cronjob(name, namespace, lease=LEASE, spec={
                "timeZone": ZONE, "dstPolicy": {"repeatedTime": policy}})
            cronjob = cluster.render(gcj)
            cluster.apply(with_guard_env(cronjob, "PYTHONTZPATH", python_zone(zone_dir)))
            jobs[name] = lock_of(gcj)
        assert slot_of(datetime.now(UTC)) < first[0], "applied too late for the fold"

        def finished(name: str, slot: int) -> dict[str, Any]:
            job_name = slot_job_name(name, slot)

            def done() -> dict[str, Any] | None:
                job = cluster.job(namespace, job_name)
                return job if job is not None and job_finished(job) else None

            # Fired at its minute, finished within two more (bounded, stated in design.md).
            due = (slot_time(slot) - datetime.now(UTC)).total_seconds()
            return wait_for(f"the CronJob controller's Job {job_name} finishes", done,
                            timeout=max(due, 0) + FINISH_SECONDS, interval=2)

        outcome = {(name, slot): job_finished(finished(name, slot))
                   for slot in (*first, *second, after) for name in ("once", "twice")}
        # Twice: every minute ran, both showings of the repeated wall-clock minutes too.
        assert {slot: outcome["twice", slot] for slot in (*first, *second, after)} == {
            slot: "Complete" for slot in (*first, *second, after)}
        # Once: the second showings found the first showings' slots claimed.
        assert {slot: outcome["once", slot] for slot in (*first, *second, after)} == {
            **{slot: "Complete" for slot in (*first, after)},
            **{slot: "Failed" for slot in second}}
        for slot, claimed in zip(second, first, strict=True):
            pod = cluster.pod_of(namespace, slot_job_name("once", slot))
            skipped = termination_json(pod, contract.GUARD_CONTAINER)
            assert (skipped["outcome"], skipped["reason"], skipped["slot"]) == (
                "skipped", "slot-claimed", claimed), skipped
        # In the database: from the fold on, runs for the first showings and the minute
        # after only (the minutes before the fold ran as any minute does).
        ran = sorted(run["slot"] for run in e2e_db.guard_runs(jobs["once"])
                     if run["outcome"] != "skipped" and first[0] <= run["slot"] <= after)
        assert ran == [*first, after], ran


# --- skippedTime -------------------------------------------------------------------------

SPRING_ZONE = "Guardedcron/Spring"
JUMP_MINUTES = 2
# From the jump until both RunAtNextMinute objects have settled the skipped minute: the
# schedule's own run at the jump (a few seconds), a timer pass (60 s), and the retries of
# an attempt that found the shared lease held (30 s, then 60 s), with room for a loaded
# machine.
SETTLE_SECONDS = 420


def compile_spring_zone(zone_dir: Path, jump_at: datetime) -> None:
    """`SPRING_ZONE`: UTC until `jump_at`, UTC+0:02 from then on, so the two wall-clock
    minutes from `jump_at` on are never shown."""
    zic = shutil.which("zic") or "/usr/sbin/zic"
    source = zone_dir / "spring.zi"
    source.write_text(f"Zone {SPRING_ZONE} 0:00 - GCW {jump_at:%Y %b %d %H:%M}u\n"
                      f"{' ' * (len(SPRING_ZONE) + 6)}0:0{JUMP_MINUTES} - GCS\n")
    result = subprocess.run([zic, "-b", "fat", "-d", str(zone_dir), str(source)],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, f"{zic} failed: {result.stderr}"


def zoned_images(zone_dir: Path) -> Any:
    """harness.images with the guard image carrying the test's zone files, as a real
    image carries tzdata (the guard checks the skipped time's key against the zone)."""
    plain = harness.images

    def images(guard_images: Sequence[str] = ()) -> dict[str, Image]:
        found = plain(guard_images)
        for name in (GUARD_IMAGE, *guard_images):
            found[name] = dataclasses.replace(found[name], env={
                **found[name].env, "PYTHONTZPATH": python_zone(zone_dir)})
        return found

    return images


# The operator's start (at most 90 s), the lead, the jump, SETTLE_SECONDS and the last
# checks: at most 15 minutes.
@pytest.mark.timeout(900)
def test_a_skipped_wall_minute_runs_once_at_the_next_minute_only_when_asked(
        fold_plane: ControlPlane, zone_dir: Path, e2e_db: WorkDb,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cluster = Cluster("dst", fold_plane, e2e_db.dsn)
    cluster.apply_crds()
    operator = OperatorProcess(cluster, tmp_path)
    operator.chart_env["PYTHONTZPATH"] = python_zone(zone_dir)
    entry = ("operator of dst (log tail)", operator.log_tail)
    FAILURE_LOGS.append(entry)
    monkeypatch.setattr(harness, "images", zoned_images(zone_dir))
    try:
        operator.install()
        operator.start()
        if time.time() % 60 > 40:  # create early in a minute: the lead is whole minutes
            time.sleep(61 - time.time() % 60)
        jump = slot_of(datetime.now(UTC)) + LEAD_MINUTES  # the first minute after the jump
        jump_at = slot_time(jump)
        compile_spring_zone(zone_dir, jump_at)
        skipped_wall = jump_at.replace(tzinfo=None)  # the zone reads UTC until the jump
        key = skipped_time_slot(skipped_wall)
        after_jump = skipped_wall + timedelta(minutes=JUMP_MINUTES)  # the wall clock at `jump`
        # The skipped minute and the first one after the jump; nothing else for an hour.
        schedule = (f"{skipped_wall.minute},{after_jump.minute} "
                    f"{skipped_wall.hour},{after_jump.hour} * * *")

        with Scenario({"dst": cluster}, e2e_db, (operator.guard_image,)) as scenario:
            namespace = scenario.namespace("spring", [cluster])
            objects = {"skip": ("Skip", "skip"), "next-a": ("RunAtNextMinute", "shared"),
                       "next-b": ("RunAtNextMinute", "shared")}
            locks = {}
            for name, (policy, lease) in objects.items():
                gcj = guarded_cronjob(name, namespace, schedule=schedule,
                                      lease={"name": lease, **LEASE}, spec={
                                          "timeZone": SPRING_ZONE,
                                          "dstPolicy": {"skippedTime": policy}})
                create_gcj(cluster, gcj)
                locks[name] = lock_of(gcj)
            for name in objects:
                wait_cronjob(cluster, namespace, name=name)
            assert slot_of(datetime.now(UTC)) < jump, "created too late for the jump"

            due = (jump_at - datetime.now(UTC)).total_seconds()
            for name in ("next-a", "next-b"):
                wait_status(cluster, namespace, "the skipped minute settled", lambda s: (
                    s.get("skippedTime") or {}).get("settledThrough") == format_time(jump_at),
                    name=name, timeout=max(due, 0) + SETTLE_SECONDS)
            for name in objects:  # the schedule's own minute at the jump, in each (a skip's
                # Job is removed once status records it, so status is where it ends)
                wait_status(cluster, namespace, f"{slot_job_name(name, jump)} ended", lambda s, n=name: any(
                    run["job"] == slot_job_name(n, jump) and "finishedAt" in run
                    for run in s.get("recentRuns") or []), name=name, timeout=FINISH_SECONDS)

            # RunAtNextMinute: the skipped minute ran once for the shared lock, under its
            # own key, and the schedule's minute at the jump ran too (a different slot).
            won = [run["slot"] for run in e2e_db.guard_runs(locks["next-a"]) if run["outcome"] != "skipped"]
            assert sorted(won) == [jump, key], won
            found = {job["metadata"]["name"]: contract.attempt_of(job["metadata"]["name"])
                     for job in cluster.jobs(namespace)}
            attempts = [job for job in cluster.jobs(namespace) if found[job["metadata"]["name"]]]
            assert {(a[0], a[1]) for a in found.values() if a is not None} == {
                (key, contract.RUN_KIND_SKIPPED_TIME)}, sorted(found)
            assert {job["metadata"]["name"].rsplit("-", 2)[0] for job in attempts} <= {"next-a", "next-b"}
            winners = [termination_json(cluster.pod_of(namespace, job["metadata"]["name"]),
                                        contract.GUARD_CONTAINER) for job in attempts
                       if job_finished(job) == "Complete"]
            assert [(w["outcome"], w["slot"]) for w in winners] == [("acquired", key)], winners
            assert {(row.dedupe_key, row.fence) for row in e2e_db.work(locks["next-a"])
                    if row.dedupe_key.startswith(f"{key}:")} == {
                (f"{key}:{item}", winners[0]["fence"]) for item in (1, 2, 3)}
            # Skip: the skipped minute never ran, the minute at the jump did.
            skip_runs = [run["slot"] for run in e2e_db.guard_runs(locks["skip"])]
            assert skip_runs == [jump], skip_runs
            assert status_of(cluster, namespace, "skip").get("skippedTime") is None
            events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
            assert any(e["reason"] == "SkippedTimeRunCreated" for e in events["items"]), events
    finally:
        operator.stop()
        FAILURE_LOGS.remove(entry)
