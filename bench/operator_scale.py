"""The operator at scale: N GuardedCronJobs on a real API server (or the emulator).

Measures, for `guardedcron operator` running as its own process through a kubeconfig
(as in the pod, cluster-wide):
- time from operator start to every CronJob applied, and to every status Ready;
- API requests while creating them (reads and writes apart, by verb and resource);
- the same on a restart over up-to-date objects (an idle resync; target: 0 writes);
- the operator's CPU (first start; restart) per object, and its resident memory.

By default the objects live on a real control plane (etcd, kube-apiserver and
kube-controller-manager from guardedcron_devenv, started here and stopped at the end);
`--api emulator` uses the kmock emulator instead. The operator runs on CPython's own
allocator with nothing preloaded, as in the chart's Deployment.
Usage, from the repository root:

    nice -n 10 .venv/bin/python bench/operator_scale.py --objects 1000 --namespaces 10
    .venv/bin/python bench/operator_scale.py --api emulator --objects 1000
    .venv/bin/python bench/operator_scale.py --objects 1000 --profile /tmp/prof   # cProfile
    nice -n 10 .venv/bin/python bench/operator_scale.py --objects 1000 --code 4c0f2a1  # older code

With `--profile DIR` the operator runs under cProfile and writes DIR/first.prof and
DIR/restart.prof (CPU figures then include the profiler's own cost). With `--code COMMIT`
the operator runs that commit's operator/ folder (taken with git archive), for a
before/after on the same control plane set-up.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.gcj import base_gcj  # noqa: E402

from bench.common import Tree, cpu_seconds, rss_mib, trees  # noqa: E402
from bench.scale_targets import Emulator, RealApiServer, Target, split  # noqa: E402
from guardedcron_devenv.controlplane import ControlPlane, free_port  # noqa: E402

GUARDEDCRON = str(Path(sys.executable).with_name("guardedcron"))
RESUMED = "Resuming is processed"
SETTLE_SECONDS = 3.0  # after the last object: late writes would show in the counts
# kopf's per-object workers end 5 s after their last event (settings.batching.idle_timeout),
# each with the body it held: RSS this long after the settle is the steady figure.
STEADY_SECONDS = 20.0  # the default of --steady


def gcj(index: int, namespaces: int) -> dict[str, Any]:
    """A GuardedCronJob whose schedule fires on the 1st of January only: no runs start
    during the benchmark, so every write counted is a reconcile's, not a run's."""
    obj = base_gcj()
    obj["metadata"] = {"name": f"job-{index:05d}", "namespace": f"team-{index % namespaces:02d}"}
    obj["spec"]["schedule"] = f"{index % 60} {index % 24} 1 1 *"
    return obj


async def wait_for(check: Callable[[], bool], what: str, phase_seconds: float) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > phase_seconds:
            raise SystemExit(f"timed out after {phase_seconds:.0f} s waiting for {what}")
        await asyncio.sleep(0.2)
    return time.monotonic() - started


async def wait_for_passes(op: Operator, count: int, phase_seconds: float) -> float:
    """Until `count` passes have run: kopf's resume queues a pass, the operator's workers run it."""
    started = time.monotonic()
    while await op.passes() < count:
        if time.monotonic() - started > phase_seconds:
            raise SystemExit(f"timed out after {phase_seconds:.0f} s waiting for {count} passes")
        await asyncio.sleep(0.5)
    return time.monotonic() - started


class Operator:
    """`guardedcron operator --standalone` as a child process, its log in a file."""

    def __init__(self, kubeconfig: Path, log: Path, profile: Path | None,
                 code: Tree | None) -> None:
        self.log = log
        base = code.env() if code is not None else dict(os.environ)
        self.metrics_port = free_port()
        self.env = {**base, "KUBECONFIG": str(kubeconfig),
                    "GUARDEDCRON_METRICS_PORT": str(self.metrics_port),
                    "GUARDEDCRON_LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "info")}
        self.command = [GUARDEDCRON, "operator", "--standalone"]
        if profile is not None or code is not None:
            self.command = [sys.executable, "-m", "guardedcron", "operator", "--standalone"]
        if profile is not None:
            self.command = [sys.executable, "-m", "cProfile", "-o", str(profile),
                            "-m", "guardedcron", "operator", "--standalone"]

    async def __aenter__(self) -> Operator:
        with self.log.open("w") as log:
            self.process = await asyncio.create_subprocess_exec(
                *self.command, env=self.env, stdout=asyncio.subprocess.DEVNULL, stderr=log)
        self.started = time.monotonic()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 120)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()

    def resumed(self) -> int:
        return self.log.read_text(errors="replace").count(RESUMED)

    async def passes(self) -> int:
        """Reconcile passes so far: the count of the operator's own duration histogram."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        async with aiohttp.ClientSession() as http, http.get(url) as answer:
            text = await answer.text()
        for line in text.splitlines():
            if line.startswith("guardedcron_reconcile_duration_seconds_count"):
                return int(float(line.split()[-1]))
        return 0

    def cpu(self) -> float:
        return cpu_seconds(self.process.pid)

    def rss(self) -> tuple[float, float]:
        return rss_mib(self.process.pid)


