"""A process-kubelet: a stand-in for the kubelet that runs pods as local processes.

It is NOT a kubelet. It does, for what guardedcron needs to be tested end to end,
what a kubelet would do: register a Node, bind pending pods to it, run each pod's
containers as local processes in Kubernetes order (init containers one by one,
native sidecars — init containers with restartPolicy Always — kept running and
restarted if they exit, their exec startupProbe passed before the next container
starts, then the main containers; sidecars get SIGTERM after the main containers
stop), and patch the pod's status with real exit codes, reasons and termination
messages so the Job controller and the operator see true phases. Pods being deleted
(the Job controller enforcing activeDeadlineSeconds, garbage collection) get SIGTERM,
then SIGKILL.

What each process starts with (argv, env from the downward API, Secrets and
ConfigMaps, volume folders on the host) is resolved by `pod_spec.py`; this module is
the processes' lifecycle and the status the kubelet reports.

Images are not pulled: each image name maps to an `Image` with a host entrypoint
and default args. A container's termination message is read from the file named by
$GUARDEDCRON_TERMINATION_LOG (the guard honours it) instead of /dev/termination-log;
with FallbackToLogsOnError the tail of its output is used.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from guardedcron_devenv.admin_api import AdminApi, ApiError
from guardedcron_devenv.pod_spec import Image, PodSpecResolver

__all__ = ["MAX_GRACE_SECONDS", "NODE_NAME", "Image", "ProcessKubelet"]

NODE_NAME = "process-kubelet"
POLL_SECONDS = 0.3
MAX_GRACE_SECONDS = 5.0
TERMINATION_LOG_ENV = "GUARDEDCRON_TERMINATION_LOG"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerRun:
    """One container's process and the status the kubelet reports for it."""

    name: str
    spec: Mapping[str, Any]
    log: Path
    termination_file: Path
    process: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    restart_count: int = 0
    last_terminated: dict[str, Any] | None = None
    terminated: dict[str, Any] | None = None
    waiting_reason: str = "PodInitializing"

    def status(self, image: str) -> dict[str, Any]:
        if self.terminated is not None:
            state: dict[str, Any] = {"terminated": self.terminated}
        elif self.process is not None:
            state = {"running": {"startedAt": self.started_at}}
        else:
            state = {"waiting": {"reason": self.waiting_reason}}
        status: dict[str, Any] = {
            "name": self.name,
            "image": image,
            "imageID": f"process-kubelet://{image}",
            "ready": self.process is not None and self.terminated is None,
            "started": self.process is not None and self.terminated is None,
            "restartCount": self.restart_count,
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }
        return status


