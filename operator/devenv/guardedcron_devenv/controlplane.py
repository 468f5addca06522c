"""A real, throwaway Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager.

The binaries come from `binaries.ensure_binaries()`. There is no kubelet and no
scheduler: pods are created by the real Job controller and stay Pending until a test
harness binds and runs them. Every instance takes its own free loopback ports, CA and
temp folder, so several can run at once (the e2e suite runs two clusters against one
database).

    with ControlPlane(name="a") as cluster:
        cluster.kubectl("get", "namespaces")
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import yaml

from guardedcron_devenv.binaries import Paths, Progress, ensure_binaries
from guardedcron_devenv.pki import ControlPlanePki, KeyPair, make_pki

LOOPBACK: Final = "127.0.0.1"
# The service range is configuration only: with no kube-proxy, nothing routes to it.
SERVICE_CLUSTER_IP_RANGE: Final = "10.0.0.0/24"
KUBERNETES_SERVICE_IP: Final = "10.0.0.1"
SERVICE_ACCOUNT_ISSUER: Final = "https://kubernetes.default.svc.cluster.local"

# The controllers the operator relies on, and nothing that needs a kubelet or a cloud
# (the node-lifecycle controller, for one, would evict pods from a kubelet stand-in).
CONTROLLERS: Final = (
    "cronjob-controller",
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "ttl-after-finished-controller",
)

# With a real node: Services route to pods (endpoints), the chart's Deployment makes
# ReplicaSets and pods, finished pods of deleted owners are collected, and the node
# lifecycle controller lifts the not-ready taint a kubelet registers with; resource
# quotas are counted.
NODE_CONTROLLERS: Final = (
    "node-lifecycle-controller",
    "endpointslice-controller",
    "endpoints-controller",
    "deployment-controller",
    "replicaset-controller",
    "pod-garbage-collector-controller",
    "resourcequota-controller",
)

STOP_GRACE_SECONDS: Final = 10.0
POLL_INTERVAL_SECONDS: Final = 0.25
LOG_TAIL_LINES: Final = 40
PR_SET_PDEATHSIG: Final = 1


class ControlPlaneError(RuntimeError):
    """The control plane did not start or a process died; the message carries log tails."""


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message carries its arguments and stderr."""

    def __init__(self, args: tuple[str, ...], result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(
            f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}"
        )
        self.result = result