async def measure(target: Target, objects: int, namespaces: int, phase_seconds: float,
                  workdir: Path, profile: Path | None, code: Tree | None,
                  steady_seconds: float = STEADY_SECONDS) -> dict[str, Any]:
    await target.seed([gcj(i, namespaces) for i in range(objects)])
    load_at_start = os.getloadavg()[0]

    def profile_file(name: str) -> Path | None:
        return None if profile is None else profile / f"{name}.prof"

    # --- first start: every object is new
    before = await target.tally()
    async with Operator(target.kubeconfig, workdir / "first.log", profile_file("first"),
                        code) as op:
        applied_s = await wait_for(lambda: target.applied() >= objects, "every CronJob applied",
                                   phase_seconds)
        ready_s = applied_s + await wait_for(lambda: target.ready() >= objects, "every status Ready",
                                             phase_seconds)
        cpu_first = op.cpu()
        await asyncio.sleep(SETTLE_SECONDS)
        passes_first = await op.passes()
        create = split(await target.tally() - before, objects)
        rss, peak = op.rss()
        await asyncio.sleep(steady_seconds)
        steady, _ = op.rss()

    # --- restart over up-to-date objects: an idle resync
    before = await target.tally()
    async with Operator(target.kubeconfig, workdir / "restart.log", profile_file("restart"),
                        code) as op:
        resumed_s = await wait_for(lambda: op.resumed() >= objects, "every object resumed",
                                   phase_seconds)
        resumed_s += await wait_for_passes(op, objects, phase_seconds)
        cpu_restart = op.cpu()
        await asyncio.sleep(SETTLE_SECONDS)
        passes_restart = await op.passes()
        idle = split(await target.tally() - before, objects)
        idle_rss, idle_peak = op.rss()
        await asyncio.sleep(steady_seconds)
        idle_steady, _ = op.rss()

    return {
        "objects": objects,
        "namespaces": namespaces,
        "start_to_all_cronjobs_applied_s": round(applied_s, 1),
        "start_to_all_ready_s": round(ready_s, 1),
        "operator_cpu_s_first_start": round(cpu_first, 1),
        "operator_cpu_ms_per_object_first_start": round(cpu_first * 1000 / objects, 1),
        "passes_first_start": passes_first,
        "create": create,
        "rss_mib_at_all_objects": round(rss, 1),
        "rss_peak_mib": round(peak, 1),
        f"rss_mib_steady_{steady_seconds:.0f}s_later": round(steady, 1),
        "restart_to_all_resumed_s": round(resumed_s, 1),
        "operator_cpu_s_restart": round(cpu_restart, 1),
        "operator_cpu_ms_per_object_restart": round(cpu_restart * 1000 / objects, 1),
        "passes_restart": passes_restart,
        "idle_restart": idle,
        "rss_mib_after_restart": round(idle_rss, 1),
        "rss_peak_mib_after_restart": round(idle_peak, 1),
        f"rss_mib_steady_{steady_seconds:.0f}s_after_restart": round(idle_steady, 1),
        "load_average_1m_at_start": load_at_start,
        "load_average_1m_at_end": os.getloadavg()[0],
        "logs": str(workdir),
    }


@contextlib.contextmanager
def control_plane(keep_logs: Path) -> Iterator[ControlPlane]:
    with ControlPlane(name="bench-scale", logs_dir=keep_logs,
                      progress=lambda line: print(line, file=sys.stderr)) as plane:
        yield plane


async def run(options: argparse.Namespace, workdir: Path, code: Tree | None) -> dict[str, Any]:
    args = (options.objects, options.namespaces, options.timeout, workdir, options.profile, code,
            options.steady)
    if options.api == "emulator":
        async with Emulator(workdir) as emulator:
            return {"api": "emulator", **await measure(emulator, *args)}
    with control_plane(workdir / "controlplane") as plane:
        async with RealApiServer(plane) as api:
            return {"api": "kube-apiserver", **await measure(api, *args)}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--api", choices=("real", "emulator"), default="real")
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per phase")
    parser.add_argument("--profile", type=Path, help="run the operator under cProfile, files here")
    parser.add_argument("--code", help="run this commit's operator code instead of the working tree's")
    parser.add_argument("--steady", type=float, default=STEADY_SECONDS,
                        help="seconds after each phase's settle at which RSS is read again")
    options = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="guardedcron-bench-scale-"))
    if options.profile is not None:
        options.profile.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        code = stack.enter_context(trees(options.code))[0] if options.code else None
        result = asyncio.run(run(options, workdir, code))
    print(json.dumps({**result, "code": options.code or "working tree"}, indent=2))


if __name__ == "__main__":
    main()
