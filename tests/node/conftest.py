"""Fixtures for the node tier: a control plane with a real node (containerd, runc, CNI,
kubelet, kube-scheduler, kube-proxy), all real programs on this machine.

The Go-built binaries are built (or found in the cache) right after collection, outside
any test's timeout; a build failure is kept and raised by the fixtures, so every node
test fails with it: never a skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from guardedcron_devenv.binaries import NodeBinaries, Paths, ensure_binaries, ensure_node_binaries
from guardedcron_devenv.controlplane import ControlPlane
from guardedcron_devenv.docker_engine import DockerEngine, ensure_engine
from guardedcron_devenv.image import BuiltImage, default_tag, ensure_image
from guardedcron_devenv.node import PodNetwork, RealNode
from guardedcron_devenv.node_images import BUSYBOX_IMAGE, busybox_image
from tests.node.cluster import POD_SUBNET, NodeCluster
from tests.support import REPO

_build: dict[str, tuple[Paths, NodeBinaries] | BaseException] = {}
_started: dict[str, NodeCluster] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    if not any(item.get_closest_marker("node") for item in session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")

    def progress(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)

    try:
        _build["binaries"] = (ensure_binaries(progress), ensure_node_binaries(progress))
    except Exception as error:  # reported by every node test through the fixture below
        _build["binaries"] = error


@pytest.fixture(scope="session")
def node_binaries() -> tuple[Paths, NodeBinaries]:
    built = _build.get("binaries")
    if built is None:  # collected without the hook having run, e.g. one test by node id
        built = (ensure_binaries(), ensure_node_binaries())
    if isinstance(built, BaseException):
        raise built
    return built


@pytest.fixture(scope="session")
def node_cluster(
    node_binaries: tuple[Paths, NodeBinaries], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeCluster]:
    """One cluster with one real node for the whole tier, as the issue asks (not one per test)."""
    plane_binaries, binaries = node_binaries
    logs = tmp_path_factory.mktemp("node-cluster-logs")
    silent = lambda line: None  # noqa: E731
    with (
        PodNetwork("tier", POD_SUBNET) as network,
        ControlPlane(plane_binaries, name="node-tier", logs_dir=logs, progress=silent,
                     host_address=network.gateway) as plane,
        RealNode(plane, network, binaries, logs_dir=logs, progress=silent) as node,
    ):  # fmt: skip
        node.import_image(busybox_image(BUSYBOX_IMAGE, ["/bin/sh"]))
        _started["cluster"] = cluster = NodeCluster(network, plane, node)
        try:
            yield cluster
        finally:
            _started.pop("cluster", None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and item.get_closest_marker("node"):
        cluster = _started.get("cluster")
        if cluster is not None:
            report.sections.append(("control plane logs", cluster.plane.logs_tail()))
            for part in ("containerd", "kubelet", "kube-scheduler", "kube-proxy"):
                report.sections.append((f"{part} log", cluster.node.logs_tail(part)))
    return report


@pytest.fixture(scope="session")
def docker_engine() -> DockerEngine:
    """The machine's engine, started if none answers; no engine is an error, never a skip."""
    return ensure_engine()


@pytest.fixture(scope="session")
def node_image(docker_engine: DockerEngine) -> BuiltImage:
    """The repository's Dockerfile built on the stand-in base, as `make image` builds it."""
    return ensure_image(default_tag(), REPO, engine=docker_engine)