def free_port() -> int:
    """A loopback port nobody listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


def build_etcd_args(
    etcd: Path, data_dir: Path, client_port: int, peer_port: int, name: str
) -> list[str]:
    client_url = f"http://{LOOPBACK}:{client_port}"
    peer_url = f"http://{LOOPBACK}:{peer_port}"
    return [
        str(etcd),
        f"--name={name}",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster={name}={peer_url}",
        "--initial-cluster-state=new",
        # Throwaway data on a shared, busy disk: durability buys nothing, fsync costs a lot.
        "--unsafe-no-fsync",
    ]


def build_apiserver_args(
    apiserver: Path, pki: ControlPlanePki, etcd_url: str, port: int, cert_dir: Path,
    host_address: str = LOOPBACK,
) -> list[str]:
    if host_address == LOOPBACK:
        # The service's endpoint would be 127.0.0.1, which Endpoints validation refuses
        # every 10 s; without a node, nothing routes service traffic anyway.
        services = ["--endpoint-reconciler-type=none"]
    else:
        # A real node: kube-proxy routes kubernetes.default.svc to this address, and the
        # API server reaches the kubelet (logs, exec) with the admin's certificate.
        services = [f"--kubelet-client-certificate={pki.admin.cert}",
                    f"--kubelet-client-key={pki.admin.key}",
                    "--kubelet-preferred-address-types=InternalIP"]
    return [
        str(apiserver),
        f"--etcd-servers={etcd_url}",
        f"--bind-address={host_address}",
        f"--advertise-address={host_address}",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={pki.apiserver.cert}",
        f"--tls-private-key-file={pki.apiserver.key}",
        f"--client-ca-file={pki.ca.cert}",
        f"--service-account-key-file={pki.service_account_public_key}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--authorization-mode=Node,RBAC",
        *services,
        "--allow-privileged=true",
        "--profiling=false",
    ]


def build_controller_manager_args(
    controller_manager: Path, pki: ControlPlanePki, kubeconfig: Path, port: int, cert_dir: Path,
    controllers: tuple[str, ...] = CONTROLLERS,
) -> list[str]:
    return [
        str(controller_manager),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        # No front proxy here: do not wait for its request-header CA in the cluster.
        "--authentication-skip-lookup=true",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        "--leader-elect=false",
        f"--controllers={','.join(controllers)}",
        # Each controller acts as its own service account, so RBAC is exercised as in a
        # real cluster.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki.service_account_key}",
        f"--root-ca-file={pki.ca.cert}",
        "--profiling=false",
    ]


def _inline(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def build_client_cert_credentials(client: KeyPair) -> dict[str, str]:
    return {
        "client-certificate-data": _inline(client.cert),
        "client-key-data": _inline(client.key),
    }


def build_kubeconfig(
    server: str, ca: Path, credentials: dict[str, str], cluster: str, user: str
) -> str:
    """A self-contained kubeconfig (certificates inlined), so any client can read it alone.

    `credentials` is the kubeconfig's user entry: client-certificate data or {"token": ...}.
    """
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {"server": server, "certificate-authority-data": _inline(ca)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
    }
    return yaml.safe_dump(config, sort_keys=False)


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the Python process dies without tearing down."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager on free loopback ports.

    Attributes, valid between start() and stop():
      server: the API server's URL, e.g. https://127.0.0.1:41234
      kubeconfig: path of an admin kubeconfig (certificates inlined)
      ca_file, admin_cert_file, admin_key_file: the admin's TLS material as files
      etcd_url: etcd's client URL
      service_account_issuer: the issuer in service-account tokens
      workdir: the instance's temp folder (removed by stop())
      logs_dir: one <process>.log per process (kept if given to the constructor)
    """

    def __init__(
        self,
        binaries: Paths | None = None,
        *,
        name: str = "local",
        logs_dir: Path | None = None,
        startup_timeout: float = 180.0,
        progress: Progress = print,
        host_address: str = LOOPBACK,
        zoneinfo: Path | None = None,
    ) -> None:
        self.name = name
        # Go reads time zones from $ZONEINFO first (a folder of TZif files), then the
        # system's: a test can give the API server (which checks CronJob.timeZone) and
        # the CronJob controller a zone of its own, e.g. one whose clock changes soon.
        self.zoneinfo = zoneinfo
        # LOOPBACK, or the gateway address of a PodNetwork when a real node joins.
        self.host_address = host_address
        self.startup_timeout = startup_timeout
        self.service_account_issuer = SERVICE_ACCOUNT_ISSUER
        self._binaries = binaries
        self._progress = progress
        self._given_logs_dir = logs_dir
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._args: dict[str, list[str]] = {}  # each part's command, to start it again
        self._workdir: Path | None = None
        self._pki: ControlPlanePki | None = None
        self._tls: ssl.SSLContext | None = None
        self.server = ""
        self.etcd_url = ""

    # --- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start all three processes and return once the cluster serves requests."""
        if self._workdir is not None:
            raise ControlPlaneError(f"control plane {self.name!r} is already started")
        binaries = self._binaries or ensure_binaries(self._progress)
        self._workdir = Path(tempfile.mkdtemp(prefix=f"guardedcron-cp-{self.name}-"))
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_processes(binaries, self._workdir)
        except BaseException:
            # Startup failures (and Ctrl-C) must not leak processes or folders.
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the processes (newest first) by process group, then remove the temp folder."""
        for name in reversed(list(self._processes)):
            stop_process_group(self._processes.pop(name))
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self._pki = None
        self._tls = None

    # --- what tests use --------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise ControlPlaneError(f"control plane {self.name!r} is not running")
        return self._workdir

    @property
    def logs_dir(self) -> Path:
        return self._given_logs_dir or self.workdir / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self._require_pki().ca.cert

    @property
    def admin_cert_file(self) -> Path:
        return self._require_pki().admin.cert

    @property
    def admin_key_file(self) -> Path:
        return self._require_pki().admin.key

    @property
    def kubectl_path(self) -> Path:
        return self._require_binaries().kubectl

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl as the admin of this cluster."""
        command = [str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            command, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise KubectlError(args, result)
        return result

    def wait_established(self, crd: str, timeout: float = 60.0) -> None:
        """Wait until the CustomResourceDefinition named `crd` is Established. Polled, not
        `kubectl wait`: kubectl 1.35 fails at once ("accessor error: <nil>") when it reads
        a CRD whose status has no conditions yet, as one applied a moment ago may."""
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"
        deadline = time.monotonic() + timeout
        while True:
            try:
                conditions = (json.loads(self._get_text(path)).get("status") or {}).get("conditions") or []
            except urllib.error.HTTPError as error:
                if error.code != 404:
                    raise
                conditions = []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {crd} not Established after {timeout:.0f} s")
            time.sleep(0.2)

    def kubectl_json(self, *args: str) -> Any:
        """`kubectl <args> -o json`, parsed."""
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def get_json(self, path: str) -> Any:
        """GET an API path as the admin, e.g. /api/v1/namespaces/default; raises HTTPError."""
        return json.loads(self._get_text(path))

    def write_token_kubeconfig(self, path: Path, token: str, user: str = "token-user") -> Path:
        """Write a kubeconfig that authenticates with `token` (e.g. a service account's).

        The operator's e2e runs it this way, so the chart's RBAC is what it is allowed.
        """
        path.write_text(
            build_kubeconfig(self.server, self.ca_file, {"token": token}, self.name, user)
        )
        path.chmod(0o600)
        return path

    def logs_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of each process's log, for printing when something failed."""
        parts = []
        for log in sorted(self.logs_dir.glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"----- {log} (last {len(text)} lines)\n" + "\n".join(text))
        return "\n".join(parts)

    # --- internals -------------------------------------------------------------------

    @property
    def pki(self) -> ControlPlanePki:
        return self._require_pki()

    def _require_pki(self) -> ControlPlanePki:
        if self._pki is None:
            raise ControlPlaneError(f"control plane {self.name!r} is not running")
        return self._pki

    def _require_binaries(self) -> Paths:
        if self._binaries is None:
            raise ControlPlaneError(f"control plane {self.name!r} is not running")
        return self._binaries

    def _start_processes(self, binaries: Paths, workdir: Path) -> None:
        self._binaries = binaries
        started = time.monotonic()
        self._pki = pki = make_pki(
            workdir / "pki", self.name, KUBERNETES_SERVICE_IP, extra_ips=(self.host_address,)
        )

        client_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://{LOOPBACK}:{client_port}"
        self._spawn(
            "etcd",
            build_etcd_args(binaries.etcd, workdir / "etcd", client_port, peer_port, self.name),
        )
        self._wait_until("etcd is healthy", self._etcd_healthy)

        apiserver_port = free_port()
        self.server = f"https://{self.host_address}:{apiserver_port}"
        self.kubeconfig.write_text(
            build_kubeconfig(
                self.server, pki.ca.cert, build_client_cert_credentials(pki.admin), self.name,
                "admin",
            )
        )
        self._spawn(
            "kube-apiserver",
            build_apiserver_args(
                binaries.kube_apiserver, pki, self.etcd_url, apiserver_port, workdir / "apiserver",
                self.host_address,
            ),
        )
        self._wait_until("kube-apiserver answers /readyz", lambda: self._ok("/readyz"))

        kcm_kubeconfig = workdir / "kcm.kubeconfig"
        kcm_kubeconfig.write_text(
            build_kubeconfig(
                self.server,
                pki.ca.cert,
                build_client_cert_credentials(pki.controller_manager),
                self.name,
                "system:kube-controller-manager",
            )
        )
        self._spawn(
            "kube-controller-manager",
            build_controller_manager_args(
                binaries.kube_controller_manager, pki, kcm_kubeconfig, free_port(), workdir / "kcm",
                CONTROLLERS if self.host_address == LOOPBACK else CONTROLLERS + NODE_CONTROLLERS,
            ),
        )
        # The service-account controller creating "default" proves the controllers run;
        # pods (and so Jobs) cannot be created in a namespace before it exists.
        self._wait_until(
            "the default service account exists",
            lambda: self._ok("/api/v1/namespaces/default/serviceaccounts/default"),
        )
        self._progress(
            f"guardedcron: control plane {self.name!r} ready at {self.server} "
            f"in {time.monotonic() - started:.1f} s"
        )

    def stop_part(self, name: str) -> None:
        """Stop one part, e.g. "kube-controller-manager", as an outage would (its process
        group gets SIGTERM, then SIGKILL); `start_part` starts it again as it was."""
        stop_process_group(self._processes.pop(name))

    def start_part(self, name: str) -> None:
        """Start a part `stop_part` stopped, with the arguments it first had."""
        if name in self._processes:
            raise ControlPlaneError(f"{name} of control plane {self.name!r} is running")
        self._spawn(name, self._args[name])

    def _spawn(self, name: str, args: list[str]) -> None:
        self._args[name] = args
        env = None
        if self.zoneinfo is not None and name in ("kube-apiserver", "kube-controller-manager"):
            env = {**os.environ, "ZONEINFO": str(self.zoneinfo)}
        self._processes[name] = spawn_logged(args, self.logs_dir / f"{name}.log", env=env)

    def _wait_until(self, what: str, ready: Callable[[], bool]) -> None:
        wait_for_parts(what, ready, self._processes, self.startup_timeout, POLL_INTERVAL_SECONDS,
                       lambda message, _part: ControlPlaneError(f"{message}\n{self.logs_tail()}"))

    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def _ok(self, path: str) -> bool:
        try:
            self._get_text(path)
        except OSError:
            return False
        return True

    def _get_text(self, path: str) -> str:
        if self._tls is None:
            pki = self._require_pki()
            self._tls = ssl.create_default_context(cafile=str(pki.ca.cert))
            self._tls.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))
        with urllib.request.urlopen(self.server + path, context=self._tls, timeout=5) as response:
            return str(response.read().decode())


