"""A real Kubernetes node on this machine, for a `ControlPlane`.

Parts, each a real program: a containerd instance of our own (Debian's containerd with its
CRI plugin, its own root, state and socket, so Docker's containerd is untouched), runc,
the CNI bridge and host-local plugins (Debian's containernetworking-plugins), and kubelet,
kube-scheduler and kube-proxy built from the same k8s.io/kubernetes module as the API
server. Images arrive by import into containerd; no registry is involved.

Networking stays on this machine. `PodNetwork` creates a Linux bridge with the pod
subnet's gateway address before the control plane starts; the API server listens on that
address (and so does anything pods must reach, such as the test PostgreSQL), so pods reach
it directly and through `kubernetes.default.svc`, which kube-proxy (iptables mode) routes.

This machine runs cgroup v1 and lacks CAP_SYS_RESOURCE, hence `failCgroupV1: false` for
the kubelet and `restrict_oom_score_adj` for containerd (without it runc cannot lower a
sandbox's oom_score_adj and every pod sandbox fails).
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import yaml

from guardedcron_devenv.binaries import NodeBinaries, Progress
from guardedcron_devenv.controlplane import (
    ControlPlane,
    KubectlError,
    build_client_cert_credentials,
    build_kubeconfig,
    free_port,
    spawn_logged,
    stop_process_group,
    wait_for_parts,
)
from guardedcron_devenv.node_images import (
    PAUSE_COMMAND,
    PAUSE_IMAGE,
    busybox_image,
    find_ctr,
    import_image,
    import_saved_image,
)

CNI_BIN_DIR: Final = Path("/usr/lib/cni")
CGROUP_ROOT: Final = Path("/sys/fs/cgroup")
# Where containerd's CRI plugin pins each pod sandbox's network namespace.
NETNS_DIR: Final = Path("/var/run/netns")
KUBELET_CGROUP: Final = "kubepods"  # the kubelet's cgroup root for pods (cgroupfs driver)
POLL_INTERVAL_SECONDS: Final = 0.5
# Linux caps interface names at 15 characters.
INTERFACE_NAME_MAX: Final = 15


class NodeError(RuntimeError):
    """The node could not start or stop; the message names the part and its log."""


class PodNetwork:
    """A bridge carrying the pod subnet; its gateway address is this machine's address on it."""

    def __init__(self, name: str, subnet: str) -> None:
        self.subnet = ipaddress.ip_network(subnet)
        self.bridge = f"gcj-{name}"
        if len(self.bridge) > INTERFACE_NAME_MAX:
            raise NodeError(f"network name {name!r} is too long for a bridge name (at most 11 characters)")
        self.gateway = str(next(self.subnet.hosts()))
        # A bridge without an address of its own takes the lowest of its ports' addresses,
        # so the gateway's MAC changes whenever a pod with a lower one comes or goes, and
        # every running pod's cached gateway address then points nowhere until its ARP
        # entry expires (tens of seconds of lost packets to the API server and PostgreSQL).
        # A fixed, locally administered address keeps it; derived from the name, so two
        # networks on one machine never share one.
        digest = hashlib.sha256(self.bridge.encode()).digest()
        self.mac = ":".join(f"{byte:02x}" for byte in (0x02, *digest[:5]))

    def __enter__(self) -> PodNetwork:
        self.create()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.delete()

    def create(self) -> None:
        # A bridge of this name is ours, left by an interrupted run: start clean.
        self.delete()
        prefix = self.subnet.prefixlen
        for command in (
            ["ip", "link", "add", self.bridge, "address", self.mac, "type", "bridge"],
            ["ip", "addr", "add", f"{self.gateway}/{prefix}", "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
        ):
            _run(command, f"creating bridge {self.bridge}")

    def delete(self) -> None:
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)

    def cni_config(self, ipam_dir: Path) -> dict[str, Any]:
        return {
            "cniVersion": "0.4.0",
            "name": f"guardedcron-{self.bridge}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(self.subnet), "gateway": self.gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(ipam_dir),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }


def build_containerd_config(root: Path, cni_conf_dir: Path) -> str:
    """containerd 1.6's configuration (version 2) for a CRI instance of our own."""
    return "\n".join(
        [
            "version = 2",
            f'root = "{root / "root"}"',
            f'state = "{root / "state"}"',
            "[grpc]",
            f'  address = "{root / "containerd.sock"}"',
            "[ttrpc]",
            f'  address = "{root / "containerd.sock.ttrpc"}"',
            '[plugins."io.containerd.grpc.v1.cri"]',
            f'  sandbox_image = "{PAUSE_IMAGE}"',
            "  restrict_oom_score_adj = true",
            "  disable_apparmor = true",
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            '  [plugins."io.containerd.grpc.v1.cri".cni]',
            f'    bin_dir = "{CNI_BIN_DIR}"',
            f'    conf_dir = "{cni_conf_dir}"',
            '  [plugins."io.containerd.grpc.v1.cri".containerd]',
            '    snapshotter = "overlayfs"',
            '    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]',
            '      runtime_type = "io.containerd.runc.v2"',
            "",
        ]
    )


def build_kubelet_config(
    *, address: str, port: int, healthz_port: int, ca_file: Path, runtime_socket: Path
) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # this machine runs cgroup v1
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        # A busy shared disk must not evict test pods.
        "evictionHard": {
            "memory.available": "1Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "resolvConf": "",
    }  # fmt: skip


def build_kube_proxy_config(*, kubeconfig: Path, node: str, pod_subnet: str, node_port_cidr: str,
                            metrics_port: int, healthz_port: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node,
        "clusterCIDR": pod_subnet,
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        # Leave the machine's conntrack table sizes alone (we may not set them anyway), and
        # its route_localnet sysctl: node ports only on the pod bridge's address.
        "conntrack": {"maxPerCore": 0, "min": 0},
        "iptables": {"localhostNodePorts": False},
        "nodePortAddresses": [node_port_cidr],
    }


class RealNode:
    """containerd + kubelet + kube-proxy + kube-scheduler for one control plane.

    The control plane must have been started with `host_address=network.gateway`.
    Attributes, valid between start() and stop(): name, runtime_socket, workdir.
    """

    def __init__(
        self,
        control_plane: ControlPlane,
        network: PodNetwork,
        binaries: NodeBinaries,
        *,
        name: str | None = None,
        logs_dir: Path | None = None,
        startup_timeout: float = 180.0,
        progress: Progress = print,
    ) -> None:
        self.control_plane = control_plane
        self.network = network
        self.binaries = binaries
        self.name = name or f"node-{control_plane.name}"
        self.startup_timeout = startup_timeout
        self._progress = progress
        self._given_logs_dir = logs_dir
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._workdir: Path | None = None
        self._netns_before: frozenset[str] = frozenset()
        self._ctr = find_ctr()

    def __enter__(self) -> RealNode:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise NodeError(f"node {self.name!r} is not running")
        return self._workdir

    @property
    def logs_dir(self) -> Path:
        return self._given_logs_dir or self.workdir / "logs"

    @property
    def runtime_socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    def start(self) -> None:
        if self._workdir is not None:
            raise NodeError(f"node {self.name!r} is already started")
        for program in ("containerd", "runc"):
            if shutil.which(program) is None:
                raise NodeError(f"{program} is not on PATH: it comes with Debian's docker.io package")
        if not (CNI_BIN_DIR / "bridge").is_file():
            raise NodeError(f"{CNI_BIN_DIR}/bridge is missing: install containernetworking-plugins")
        self._workdir = Path(tempfile.mkdtemp(prefix=f"guardedcron-{self.name}-"))
        self._netns_before = network_namespaces()
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_processes()
        except BaseException:
            self.stop()
            raise

    def import_image(self, archive: bytes) -> None:
        import_image(self._ctr, str(self.runtime_socket), archive)

    def import_saved_image(self, save_command: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        """Import what `save_command` writes, e.g. `docker save guardedcron:0.1.0`."""
        import_saved_image(self._ctr, str(self.runtime_socket), save_command, env)

    def stop(self) -> None:
        """Stop every part and remove what it left: containers, mounts, iptables rules, folders."""
        if self._workdir is None:
            return
        for name in ("kube-proxy", "kube-scheduler", "kubelet"):
            process = self._processes.pop(name, None)
            if process is not None:
                stop_process_group(process)
        if "containerd" in self._processes:
            self._remove_containers()
            stop_process_group(self._processes.pop("containerd"))
        # Killing the sandboxes through containerd skips the CNI teardown: their network
        # namespaces (and the veth pairs in them) stay unless removed here.
        for namespace in sorted(network_namespaces() - self._netns_before):
            subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, timeout=30, check=False)
        self._cleanup_kube_proxy_rules()
        remove_kubelet_cgroups()
        _unmount_below(self._workdir)
        shutil.rmtree(self._workdir, ignore_errors=True)
        self._workdir = None

    # --- start-up ----------------------------------------------------------------------

    def _start_processes(self) -> None:
        started = time.monotonic()
        plane = self.control_plane
        work = self.workdir
        containerd_dir = work / "containerd"
        cni_dir = work / "cni"
        cni_dir.mkdir(parents=True)
        (cni_dir / "10-guardedcron.conflist").write_text(
            json.dumps(self.network.cni_config(work / "ipam"), indent=2)
        )
        containerd_dir.mkdir()
        config = containerd_dir / "config.toml"
        config.write_text(build_containerd_config(containerd_dir, cni_dir))
        self._spawn("containerd", ["containerd", "--config", str(config)])
        self._wait_until("containerd answers on its socket", self._containerd_ready)
        self.import_image(busybox_image(PAUSE_IMAGE, PAUSE_COMMAND))

        kubeconfig = work / "node.kubeconfig"
        pki = plane.pki
        kubeconfig.write_text(
            build_kubeconfig(plane.server, pki.ca.cert, build_client_cert_credentials(pki.admin),
                             plane.name, "admin")
        )  # fmt: skip
        kubelet_config = work / "kubelet.yaml"
        kubelet_config.write_text(yaml.safe_dump(build_kubelet_config(
            address=self.network.gateway, port=free_port(), healthz_port=free_port(),
            ca_file=pki.ca.cert, runtime_socket=self.runtime_socket,
        )))  # fmt: skip
        self._spawn("kubelet", [
            str(self.binaries.kubelet), f"--config={kubelet_config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={work / 'kubelet'}", f"--cert-dir={work / 'kubelet-pki'}",
            f"--hostname-override={self.name}", f"--node-ip={self.network.gateway}",
        ])  # fmt: skip
        self._spawn("kube-scheduler", [
            str(self.binaries.kube_scheduler), f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--authentication-skip-lookup=true", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            f"--cert-dir={work / 'scheduler'}",
        ])  # fmt: skip
        proxy_config = work / "kube-proxy.yaml"
        proxy_config.write_text(yaml.safe_dump(build_kube_proxy_config(
            kubeconfig=kubeconfig, node=self.name, pod_subnet=str(self.network.subnet),
            node_port_cidr=f"{self.network.gateway}/32", metrics_port=free_port(), healthz_port=free_port(),
        )))  # fmt: skip
        self._spawn("kube-proxy", [str(self.binaries.kube_proxy), f"--config={proxy_config}"])
        self._wait_until(f"node {self.name} is Ready", self._node_ready)
        self._progress(
            f"guardedcron: node {self.name!r} Ready in {time.monotonic() - started:.1f} s"
        )

    def _spawn(self, name: str, args: list[str]) -> None:
        self._processes[name] = spawn_logged(args, self.logs_dir / f"{name}.log")

    def _wait_until(self, what: str, ready: Callable[[], bool]) -> None:
        def error(message: str, part: str | None) -> NodeError:
            tails = [part] if part is not None else list(self._processes)
            return NodeError("\n".join([message, *(self.logs_tail(name) for name in tails)]))

        wait_for_parts(what, ready, self._processes, self.startup_timeout, POLL_INTERVAL_SECONDS, error)

    def logs_tail(self, name: str, lines: int = 30) -> str:
        path = self.logs_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.is_file() else ""
        return f"--- {name} ({path}) ---\n" + "\n".join(text.splitlines()[-lines:])

    def _containerd_ready(self) -> bool:
        result = subprocess.run(
            [self._ctr, "--address", str(self.runtime_socket), "version"],
            capture_output=True, timeout=10, check=False,
        )  # fmt: skip
        return result.returncode == 0

    def _node_ready(self) -> bool:
        try:
            node = self.control_plane.kubectl_json("get", "node", self.name)
        except (KubectlError, ValueError):  # not registered yet
            return False
        conditions = node.get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    # --- clean-up ----------------------------------------------------------------------

    def _remove_containers(self) -> None:
        """Kill and delete every container of the node (sandboxes included)."""
        address = str(self.runtime_socket)
        listed = subprocess.run(
            [self._ctr, "--address", address, "-n", "k8s.io", "containers", "list", "-q"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        for container in listed.stdout.split():
            base = [self._ctr, "--address", address, "-n", "k8s.io"]
            for command in (
                [*base, "tasks", "kill", "--signal", "SIGKILL", container],
                [*base, "tasks", "delete", "--force", container],
                [*base, "containers", "delete", container],
            ):
                subprocess.run(command, capture_output=True, timeout=30, check=False)

    def _cleanup_kube_proxy_rules(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                [str(self.binaries.kube_proxy), "--cleanup"],
                capture_output=True, timeout=60, check=False,
            )  # fmt: skip
        # kube-proxy's clean-up leaves the kubelet's own chains (KUBE-FIREWALL and canaries).
        for family in ("iptables", "ip6tables"):
            for table in ("filter", "nat", "mangle"):
                remove_kube_chains(family, table)


def build_kube_chain_removal(saved: str) -> str:
    """An iptables-restore --noflush script deleting every KUBE-* chain and each jump to one.

    `saved` is `iptables-save -t TABLE` output; nothing else in the table is touched.
    """
    table = ""
    deletes: list[str] = []
    chains: list[str] = []
    for line in saved.splitlines():
        if line.startswith("*"):
            table = line
        elif line.startswith(":KUBE-"):
            chains.append(line[1:].split()[0])
        elif line.startswith("-A ") and " -j KUBE-" in line and not line.startswith("-A KUBE-"):
            deletes.append("-D " + line[3:])
    if not table or not chains:
        return ""
    flushes = [f"-F {chain}" for chain in chains]
    removals = [f"-X {chain}" for chain in chains]
    return "\n".join([table, *deletes, *flushes, *removals, "COMMIT", ""])


def remove_kube_chains(family: str, table: str) -> None:
    saved = subprocess.run(
        [f"{family}-save", "-t", table], capture_output=True, text=True, timeout=30, check=False
    )
    script = build_kube_chain_removal(saved.stdout) if saved.returncode == 0 else ""
    if script:
        subprocess.run(
            [f"{family}-restore", "--noflush"], input=script, capture_output=True, text=True,
            timeout=30, check=False,
        )  # fmt: skip


def network_namespaces() -> frozenset[str]:
    """The CNI network namespaces pinned on this machine now."""
    if not NETNS_DIR.is_dir():
        return frozenset()
    return frozenset(p.name for p in NETNS_DIR.iterdir() if p.name.startswith("cni-"))


def remove_kubelet_cgroups(root: Path = CGROUP_ROOT) -> None:
    """Remove the kubelet's (now empty) `kubepods` cgroups from every v1 hierarchy, deepest
    first; a cgroup that still holds a process stays, and so does everything else."""
    for hierarchy in root.iterdir():
        top = hierarchy / KUBELET_CGROUP
        if not top.is_dir() or top.is_symlink():
            continue
        for group in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                            reverse=True):  # fmt: skip
            with contextlib.suppress(OSError):
                group.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _unmount_below(folder: Path) -> None:
    """Lazily unmount whatever the node mounted under its folder (overlays, shm, volumes)."""
    prefix = str(folder.resolve()) + "/"
    with open("/proc/self/mounts") as mounts:
        targets = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for target in sorted(targets, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        raise NodeError(f"{what}: {' '.join(command)} failed: {result.stderr.strip()}")


