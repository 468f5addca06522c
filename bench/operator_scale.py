"""The operator at scale against the API emulator: 1,000 GuardedCronJobs.

Measures, for `guardedcron operator` running as its own process (as in the pod):
- time from operator start to every CronJob applied, and to every status Ready;
- API requests per GuardedCronJob while creating them (reads and writes apart);
- the same on a restart over up-to-date objects (an idle resync; target: 0 writes);
- the operator's resident memory with every object known (target: at most 150 MiB).

The emulator (tests/support/emulator.py: kmock with server-side apply and the
server-owned metadata) runs in this process; the operator reaches it through a
kubeconfig, as it would reach a cluster. Usage, from the repository root:

    .venv/bin/python bench/operator_scale.py [--objects 1000] [--namespaces 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import kmock  # noqa: E402
import kopf  # noqa: E402
from tests.support.emulator import GuardedEmulator  # noqa: E402
from tests.support.gcj import base_gcj  # noqa: E402

from bench.common import cpu_seconds, rss_mib  # noqa: E402
from guardedcron.kube import GUARDED_CRONJOBS, KubeClient  # noqa: E402

GUARDEDCRON = str(Path(sys.executable).with_name("guardedcron"))
READS = ("GET",)
MIB = 1024 * 1024


def gcj(index: int, namespaces: int) -> dict[str, Any]:
    obj = base_gcj()
    obj["metadata"] = {"name": f"job-{index:04d}", "namespace": f"team-{index % namespaces:02d}"}
    obj["spec"]["schedule"] = f"{index % 60} {index % 24} * * *"
    return obj


async def wait_for(check: Callable[[], bool], what: str, phase_seconds: float) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > phase_seconds:
            raise SystemExit(f"timed out after {phase_seconds:.0f} s waiting for {what}")
        await asyncio.sleep(0.1)
    return time.monotonic() - started


def count(api: GuardedEmulator, since: int, objects: int) -> dict[str, float]:
    requests = api.requests_list()[since:]
    reads = [r for r in requests if r.method.value in READS]
    writes = api.writes(since)
    return {
        "requests": len(requests),
        "reads": len(reads),
        "writes": len(writes),
        "reads_per_object": len(reads) / objects,
        "writes_per_object": len(writes) / objects,
    }


async def main(objects: int, namespaces: int, phase_seconds: float) -> dict[str, Any]:
    running: list[asyncio.subprocess.Process] = []
    try:
        return await measure(objects, namespaces, phase_seconds, running)
    finally:
        for process in running:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def measure(
    objects: int, namespaces: int, phase_seconds: float, running: list[asyncio.subprocess.Process]
) -> dict[str, Any]:
    async with GuardedEmulator() as api, kmock.Server(api):
        api.declare_resources()
        url = str(api.url).rstrip("/")
        seed = KubeClient(kopf.ConnectionInfo(server=url))
        for index in range(objects):
            body = gcj(index, namespaces)
            await seed.create(GUARDED_CRONJOBS, body["metadata"]["namespace"], body)
        await seed.close()

        workdir = Path(tempfile.mkdtemp(prefix="guardedcron-bench-"))
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "emulator",
                    "clusters": [{"name": "emulator", "cluster": {"server": url}}],
                    "users": [{"name": "bench", "user": {"token": "bench"}}],
                    "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "bench"}}],
                }
            )
        )
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "GUARDEDCRON_METRICS_PORT": "0",
            "GUARDEDCRON_LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "info"),
        }

        def ready_count() -> int:
            return sum(
                1
                for key, obj in api.objects.items()
                if key[0].plural == "guardedcronjobs"
                and not obj.deleted
                and any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in obj.get("status", {}).get("conditions", ())
                )
            )

        def cronjob_count() -> int:
            return sum(
                1 for key, obj in api.objects.items() if key[0].plural == "cronjobs" and not obj.deleted
            )

        async def start(log: Path) -> asyncio.subprocess.Process:
            return await asyncio.create_subprocess_exec(
                GUARDEDCRON,
                "operator",
                "--standalone",
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log.open("w"),
            )

        async def stop(process: asyncio.subprocess.Process) -> None:
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.wait(), 60)

        # --- first start: every object is new
        since = len(api.requests_list())
        first_log = workdir / "first.log"
        process = await start(first_log)
        running.append(process)
        applied_s = await wait_for(lambda: cronjob_count() >= objects, "every CronJob applied", phase_seconds)
        ready_s = await wait_for(lambda: ready_count() >= objects, "every status Ready", phase_seconds)
        await asyncio.sleep(2)  # settle: late writes would show in the counts
        create = count(api, since, objects)
        rss, peak = rss_mib(process.pid)
        cpu_first = cpu_seconds(process.pid)
        await stop(process)

        # --- restart over up-to-date objects: an idle resync
        since = len(api.requests_list())
        second_log = workdir / "second.log"
        process = await start(second_log)
        running.append(process)
        restart_started = time.monotonic()
        await wait_for(
            lambda: second_log.read_text().count("Resuming is processed") >= objects,
            "every object resumed",
            phase_seconds,
        )
        resumed_s = time.monotonic() - restart_started
        await asyncio.sleep(3)
        idle = count(api, since, objects)
        idle_rss, idle_peak = rss_mib(process.pid)
        cpu_restart = cpu_seconds(process.pid)
        await stop(process)

    return {
        "objects": objects,
        "namespaces": namespaces,
        "start_to_all_cronjobs_applied_s": round(applied_s, 1),
        "start_to_all_ready_s": round(applied_s + ready_s, 1),
        "create": create,
        "operator_cpu_s_first_start": round(cpu_first, 1),
        "rss_mib_at_all_objects": round(rss, 1),
        "rss_peak_mib": round(peak, 1),
        "restart_to_all_resumed_s": round(resumed_s, 1),
        "idle_resync": idle,
        "rss_mib_after_restart": round(idle_rss, 1),
        "rss_peak_mib_after_restart": round(idle_peak, 1),
        "operator_cpu_s_restart": round(cpu_restart, 1),
        "load_average_1m_at_end": os.getloadavg()[0],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per phase")
    options = parser.parse_args()
    print(json.dumps(asyncio.run(main(options.objects, options.namespaces, options.timeout)), indent=2))
