"""A real node runs pods the way a user's cluster does: the pod-lifecycle facts the guard
relies on (init container exit codes and termination messages, native sidecars stopped
after the main container, pods reaching the API server through its Service) shown on
containerd + runc + kubelet, not on the process stand-in."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from guardedcron_devenv.binaries import NodeBinaries, Paths
from guardedcron_devenv.controlplane import ControlPlane
from guardedcron_devenv.node import PodNetwork, RealNode, network_namespaces
from guardedcron_devenv.node_images import BUSYBOX_IMAGE, busybox_image
from tests.node.cluster import NODE_TEST_TIMEOUT_SECONDS, NodeCluster

pytestmark = [pytest.mark.node, pytest.mark.timeout(NODE_TEST_TIMEOUT_SECONDS)]

POD_FINISH_SECONDS = 120.0


def container(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
            "command": ["sh", "-c", script], **extra}  # fmt: skip


def run_pod(plane: ControlPlane, tmp_path: Path, name: str, spec: dict[str, Any],
            until: tuple[str, ...] = ("Succeeded", "Failed")) -> dict[str, Any]:
    """Create a pod and return it once its phase is one of `until` (default: finished)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
           "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False, **spec}}  # fmt: skip
    manifest = tmp_path / f"{name}.json"
    manifest.write_text(json.dumps(pod))
    plane.kubectl("apply", "-f", str(manifest))
    deadline = time.monotonic() + POD_FINISH_SECONDS
    while True:
        live: dict[str, Any] = plane.kubectl_json("get", "pod", name, "-n", "default")
        if live.get("status", {}).get("phase") in until:
            return live
        assert time.monotonic() < deadline, f"pod {name} did not reach {until}: {live.get('status')}"
        time.sleep(1)


def terminated(pod: dict[str, Any], name: str) -> dict[str, Any]:
    statuses = pod["status"].get("initContainerStatuses", []) + pod["status"]["containerStatuses"]
    [status] = [s for s in statuses if s["name"] == name]
    state: dict[str, Any] = status["state"]["terminated"]
    return state


def test_a_stopped_node_leaves_no_bridge_rules_cgroups_mounts_or_folders(
    node_binaries: tuple[Paths, NodeBinaries], tmp_path: Path
) -> None:
    """First in this file, before the tier's cluster starts: one real node per machine at a
    time, because kube-proxy's rules and the kubelet's cgroups are machine-wide."""
    plane_binaries, binaries = node_binaries
    silent = lambda line: None  # noqa: E731
    with (
        PodNetwork("gone", "10.213.9.0/24") as network,
        ControlPlane(plane_binaries, name="node-gone", progress=silent,
                     host_address=network.gateway) as plane,
    ):  # fmt: skip
        netns_before = network_namespaces()
        node = RealNode(plane, network, binaries, progress=silent)
        node.start()
        workdir = node.workdir
        node.import_image(busybox_image(BUSYBOX_IMAGE, ["/bin/sh"]))
        # Still running when the node stops: its sandbox (and network namespace) must go too.
        pod = run_pod(plane, tmp_path, "left-running", {"containers": [container("main", "sleep 3600")]},
                      until=("Running",))  # fmt: skip
        assert pod["status"]["phase"] == "Running"
        assert kube_chains(), "kube-proxy and the kubelet wrote no rules: the check below proves nothing"
        assert list(Path("/sys/fs/cgroup/memory").glob("kubepods*"))
        assert network_namespaces() - netns_before, "the pod's sandbox made no network namespace"
        node.stop()
        assert not workdir.exists()
        assert str(workdir) not in Path("/proc/self/mounts").read_text()
        assert kube_chains() == []
        assert list(Path("/sys/fs/cgroup/memory").glob("kubepods*")) == []
        assert network_namespaces() == netns_before, "a pod's network namespace was left behind"
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert network.bridge not in links


def test_the_gateway_keeps_its_mac_address_while_pods_come_and_go() -> None:
    """A running pod caches the gateway's MAC address. Were it to follow the bridge's
    lowest port, a pod with a lower one starting or stopping would cut every other pod
    off from the API server and PostgreSQL until its ARP entry expired."""
    def link(*args: str) -> None:
        subprocess.run(["ip", "link", *args], capture_output=True, text=True, check=True)

    with PodNetwork("mac", "10.213.8.0/24") as network:
        address = Path(f"/sys/class/net/{network.bridge}/address")
        before = address.read_text().strip()
        link("add", "gcj-mac-pod", "address", "00:00:00:00:00:01", "type", "veth",
             "peer", "name", "gcj-mac-peer")  # fmt: skip
        try:
            link("set", "gcj-mac-pod", "master", network.bridge, "up")
            assert address.read_text().strip() == before, "a port with a lower address took over the bridge's"
        finally:
            link("del", "gcj-mac-pod")
        assert address.read_text().strip() == before, "the bridge's address changed when a port left"


