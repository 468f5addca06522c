"""dstPolicy.repeatedTime on a real control plane, across a real clock change.

The CronJob controller and the API server are Go programs: libfaketime does not move
their clock, but Go reads time zones from $ZONEINFO first. So this module compiles
(with zic, from libc-bin) a zone of its own, `Guardedcron/Fold`, whose clock is set
back by two minutes a few minutes from now, and starts a control plane of its own with
$ZONEINFO pointing at it (`ControlPlane(zoneinfo=...)`). The guard, a Python process,
reads the same file through $PYTHONTZPATH. Two CronJobs rendered by `guardedcron
render` fire every minute in that zone: with repeatedTime Twice both showings of the two
repeated wall-clock minutes run (as CronJobs do), with Once the second showings find
their slot claimed and are skipped; the minute after runs again.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import zoneinfo
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from guardedcron import contract
from guardedcron.schedule.dst import slot_of, slot_time
from guardedcron_devenv.binaries import Paths
from guardedcron_devenv.controlplane import ControlPlane
from tests.e2e.harness import (
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

pytestmark = pytest.mark.e2e

ZONE = "Guardedcron/Fold"
FOLD_MINUTES = 2
# From the apply to the first repeated minute: room for the namespace, the kubelet and
# the CronJob controller's first look, which must all come before the fold.
LEAD_MINUTES = 3
FINISH_SECONDS = 120


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
            gcj = guarded_cronjob(name, namespace, lease={"heartbeat": True}, spec={
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
