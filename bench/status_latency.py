"""Run status latency and operator cost under a steady stream of runs, on the API emulator.

Two phases, with `guardedcron operator` running as its own process (as in the pod) and
the extended emulator (tests/support/emulator.py) in this one:

1. latency: a few GuardedCronJobs; `--runs` runs one after the other. Each run is a Job
   and its pod stored through the API (guard exited 0 with its `acquired` message, the
   workload running), then, once status shows it Running, the pod's and the Job's
   statuses patched to finished (pod Succeeded, Job `Complete`): the clock starts just
   before the Job's patch and stops when the GuardedCronJob's stored status shows the
   run `Succeeded` in `lastRun`. Target: p95 at most 2 s.
2. scale: `--objects` GuardedCronJobs, every status Ready, then `--rate` runs a minute
   for `--minutes` (each run lasts `--run-seconds`, spread over all objects): the
   operator's CPU (seconds used / wall seconds) and resident memory, and the same
   latency for the runs finished under that load.

Usage, from the repository root:

    .venv/bin/python bench/status_latency.py [--runs 200] [--objects 1000] [--rate 100]
                                             [--minutes 3] [--run-seconds 20]

One JSON document on stdout. The emulator shares this process's event loop with the
driver, so the figures include its own serving time; both share the machine's cores
with the operator.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import kmock  # noqa: E402
import kopf  # noqa: E402
from tests.support.emulator import GuardedEmulator  # noqa: E402
from tests.support.gcj import base_gcj  # noqa: E402

from bench.common import cpu_seconds, percentile, rss_mib  # noqa: E402
from guardedcron import contract  # noqa: E402
from guardedcron.kube import GUARDED_CRONJOBS, JOBS, PODS, KubeClient  # noqa: E402

GUARDEDCRON = str(Path(sys.executable).with_name("guardedcron"))
NAMESPACE_COUNT = 10
MIB = 1024 * 1024


# --- the objects of one run ----------------------------------------------------------

def ts(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def gcj(index: int) -> dict[str, Any]:
    obj = base_gcj()
    obj["metadata"] = {"name": f"job-{index:04d}", "namespace": f"team-{index % NAMESPACE_COUNT:02d}"}
    obj["spec"]["schedule"] = f"{index % 60} {index % 24} * * *"
    return obj


def labels(gcj_name: str, job_name: str) -> dict[str, str]:
    return {contract.LABEL_NAME: gcj_name, contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE,
            contract.LABEL_JOB_NAME: job_name, "job-name": job_name}


def run_job(namespace: str, gcj_name: str, job_name: str, now: datetime) -> dict[str, Any]:
    """A manual run's Job as the Job controller shows it while its pod runs."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": job_name, "namespace": namespace, "labels": labels(gcj_name, job_name),
                         "annotations": {contract.ANNOTATION_MANUAL: "bench"}},
            "spec": {"backoffLimit": 0, "activeDeadlineSeconds": 3600},
            "status": {"startTime": ts(now), "active": 1}}


def run_pod(namespace: str, gcj_name: str, job_name: str, fence: int, now: datetime) -> dict[str, Any]:
    pod_name = f"{job_name}-bnch5"
    message = json.dumps({"outcome": "acquired", "acquired": True, "reason": "acquired",
                          "lock": f"{namespace}/{gcj_name}", "holder": f"{namespace}/{pod_name}",
                          "fence": fence, "slot": None, "run_id": fence}, separators=(",", ":"))
    guard = {"name": contract.GUARD_CONTAINER, "ready": False, "restartCount": 0,
             "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": message,
                                      "startedAt": ts(now), "finishedAt": ts(now)}}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": namespace, "labels": labels(gcj_name, job_name)},
            "status": {"phase": "Running", "initContainerStatuses": [guard], "containerStatuses": [
                {"name": "task", "ready": True, "restartCount": 0,
                 "state": {"running": {"startedAt": ts(now)}}}]}}


def finished_pod_status(now: datetime) -> dict[str, Any]:
    return {"phase": "Succeeded", "containerStatuses": [
        {"name": "task", "ready": False, "restartCount": 0,
         "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": ts(now),
                                  "finishedAt": ts(now)}}}]}


