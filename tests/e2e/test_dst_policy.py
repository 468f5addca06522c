"""dstPolicy.repeatedTime and skippedTime on a real control plane, across real clock changes.

The CronJob controller and the API server are Go programs: libfaketime does not move
their clock, but Go reads time zones from $ZONEINFO first. So this module compiles
(with zic, from libc-bin) two zones of its own into one directory and starts a control
plane of its own with $ZONEINFO pointing at it (`ControlPlane(zoneinfo=...)`); Python
processes (render, the guard, the operator) read the same files through $PYTHONTZPATH.
The fold's first repeated minute is the spring's jump, a few minutes after the objects
are made, so one test waits for both scenarios at once:

- `Guardedcron/Fold` is set back by two minutes. Two CronJobs rendered by `guardedcron
  render` fire every minute in it: with repeatedTime Twice both showings of the two
  repeated wall-clock minutes run (as CronJobs do), with Once the second showings find
  their slot claimed and are skipped; the minute after runs again.
- `Guardedcron/Spring` jumps two minutes ahead, and the operator itself runs (as the
  chart would, its zone files on $PYTHONTZPATH, as an image's tzdata): the wall minute
  the jump skips runs at the first minute after it with RunAtNextMinute, exactly once for
  two GuardedCronJobs sharing a lock, and not at all with Skip; the schedule's own
  minute right after the jump runs too.

The rendered CronJobs have no GuardedCronJob, so the operator leaves them and their Jobs
alone (it looks a child's GuardedCronJob up by name); each scenario has a namespace of
its own, so their locks differ.
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

FOLD_ZONE = "Guardedcron/Fold"
FOLD_MINUTES = 2
SPRING_ZONE = "Guardedcron/Spring"
JUMP_MINUTES = 2
# From the start of the minute the objects are made in to the first repeated minute and
# to the jump: room for both namespaces, their kubelets, the operator's CronJobs and the
# CronJob controller's first look, which must all come before the clock changes.
LEAD_MINUTES = 3
FINISH_SECONDS = 120
# From the jump until both RunAtNextMinute objects have settled the skipped minute: the
# schedule's own run at the jump (a few seconds), a timer pass (60 s), and the retries of
# an attempt that found the shared lease held (30 s, then 60 s), with room for a loaded
# machine.
SETTLE_SECONDS = 420
# The keeper releases the lease when a run ends; a keeper stopped while still starting
# (the workload takes about a second) cannot, and the lease then lasts durationSeconds:
# short, so that it is gone by the next minute (a 3900 s lease turned every later run of
# a job away in a run of this module on a loaded machine).
LEASE = {"heartbeat": True, "durationSeconds": 30}


@pytest.fixture(scope="module")
def zone_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoneinfo")


@pytest.fixture(scope="module")
def dst_plane(kube_binaries: Paths, zone_dir: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(kube_binaries, name="dst", zoneinfo=zone_dir, progress=lambda line: None,
                      logs_dir=tmp_path_factory.mktemp("controlplane-dst-logs")) as plane:
        yield plane


def zic(zone_dir: Path, source: Path) -> None:
    command = shutil.which("zic") or "/usr/sbin/zic"
    result = subprocess.run([command, "-b", "fat", "-d", str(zone_dir), str(source)],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, f"{command} failed: {result.stderr}"


def compile_fold_zone(zone_dir: Path, back_at: datetime) -> None:
    """`FOLD_ZONE`: UTC+0:02 until `back_at` (UTC), UTC after it, so the wall-clock minutes
    of the two minutes before `back_at` are shown again in the two minutes after it."""
    source = zone_dir / "fold.zi"
    until = f"{back_at:%Y %b %d %H:%M}u"
    source.write_text(f"Zone {FOLD_ZONE} 0:0{FOLD_MINUTES} - GCF {until}\n"
                      f"{' ' * (len(FOLD_ZONE) + 6)}0:00 - GCU\n")
    zic(zone_dir, source)


def compile_spring_zone(zone_dir: Path, jump_at: datetime) -> None:
    """`SPRING_ZONE`: UTC until `jump_at`, UTC+0:02 from then on, so the two wall-clock
    minutes from `jump_at` on are never shown."""
    source = zone_dir / "spring.zi"
    source.write_text(f"Zone {SPRING_ZONE} 0:00 - GCW {jump_at:%Y %b %d %H:%M}u\n"
                      f"{' ' * (len(SPRING_ZONE) + 6)}0:0{JUMP_MINUTES} - GCS\n")
    zic(zone_dir, source)


def python_zone(zone_dir: Path) -> str:
    """$PYTHONTZPATH for processes that must know the test's zones (render, the guard,
    the operator)."""
    return ":".join([str(zone_dir), *zoneinfo.TZPATH])


def with_guard_env(cronjob: dict[str, Any], name: str, value: str) -> dict[str, Any]:
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    [guard] = [c for c in pod["initContainers"] if c["name"] == contract.GUARD_CONTAINER]
    guard["env"] = [*guard["env"], {"name": name, "value": value}]
    return cronjob


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


# --- repeatedTime: rendered CronJobs, no GuardedCronJob ----------------------------------

def apply_fold_cronjobs(cluster: Cluster, namespace: str, zone_dir: Path) -> dict[str, str]:
    """The CronJobs `render` makes of two every-minute GuardedCronJobs in `FOLD_ZONE`,
    repeatedTime Once and Twice, applied without their GuardedCronJobs; their locks."""
    locks = {}
    for name, policy in (("once", "Once"), ("twice", "Twice")):
        gcj = guarded_cronjob(name, namespace, lease=LEASE, spec={
            "timeZone": FOLD_ZONE, "dstPolicy": {"repeatedTime": policy}})
        cronjob = cluster.render(gcj)
        cluster.apply(with_guard_env(cronjob, "PYTHONTZPATH", python_zone(zone_dir)))
        locks[name] = lock_of(gcj)
    return locks


def check_fold(cluster: Cluster, namespace: str, db: WorkDb, locks: dict[str, str],
               back_slot: int) -> None:
    """Each minute's Job from the first repeated minute to the one after the fold, waited
    for in turn (the CronJob keeps only the last three Jobs of each outcome)."""
    first = [back_slot - 2, back_slot - 1]  # first showings of the repeated minutes
    second = [back_slot, back_slot + 1]  # their second showings
    after = back_slot + 2

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
    ran = sorted(run["slot"] for run in db.guard_runs(locks["once"])
                 if run["outcome"] != "skipped" and first[0] <= run["slot"] <= after)
    assert ran == [*first, after], ran


# --- skippedTime: GuardedCronJobs, the operator ------------------------------------------

SPRING_OBJECTS = {"skip": ("Skip", "skip"), "next-a": ("RunAtNextMinute", "shared"),
                  "next-b": ("RunAtNextMinute", "shared")}


def create_spring_gcjs(cluster: Cluster, namespace: str, jump: int) -> dict[str, str]:
    """Three GuardedCronJobs in `SPRING_ZONE` (Skip; RunAtNextMinute twice, one lock)
    scheduled at the minute the jump at `jump` skips and the one after it, and their
    CronJobs made by the operator; their locks."""
    skipped_wall = slot_time(jump).replace(tzinfo=None)  # the zone reads UTC until the jump
    after_jump = skipped_wall + timedelta(minutes=JUMP_MINUTES)  # the wall clock at `jump`
    # The skipped minute and the first one after the jump; nothing else for an hour.
    schedule = (f"{skipped_wall.minute},{after_jump.minute} "
                f"{skipped_wall.hour},{after_jump.hour} * * *")
    locks = {}
    for name, (policy, lease) in SPRING_OBJECTS.items():
        gcj = guarded_cronjob(name, namespace, schedule=schedule,
                              lease={"name": lease, **LEASE}, spec={
                                  "timeZone": SPRING_ZONE,
                                  "dstPolicy": {"skippedTime": policy}})
        create_gcj(cluster, gcj)
        locks[name] = lock_of(gcj)
    for name in SPRING_OBJECTS:
        wait_cronjob(cluster, namespace, name=name)
    return locks


def check_spring(cluster: Cluster, namespace: str, db: WorkDb, locks: dict[str, str],
                 jump: int) -> None:
    jump_at = slot_time(jump)
    key = skipped_time_slot(jump_at.replace(tzinfo=None))
    settled_by = jump_at + timedelta(seconds=SETTLE_SECONDS)
    for name in ("next-a", "next-b"):
        wait_status(cluster, namespace, "the skipped minute settled", lambda s: (
            s.get("skippedTime") or {}).get("settledThrough") == format_time(jump_at),
            name=name, timeout=max((settled_by - datetime.now(UTC)).total_seconds(), 0))
    ended_by = time.monotonic() + FINISH_SECONDS
    for name in SPRING_OBJECTS:  # the schedule's own minute at the jump, in each (a skip's
        # Job is removed once status records it, so status is where it ends)
        wait_status(cluster, namespace, f"{slot_job_name(name, jump)} ended", lambda s, n=name: any(
            run["job"] == slot_job_name(n, jump) and "finishedAt" in run
            for run in s.get("recentRuns") or []), name=name,
            timeout=max(ended_by - time.monotonic(), 0))

    # RunAtNextMinute: the skipped minute ran once for the shared lock, under its own
    # key, and the schedule's minute at the jump ran too (a different slot).
    won = [run["slot"] for run in db.guard_runs(locks["next-a"]) if run["outcome"] != "skipped"]
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
    assert {(row.dedupe_key, row.fence) for row in db.work(locks["next-a"])
            if row.dedupe_key.startswith(f"{key}:")} == {
        (f"{key}:{item}", winners[0]["fence"]) for item in (1, 2, 3)}
    # Skip: the skipped minute never ran, the minute at the jump did.
    skip_runs = [run["slot"] for run in db.guard_runs(locks["skip"])]
    assert skip_runs == [jump], skip_runs
    assert status_of(cluster, namespace, "skip").get("skippedTime") is None
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    assert any(e["reason"] == "SkippedTimeRunCreated" for e in events["items"]), events


# The control plane (about 1 min), the CRD and the operator's start (at most 2 min), at
# most 21 s to a minute's first 40 s, the lead (3 min) to the jump, SETTLE_SECONDS from
# the jump (the fold's last Job, due 4 min after the jump plus FINISH_SECONDS, comes
# before), FINISH_SECONDS for the runs at the jump, the checks and the clean-up: at most
# 16 minutes.
@pytest.mark.timeout(960)
def test_repeated_wall_minutes_run_once_or_twice_and_a_skipped_one_at_the_next_minute_when_asked(
        dst_plane: ControlPlane, zone_dir: Path, e2e_db: WorkDb,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cluster = Cluster("dst", dst_plane, e2e_db.dsn)
    cluster.apply_crds()
    operator = OperatorProcess(cluster, tmp_path)
    operator.chart_env["PYTHONTZPATH"] = python_zone(zone_dir)
    entry = ("operator of dst (log tail)", operator.log_tail)
    FAILURE_LOGS.append(entry)
    try:
        operator.install()
        operator.start()
        if time.time() % 60 > 40:  # start early in a minute: the lead is whole minutes
            time.sleep(61 - time.time() % 60)
        jump = slot_of(datetime.now(UTC)) + LEAD_MINUTES  # the first minute after the jump
        back_slot = jump + FOLD_MINUTES  # the instant the fold's clock is set back
        compile_fold_zone(zone_dir, slot_time(back_slot))
        compile_spring_zone(zone_dir, slot_time(jump))
        monkeypatch.setenv("PYTHONTZPATH", python_zone(zone_dir))  # for render

        with Scenario({"dst": cluster}, e2e_db) as fold, \
                Scenario({"dst": cluster}, e2e_db, (operator.guard_image,)) as spring:
            fold_namespace = fold.namespace("fold", [cluster])
            fold_locks = apply_fold_cronjobs(cluster, fold_namespace, zone_dir)
            # The spring's guards get the zones from their image, the fold's from the env
            # render's CronJobs were given.
            monkeypatch.setattr(harness, "images", zoned_images(zone_dir))
            spring_namespace = spring.namespace("spring", [cluster])
            spring_locks = create_spring_gcjs(cluster, spring_namespace, jump)
            assert slot_of(datetime.now(UTC)) < jump, "set up too late for the clock changes"

            # The fold's Jobs first, minute by minute, while the spring settles: what
            # the spring is checked by (status, rows, Jobs it made, Events) stays, and its
            # waits are bounded from the jump.
            check_fold(cluster, fold_namespace, e2e_db, fold_locks, back_slot)
            check_spring(cluster, spring_namespace, e2e_db, spring_locks, jump)
    finally:
        operator.stop()
        FAILURE_LOGS.remove(entry)