class PodRunner:
    """Runs one pod's processes to the end (init containers, sidecars, main containers,
    signals), reporting status after every change; what each process starts with comes
    from the pod's `PodSpecResolver`."""

    def __init__(self, kubelet: ProcessKubelet, pod: Mapping[str, Any]) -> None:
        self.kubelet = kubelet
        self.pod = pod
        meta = pod["metadata"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"
        self.dir = Path(tempfile.mkdtemp(prefix=f"pod-{self.name}-", dir=kubelet.workdir))
        self.resolver = PodSpecResolver(kubelet.api, pod, kubelet.node_name, self.dir)
        self.deleting = threading.Event()
        self.lock = threading.Lock()
        spec = pod["spec"]
        self.init_runs = [self._container_run(c) for c in spec.get("initContainers") or []]
        self.main_runs = [self._container_run(c) for c in spec.get("containers") or []]
        self.phase = "Pending"
        self.start_time = now_iso()
        self._main_done = False

    # --- setup -------------------------------------------------------------------
    def _container_run(self, spec: Mapping[str, Any]) -> ContainerRun:
        return ContainerRun(
            name=spec["name"],
            spec=spec,
            log=self.dir / f"{spec['name']}.log",
            termination_file=self.dir / f"{spec['name']}.termination-log",
        )

    # --- running -------------------------------------------------------------------
    def start(self, run: ContainerRun) -> None:
        image_name = run.spec.get("image", "")
        image = self.kubelet.images.get(image_name)
        run.termination_file.write_text("")
        if image is None:
            run.terminated = self._terminated(
                128, "ErrImageNeverPull", f"image {image_name!r} is unknown to the process-kubelet"
            )
            return
        launch = self.resolver.launch(run.spec, image)
        log = run.log.open("ab")
        try:
            run.process = subprocess.Popen(
                launch.argv,
                env=self._process_env(run, launch.env),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=True,
            )
        except OSError as exc:
            run.terminated = self._terminated(128, "StartError", str(exc))
        finally:
            log.close()
        run.started_at = now_iso()

    def _process_env(self, run: ContainerRun, container_env: Mapping[str, str]) -> dict[str, str]:
        return {
            "PATH": self.kubelet.path,
            "HOME": str(self.dir),
            "HOSTNAME": self.name,
            TERMINATION_LOG_ENV: str(run.termination_file),
            **container_env,
        }

    def wait_until_started(self, run: ContainerRun) -> bool:
        """A native sidecar's startupProbe, as the kubelet runs it before it starts the
        containers after the sidecar: every periodSeconds until it passes; after
        failureThreshold failures in a row (or if the sidecar exits) the sidecar is
        restarted. Exec probes only. False if the pod is deleted meanwhile."""
        probe = run.spec.get("startupProbe")
        if not probe:
            return True
        command = (probe.get("exec") or {}).get("command")
        if not command:
            raise RuntimeError("the process-kubelet runs exec startupProbes only")
        image = self.kubelet.images[run.spec.get("image", "")]
        launch = self.resolver.launch({**run.spec, "command": command, "args": []}, image)
        period = float(probe.get("periodSeconds", 10))
        threshold = int(probe.get("failureThreshold", 3))
        failures = 0
        while not self.deleting.is_set():
            try:
                passed = subprocess.run(
                    launch.argv, env=self._process_env(run, launch.env), cwd=self.dir,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    timeout=float(probe.get("timeoutSeconds", 1)), check=False,
                ).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                passed = False
            if passed:
                return True
            failures += 1
            exited = run.process is None or run.process.poll() is not None
            if failures >= threshold or exited:
                self._restart(run)
                failures = 0
            self.deleting.wait(period)
        return False

    def _restart(self, run: ContainerRun) -> None:
        if run.process is not None:
            self.stop(run)
            run.last_terminated = self.finish(run, _exit_code(run.process.wait()))
        run.restart_count += 1
        run.process = None
        self.report()
        self.start(run)
        self.report()

    def finish(self, run: ContainerRun, code: int) -> dict[str, Any]:
        message = run.termination_file.read_text(errors="replace")[:4096]
        if not message and code != 0 and run.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            lines = run.log.read_text(errors="replace").splitlines()[-80:]
            message = "\n".join(lines)[-2048:]
        reason = "Completed" if code == 0 else "Error"
        terminated = self._terminated(code, reason, message)
        terminated["startedAt"] = run.started_at
        return terminated

    @staticmethod
    def _terminated(code: int, reason: str, message: str) -> dict[str, Any]:
        body: dict[str, Any] = {"exitCode": code, "reason": reason, "finishedAt": now_iso()}
        if message:
            body["message"] = message
        return body

    def wait(self, run: ContainerRun) -> int:
        assert run.process is not None
        while True:
            code = run.process.poll()
            if code is not None:
                return _exit_code(code)
            if self.deleting.is_set():
                self.stop(run)
            time.sleep(0.05)

    def stop(self, run: ContainerRun) -> None:
        if run.process is None or run.process.poll() is not None:
            return
        grace = min(
            float(self.pod["spec"].get("terminationGracePeriodSeconds", 30)),
            self.kubelet.max_grace_seconds,
        )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.process.pid, signal.SIGTERM)
        try:
            run.process.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.process.pid, signal.SIGKILL)
            run.process.wait()

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # report, never hang the pod
            self.kubelet.report(f"pod {self.namespace}/{self.name}: process-kubelet error: {exc}")
            self.phase = "Failed"
            with contextlib.suppress(Exception):
                self.report()
        finally:
            for run in self.init_runs + self.main_runs:
                self.stop(run)
            if self.deleting.is_set():
                with contextlib.suppress(ApiError):
                    self.kubelet.api.delete(self.path, gracePeriodSeconds="0")
            if not self.kubelet.keep_pod_dirs:
                shutil.rmtree(self.dir, ignore_errors=True)

    def _run(self) -> None:
        self.report()
        sidecars: list[ContainerRun] = []
        for run in self.init_runs:
            if self.deleting.is_set():
                break
            self.start(run)
            if run.terminated is not None:
                return self._fail()
            if run.spec.get("restartPolicy") == "Always":
                sidecars.append(run)
                self.report()
                if not self.wait_until_started(run):
                    return self._fail()
                continue
            self.report()
            run.terminated = self.finish(run, self.wait(run))
            self.report()
            if run.terminated["exitCode"] != 0:
                return self._fail()
        if self.deleting.is_set():
            return self._fail()
        watcher = threading.Thread(target=self._keep_sidecars, args=(sidecars,), daemon=True)
        watcher.start()
        self.phase = "Running"
        for run in self.main_runs:
            self.start(run)
        self.report()
        codes = []
        for run in self.main_runs:
            if run.terminated is None:
                run.terminated = self.finish(run, self.wait(run))
                self.report()
            codes.append(run.terminated["exitCode"])
        self._main_done = True
        for run in reversed(sidecars):  # sidecars stop after the main containers, last first
            with self.lock:
                self.stop(run)
                if run.process is not None and run.terminated is None:
                    run.terminated = self.finish(run, _exit_code(run.process.wait()))
        watcher.join(2)
        self.phase = "Succeeded" if all(c == 0 for c in codes) and not self.deleting.is_set() else "Failed"
        self.report()
        return None

    def _keep_sidecars(self, sidecars: list[ContainerRun]) -> None:
        """Restart a sidecar that exits while the main containers run, as the kubelet does."""
        while not self._main_done and not self.deleting.is_set():
            for run in sidecars:
                with self.lock:
                    if self._main_done or run.process is None or run.process.poll() is None:
                        continue
                    time.sleep(0.5)  # a short back-off
                    self._restart(run)
            time.sleep(0.1)

    def _fail(self) -> None:
        for run in self.main_runs:
            if run.terminated is None and run.process is None:
                run.waiting_reason = "PodInitializing"
        self.phase = "Failed"
        self.report()

    def report(self) -> None:
        spec = self.pod["spec"]
        images = {
            c["name"]: c.get("image", "")
            for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])
        }
        initialized = (
            all(r.terminated is not None or r.spec.get("restartPolicy") == "Always" for r in self.init_runs)
            and self.phase != "Pending"
        )
        status: dict[str, Any] = {
            "phase": self.phase,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "startTime": self.start_time,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True" if initialized else "False"},
                {"type": "Ready", "status": "True" if self.phase == "Running" else "False"},
            ],
            "initContainerStatuses": [r.status(images[r.name]) for r in self.init_runs],
            "containerStatuses": [r.status(images[r.name]) for r in self.main_runs],
        }
        try:
            self.kubelet.api.merge_patch(self.path + "/status", {"status": status})
        except ApiError as exc:
            if exc.code != 404:
                raise