def kube_chains() -> list[str]:
    chains = []
    for family in ("iptables", "ip6tables"):
        saved = subprocess.run([f"{family}-save"], capture_output=True, text=True, check=True).stdout
        chains += [line for line in saved.splitlines() if "KUBE-" in line]
    return chains


def test_init_message_main_exit_code_and_sidecar_stop_are_the_kubelets(
    node_cluster: NodeCluster, tmp_path: Path
) -> None:
    pod = run_pod(node_cluster.plane, tmp_path, "lifecycle", {
        "initContainers": [
            container("init", 'printf \'{"outcome":"acquired"}\' > /dev/termination-log'),
            # A native sidecar: it keeps running until the kubelet stops it after the main
            # container ends; it exits 0 on SIGTERM, as `guardedcron keep` does.
            container("sidecar", "trap 'exit 0' TERM; sleep 3600 & wait", restartPolicy="Always"),
        ],
        "containers": [container("main", "exit 3")],
    })  # fmt: skip
    assert pod["status"]["phase"] == "Failed"
    init = terminated(pod, "init")
    assert (init["exitCode"], json.loads(init["message"])) == (0, {"outcome": "acquired"})
    assert terminated(pod, "main")["exitCode"] == 3
    sidecar = terminated(pod, "sidecar")
    assert sidecar["exitCode"] == 0, sidecar  # stopped by SIGTERM from the kubelet, not killed
    assert sidecar["finishedAt"] >= terminated(pod, "main")["finishedAt"]


def test_the_workload_waits_for_a_sidecars_startup_probe(
    node_cluster: NodeCluster, tmp_path: Path
) -> None:
    """What the keeper's startupProbe relies on: the kubelet starts the main container only
    once a native sidecar's startupProbe passes, so the keeper is ready for SIGTERM first."""
    shared = [{"name": "run", "mountPath": "/run/shared"}]
    pod = run_pod(node_cluster.plane, tmp_path, "probed-sidecar", {
        "volumes": [{"name": "run", "emptyDir": {}}],
        "initContainers": [
            container("sidecar", "sleep 4; touch /run/shared/ready; trap 'exit 0' TERM; "
                      "sleep 3600 & wait", restartPolicy="Always", volumeMounts=shared,
                      startupProbe={"exec": {"command": ["test", "-e", "/run/shared/ready"]},
                                    "periodSeconds": 1, "failureThreshold": 60}),
        ],
        "containers": [container("main", "test -e /run/shared/ready", volumeMounts=shared)],
    })  # fmt: skip
    assert terminated(pod, "main")["exitCode"] == 0, pod["status"]
    assert terminated(pod, "sidecar")["exitCode"] == 0
    assert pod["status"]["phase"] == "Succeeded"


def test_a_failing_init_container_stops_the_pod_before_its_workload(
    node_cluster: NodeCluster, tmp_path: Path
) -> None:
    pod = run_pod(node_cluster.plane, tmp_path, "guard-says-no", {
        "initContainers": [container("init", "echo held-by-another > /dev/termination-log; exit 75")],
        "containers": [container("main", "echo the work ran")],
    })  # fmt: skip
    assert pod["status"]["phase"] == "Failed"
    init = terminated(pod, "init")
    assert (init["exitCode"], init["message"].strip()) == (75, "held-by-another")
    [main] = pod["status"]["containerStatuses"]
    assert "terminated" not in main["state"] or main["state"]["terminated"].get("exitCode") != 0
    assert "running" not in main["state"]


def test_pods_reach_the_api_server_through_its_service(
    node_cluster: NodeCluster, tmp_path: Path
) -> None:
    """kube-proxy routes the `kubernetes` Service (the in-cluster configuration's address)."""
    service = node_cluster.plane.kubectl_json("get", "service", "kubernetes", "-n", "default")
    address = service["spec"]["clusterIP"]
    pod = run_pod(node_cluster.plane, tmp_path, "in-cluster", {
        "containers": [container("main", f"nc -w 10 {address} 443 </dev/null && echo reached")],
    })  # fmt: skip
    logs = node_cluster.plane.kubectl("logs", "in-cluster", "-n", "default").stdout
    assert pod["status"]["phase"] == "Succeeded", logs
    assert "reached" in logs


