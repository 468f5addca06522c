"""A process-kubelet: a stand-in for the kubelet that runs pods as local processes.

It is NOT a kubelet. It does, for what guardedcron needs to be tested end to end,
what a kubelet would do: register a Node, bind pending pods to it, run each pod's
containers as local processes in Kubernetes order (init containers one by one,
native sidecars — init containers with restartPolicy Always — kept running and
restarted if they exit, then the main containers; sidecars get SIGTERM after the
main containers stop), resolve env from the downward API, Secrets and ConfigMaps,
give each volume mount a host folder (and rewrite the mount path in command, args
and env values), and patch the pod's status with real exit codes, reasons and
termination messages so the Job controller and the operator see true phases. Pods
being deleted (the Job controller enforcing activeDeadlineSeconds, garbage
collection) get SIGTERM, then SIGKILL.

Images are not pulled: each image name maps to an `Image` with a host entrypoint
and default args. Kubernetes rules apply: `command` replaces the entrypoint, `args`
replace the default args. A container's termination message is read from the file
named by $GUARDEDCRON_TERMINATION_LOG (the guard honours it) instead of
/dev/termination-log; with FallbackToLogsOnError the tail of its output is used.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from guardedcron.devenv.admin_api import AdminApi, ApiError

NODE_NAME = "process-kubelet"
POLL_SECONDS = 0.3
MAX_GRACE_SECONDS = 5.0
TERMINATION_LOG_ENV = "GUARDEDCRON_TERMINATION_LOG"
# "$$" is an escaped "$"; "$(NAME)" a variable reference (Kubernetes' expansion syntax).
_VAR_REF = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_.-]*)\))")
_FIELD_KEY = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


@dataclass(frozen=True)
class Image:
    """What a container image would run, as host commands."""

    entrypoint: Sequence[str]
    cmd: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)


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
    """Runs one pod to the end, reporting status after every change."""

    def __init__(self, kubelet: ProcessKubelet, pod: Mapping[str, Any]) -> None:
        self.kubelet = kubelet
        self.pod = pod
        meta = pod["metadata"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"
        self.dir = Path(tempfile.mkdtemp(prefix=f"pod-{self.name}-", dir=kubelet.workdir))
        self.volumes = self._make_volumes()
        self.deleting = threading.Event()
        self.lock = threading.Lock()
        spec = pod["spec"]
        self.init_runs = [self._container_run(c) for c in spec.get("initContainers") or []]
        self.main_runs = [self._container_run(c) for c in spec.get("containers") or []]
        self.phase = "Pending"
        self.start_time = now_iso()
        self._main_done = False

    # --- setup -------------------------------------------------------------------
    def _make_volumes(self) -> dict[str, Path]:
        volumes: dict[str, Path] = {}
        for volume in self.pod["spec"].get("volumes") or []:
            host = self.dir / "volumes" / volume["name"]
            host.mkdir(parents=True)
            if "secret" in volume:
                self._project_secret(volume["secret"], host)
            volumes[volume["name"]] = host
        return volumes

    def _project_secret(self, source: Mapping[str, Any], host: Path) -> None:
        secret = self.kubelet.api.get(f"/api/v1/namespaces/{self.namespace}/secrets/{source['secretName']}")
        for key, value in (secret.get("data") or {}).items():
            (host / key).write_bytes(base64.b64decode(value))

    def _container_run(self, spec: Mapping[str, Any]) -> ContainerRun:
        return ContainerRun(
            name=spec["name"],
            spec=spec,
            log=self.dir / f"{spec['name']}.log",
            termination_file=self.dir / f"{spec['name']}.termination-log",
        )

    # --- environment, argv ----------------------------------------------------------
    def _mounts(self, spec: Mapping[str, Any]) -> list[tuple[str, Path]]:
        mounts = []
        for mount in spec.get("volumeMounts") or []:
            host = self.volumes.get(mount["name"])
            if host is None:
                raise RuntimeError(f"volume {mount['name']!r} is not defined in the pod")
            sub = mount.get("subPath")
            mounts.append((mount["mountPath"].rstrip("/"), host / sub if sub else host))
        # Longest first, so /a/b is rewritten before /a.
        return sorted(mounts, key=lambda m: len(m[0]), reverse=True)

    @staticmethod
    def _rewrite(value: str, mounts: list[tuple[str, Path]]) -> str:
        for mount_path, host in mounts:
            value = value.replace(mount_path, str(host))
        return value

    def _env(self, spec: Mapping[str, Any], image: Image) -> dict[str, str]:
        env: dict[str, str] = dict(image.env)
        for source in spec.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "secretRef" in source:
                data = self._secret_data(source["secretRef"]["name"])
            else:
                data = self._configmap_data(source["configMapRef"]["name"])
            env.update({prefix + k: v for k, v in data.items()})
        for item in spec.get("env") or []:
            if "value" in item:
                env[item["name"]] = _expand(item["value"], env)
            elif "valueFrom" in item:
                env[item["name"]] = self._value_from(item["valueFrom"])
        return env

    def _value_from(self, source: Mapping[str, Any]) -> str:
        if "fieldRef" in source:
            return self._field(source["fieldRef"]["fieldPath"])
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            return self._secret_data(ref["name"])[ref["key"]]
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            return self._configmap_data(ref["name"])[ref["key"]]
        raise RuntimeError(f"env source {sorted(source)} is not supported by the process-kubelet")

    def _field(self, path: str) -> str:
        meta = self.pod["metadata"]
        simple = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta.get("uid", ""),
            "spec.nodeName": self.kubelet.node_name,
            "spec.serviceAccountName": self.pod["spec"].get("serviceAccountName", ""),
            "status.podIP": "127.0.0.1",
            "status.hostIP": "127.0.0.1",
        }
        if path in simple:
            return str(simple[path])
        match = _FIELD_KEY.match(path)
        if match:
            return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
        raise RuntimeError(f"fieldRef {path!r} is not supported by the process-kubelet")

    def _secret_data(self, name: str) -> dict[str, str]:
        secret = self.kubelet.api.get(f"/api/v1/namespaces/{self.namespace}/secrets/{name}")
        return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}

    def _configmap_data(self, name: str) -> dict[str, str]:
        cm = self.kubelet.api.get(f"/api/v1/namespaces/{self.namespace}/configmaps/{name}")
        return dict(cm.get("data") or {})

    def _argv(self, spec: Mapping[str, Any], image: Image, env: Mapping[str, str]) -> list[str]:
        if spec.get("command"):
            argv = list(spec["command"]) + list(spec.get("args") or [])
        else:
            argv = list(image.entrypoint) + list(spec.get("args") or image.cmd)
        return [_expand(a, env) for a in argv]

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
        mounts = self._mounts(run.spec)
        env = {k: self._rewrite(v, mounts) for k, v in self._env(run.spec, image).items()}
        argv = [self._rewrite(a, mounts) for a in self._argv(run.spec, image, env)]
        full_env = {
            "PATH": self.kubelet.path,
            "HOME": str(self.dir),
            "HOSTNAME": self.name,
            TERMINATION_LOG_ENV: str(run.termination_file),
            **env,
        }
        log = run.log.open("ab")
        try:
            run.process = subprocess.Popen(
                argv,
                env=full_env,
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
                    run.last_terminated = self.finish(run, _exit_code(run.process.wait()))
                    run.restart_count += 1
                    run.process = None
                    self.report()
                    time.sleep(0.5)  # a short back-off
                    self.start(run)
                    self.report()
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


def _expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables are replaced, others left as
    written, and "$$" becomes "$" (how the builders protect literal names)."""

    def replace(match: re.Match[str]) -> str:
        if match.group(1) == "$":
            return "$"
        return env.get(match.group(2), match.group(0))

    return _VAR_REF.sub(replace, value)


def _exit_code(returncode: int) -> int:
    """A process killed by a signal reports 128 + signal, as in a container."""
    return 128 - returncode if returncode < 0 else returncode