def wait_for_parts(
    what: str,
    ready: Callable[[], bool],
    processes: Mapping[str, subprocess.Popen[bytes]],
    timeout: float,
    interval: float,
    error: Callable[[str, str | None], Exception],
) -> None:
    """Poll `ready` until it holds, at most `timeout` seconds; a part that exits meanwhile
    fails at once. `error(message, part)` makes the exception (`part`: the one that exited)."""
    deadline = time.monotonic() + timeout
    while True:
        for name, process in processes.items():
            if process.poll() is not None:
                raise error(f"{name} exited with {process.returncode} while waiting until {what}", name)
        if ready():
            return
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:.0f} s waiting until {what}", None)
        time.sleep(interval)


def spawn_logged(args: list[str], log_path: Path, *, env: Mapping[str, str] | None = None
                 ) -> subprocess.Popen[bytes]:
    """Start a long-running part in its own process group, its output appended to log_path
    (with `env` as its whole environment when given, else this process's)."""
    # The parent-death signal fires when the spawning *thread* ends, so it is only
    # safe from the main thread; from a worker thread, stop() is the only clean-up.
    on_main_thread = threading.current_thread() is threading.main_thread()
    with log_path.open("ab") as log:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group, killed as a whole
            preexec_fn=_die_with_parent if on_main_thread else None,
        )


def stop_process_group(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        process.wait()