def complete_job_status(started: datetime, now: datetime) -> dict[str, Any]:
    condition = {"status": "True", "reason": "CompletionsReached",
                 "message": "Reached expected number of succeeded pods",
                 "lastProbeTime": ts(now), "lastTransitionTime": ts(now)}
    return {"startTime": ts(started), "completionTime": ts(now), "active": None, "succeeded": 1,
            "conditions": [{"type": "SuccessCriteriaMet", **condition}, {"type": "Complete", **condition}]}


# --- measuring -------------------------------------------------------------------------

def summary(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {"count": 0}
    return {"count": len(latencies), "p50_s": round(percentile(latencies, 0.5), 3),
            "p95_s": round(percentile(latencies, 0.95), 3), "p99_s": round(percentile(latencies, 0.99), 3),
            "max_s": round(max(latencies), 3)}


async def wait_for(check: Callable[[], bool], what: str, limit_s: float, pause: float = 0.005) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > limit_s:
            raise SystemExit(f"timed out after {limit_s:.0f} s waiting for {what}")
        await asyncio.sleep(pause)
    return time.monotonic() - started


class World:
    """The emulator, a client writing to it, and what the operator wrote back."""

    def __init__(self, api: GuardedEmulator, client: KubeClient) -> None:
        self.api, self.client = api, client
        self.fence = 0

    def last_run(self, namespace: str, name: str) -> dict[str, Any]:
        obj = self.api.object("guardedcron.io/v1alpha1/guardedcronjobs", namespace, name) or {}
        run: dict[str, Any] = (obj.get("status") or {}).get("lastRun") or {}
        return run

    def shows(self, namespace: str, name: str, job_name: str) -> Callable[[], bool]:
        return lambda: self.last_run(namespace, name).get("job") == job_name

    def ready_count(self) -> int:
        return sum(1 for key, obj in self.api.objects.items()
                   if key[0].plural == "guardedcronjobs" and not obj.deleted
                   and any(c["type"] == "Ready" and c["status"] == "True"
                           for c in obj.get("status", {}).get("conditions", ())))

    async def start_run(self, namespace: str, name: str, job_name: str) -> datetime:
        now = datetime.now(UTC)
        self.fence += 1
        await self.client.create(JOBS, namespace, run_job(namespace, name, job_name, now))
        await self.client.create(PODS, namespace, run_pod(namespace, name, job_name, self.fence, now))
        return now

    async def finish_run(self, namespace: str, name: str, job_name: str, started: datetime,
                         limit_s: float) -> float:
        """Seconds from the Job's Complete condition being stored to the status showing it."""
        now = datetime.now(UTC)
        await self.client.merge_patch(PODS, namespace, f"{job_name}-bnch5",
                                      {"status": finished_pod_status(now)}, subresource="status")
        clock = time.monotonic()
        await self.client.merge_patch(JOBS, namespace, job_name,
                                      {"status": complete_job_status(started, now)}, subresource="status")
        await wait_for(lambda: (run := self.last_run(namespace, name)).get("job") == job_name
                       and run.get("outcome") == "Succeeded", f"{job_name} Succeeded in status", limit_s)
        return time.monotonic() - clock


@contextlib.asynccontextmanager
async def operator(url: str, workdir: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "bench", "user": {"token": "bench"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "bench"}}]}))
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "GUARDEDCRON_METRICS_PORT": "0",
           "GUARDEDCRON_LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "warning")}
    log = (workdir / "operator.log").open("w")
    process = await asyncio.create_subprocess_exec(
        GUARDEDCRON, "operator", "--standalone", env=env, stdout=asyncio.subprocess.DEVNULL, stderr=log)
    try:
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 60)
            except TimeoutError:
                process.kill()
                await process.wait()
        log.close()


@contextlib.asynccontextmanager
async def emulated_world(objects: int) -> AsyncIterator[tuple[World, str]]:
    async with GuardedEmulator() as api, kmock.Server(api):
        api.declare_resources()
        url = str(api.url).rstrip("/")
        client = KubeClient(kopf.ConnectionInfo(server=url))
        try:
            for index in range(objects):
                body = gcj(index)
                await client.create(GUARDED_CRONJOBS, body["metadata"]["namespace"], body)
            yield World(api, client), url
        finally:
            await client.close()