class ProcessKubelet:
    """Binds and runs the pods of the given namespaces on one fake Node, in threads."""

    def __init__(
        self,
        api: AdminApi,
        images: Mapping[str, Image],
        *,
        namespaces: Sequence[str] | None = None,
        node_name: str = NODE_NAME,
        extra_path: Sequence[str] = (),
        keep_pod_dirs: bool = False,
        report: Callable[[str], None] = print,
        max_grace_seconds: float = MAX_GRACE_SECONDS,
    ) -> None:
        self.api = api
        self.images = dict(images)
        self.namespaces = list(namespaces) if namespaces else None
        self.node_name = node_name
        self.path = os.pathsep.join([*extra_path, os.environ.get("PATH", "/usr/bin:/bin")])
        self.keep_pod_dirs = keep_pod_dirs
        self.report = report
        # Caps terminationGracePeriodSeconds: short by default so tear-down stays quick.
        self.max_grace_seconds = max_grace_seconds
        self.workdir = Path(tempfile.mkdtemp(prefix="process-kubelet-"))
        self._runners: dict[str, PodRunner] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ProcessKubelet:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        self._register_node()
        self._thread = threading.Thread(target=self._loop, name="process-kubelet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for runner in list(self._runners.values()):
            runner.deleting.set()
        deadline = time.monotonic() + 10
        for runner in list(self._runners.values()):
            for run in runner.init_runs + runner.main_runs:
                if run.process is not None and time.monotonic() < deadline:
                    runner.stop(run)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _register_node(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": {"kubernetes.io/hostname": self.node_name}},
        }
        with contextlib.suppress(ApiError):
            self.api.post("/api/v1/nodes", node)
        self.api.merge_patch(
            f"/api/v1/nodes/{self.node_name}/status",
            {
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "ProcessKubeletReady",
                            "message": "a process-kubelet stand-in, not a kubelet",
                            "lastHeartbeatTime": now_iso(),
                            "lastTransitionTime": now_iso(),
                        }
                    ],
                    "capacity": {"cpu": "2", "memory": "8Gi", "pods": "110"},
                    "allocatable": {"cpu": "2", "memory": "8Gi", "pods": "110"},
                }
            },
        )

    def _pods_path(self, namespace: str | None) -> str:
        return f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
            except Exception as exc:  # the API server may be restarting; keep going
                self.report(f"process-kubelet: poll failed: {exc}")
            self._stop.wait(POLL_SECONDS)

    def _poll(self) -> None:
        scopes: list[str | None] = list(self.namespaces) if self.namespaces else [None]
        for namespace in scopes:
            pods = self.api.get(self._pods_path(namespace))["items"]
            for pod in pods:
                key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}/{pod['metadata']['uid']}"
                runner = self._runners.get(key)
                if pod["metadata"].get("deletionTimestamp"):
                    if runner is not None:
                        runner.deleting.set()
                    elif pod["spec"].get("nodeName") == self.node_name:
                        with contextlib.suppress(ApiError):
                            self.api.delete(
                                f"/api/v1/namespaces/{pod['metadata']['namespace']}"
                                f"/pods/{pod['metadata']['name']}",
                                gracePeriodSeconds="0",
                            )
                    continue
                if runner is not None or pod["spec"].get("nodeName") not in (None, "", self.node_name):
                    continue
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                self._launch(key, pod)

    def _launch(self, key: str, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        if not pod["spec"].get("nodeName"):
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
            }
            try:
                self.api.post(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding", binding)
            except ApiError as exc:
                self.report(f"process-kubelet: cannot bind {meta['namespace']}/{meta['name']}: {exc}")
                return
        runner = PodRunner(self, pod)
        self._runners[key] = runner
        threading.Thread(target=runner.run, name=f"pod-{meta['name']}", daemon=True).start()

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """The output of a container of a running or kept pod, for tests and the demo."""
        for key, runner in self._runners.items():
            if key.startswith(f"{namespace}/{pod}/"):
                for run in runner.init_runs + runner.main_runs:
                    if run.name == container and run.log.exists():
                        return run.log.read_text(errors="replace")
        return ""


def _exit_code(returncode: int) -> int:
    """A process killed by a signal reports 128 + signal, as in a container."""
    return 128 - returncode if returncode < 0 else returncode