async def latency_phase(runs: int, objects: int, limit_s: float) -> dict[str, Any]:
    async with emulated_world(objects) as (world, url):
        workdir = Path(tempfile.mkdtemp(prefix="guardedcron-bench-latency-"))
        async with operator(url, workdir) as process:
            await wait_for(lambda: world.ready_count() >= objects, "every status Ready", limit_s, 0.1)
            latencies = []
            for number in range(runs):
                body = gcj(number % objects)
                namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
                job_name = f"{name}-manual-{number:05d}x"
                started = await world.start_run(namespace, name, job_name)
                await wait_for(world.shows(namespace, name, job_name), f"{job_name} Running in status",
                               limit_s)
                latencies.append(await world.finish_run(namespace, name, job_name, started, limit_s))
            rss, peak = rss_mib(process.pid)
    return {"objects": objects, "runs": runs, "job_finished_to_status": summary(latencies),
            "operator_rss_mib": round(rss, 1), "operator_rss_peak_mib": round(peak, 1)}


async def scale_phase(objects: int, rate: float, minutes: float, run_seconds: float,
                      limit_s: float) -> dict[str, Any]:
    async with emulated_world(objects) as (world, url):
        workdir = Path(tempfile.mkdtemp(prefix="guardedcron-bench-scale-"))
        async with operator(url, workdir) as process:
            ready_s = await wait_for(lambda: world.ready_count() >= objects, "every status Ready",
                                     limit_s, 0.1)
            await asyncio.sleep(5)  # the start-up passes settle
            rss_idle, _ = rss_mib(process.pid)
            cpu_before, wall_before = cpu_seconds(process.pid), time.monotonic()
            latencies: list[float] = []
            pending: set[asyncio.Task[None]] = set()
            errors: list[str] = []

            async def one_run(number: int) -> None:
                body = gcj((number * 7919) % objects)  # spread over the objects
                namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
                job_name = f"{name}-manual-{number:05d}x"
                try:
                    started = await world.start_run(namespace, name, job_name)
                    await asyncio.sleep(run_seconds)
                    latencies.append(await world.finish_run(namespace, name, job_name, started, limit_s))
                except (Exception, SystemExit) as error:  # reported, not fatal: the load goes on
                    errors.append(f"{job_name}: {error}")

            total = round(rate * minutes)
            for number in range(total):
                task = asyncio.create_task(one_run(number))
                pending.add(task)
                task.add_done_callback(pending.discard)
                await asyncio.sleep(60.0 / rate)
            await asyncio.gather(*pending)
            cpu_used = cpu_seconds(process.pid) - cpu_before
            wall = time.monotonic() - wall_before
            rss, peak = rss_mib(process.pid)
    return {"objects": objects, "runs_per_minute": rate, "runs": total, "run_seconds": run_seconds,
            "start_to_all_ready_s": round(ready_s, 1), "wall_s": round(wall, 1),
            "operator_cpu_s": round(cpu_used, 1), "operator_cpu_percent_of_one_core": round(
                100 * cpu_used / wall, 1),
            "operator_rss_mib_before_runs": round(rss_idle, 1), "operator_rss_mib_after_runs": round(rss, 1),
            "operator_rss_peak_mib": round(peak, 1), "job_finished_to_status": summary(latencies),
            "errors": errors[:5], "error_count": len(errors)}


async def main(options: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"started": ts(datetime.now(UTC))}
    if options.runs:
        result["latency"] = await latency_phase(options.runs, options.latency_objects, options.timeout)
    if options.objects:
        result["scale"] = await scale_phase(options.objects, options.rate, options.minutes,
                                            options.run_seconds, options.timeout)
    result["load_average_1m_at_end"] = os.getloadavg()[0]
    result["cpus"] = os.cpu_count()
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="latency phase runs (0: skip the phase)")
    parser.add_argument("--latency-objects", type=int, default=10)
    parser.add_argument("--objects", type=int, default=1000, help="scale phase objects (0: skip the phase)")
    parser.add_argument("--rate", type=float, default=100, help="runs a minute in the scale phase")
    parser.add_argument("--minutes", type=float, default=3)
    parser.add_argument("--run-seconds", type=float, default=20)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per wait")
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=2))
