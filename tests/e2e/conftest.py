"""Fixtures for the e2e suite: a real control plane built from Go modules.

The binaries are built (or found in the cache) once, right after collection and outside
any test's timeout, because a cold build takes far longer than one test may. A build
failure is kept and raised by the fixtures, so every e2e test fails with it: never a skip.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from guardedcron_devenv.binaries import Paths, ensure_binaries
from guardedcron_devenv.controlplane import ControlPlane
from guardedcron_devenv.postgres import ThrowawayPostgres
from tests.e2e.harness import EAST, FAILURE_LOGS, WEST, Cluster, Scenario, WorkDb
from tests.e2e.operator_process import OperatorProcess

StartControlPlane = Callable[[str], ControlPlane]

_build: dict[str, Paths | BaseException] = {}
_running: list[ControlPlane] = []


def _wants_e2e(session: pytest.Session) -> bool:
    return any(item.get_closest_marker("e2e") for item in session.items)


def pytest_collection_finish(session: pytest.Session) -> None:
    if not _wants_e2e(session):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")

    def progress(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)

    try:
        _build["paths"] = ensure_binaries(progress=progress)
    except Exception as error:  # reported by every e2e test through the fixture below
        _build["paths"] = error


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and item.get_closest_marker("e2e"):
        for plane in _running:
            report.sections.append((f"control plane {plane.name!r} logs", plane.logs_tail()))
        for title, source in FAILURE_LOGS:
            report.sections.append((title, source()))
    return report


@pytest.fixture(scope="session")
def kube_binaries() -> Paths:
    built = _build.get("paths")
    if built is None:  # collected without the hook having run, e.g. an e2e test by node id
        built = ensure_binaries()
    if isinstance(built, BaseException):
        raise built
    return built


@pytest.fixture(scope="session")
def control_plane_factory(
    kube_binaries: Paths, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartControlPlane]:
    """Start another control plane by name; all are stopped at the end of the session."""
    with ExitStack() as stack:

        def start(name: str) -> ControlPlane:
            plane = ControlPlane(
                kube_binaries,
                name=name,
                logs_dir=tmp_path_factory.mktemp(f"controlplane-{name}-logs", numbered=True),
                progress=lambda line: None,
            )
            stack.enter_context(plane)
            _running.append(plane)
            stack.callback(_running.remove, plane)
            return plane

        yield start


@pytest.fixture(scope="session")
def control_plane(control_plane_factory: StartControlPlane) -> ControlPlane:
    return control_plane_factory("primary")


# --- the guardedcron scenarios: two clusters, one database ---------------------------------

@pytest.fixture(scope="session")
def e2e_db(postgres: ThrowawayPostgres) -> WorkDb:
    """The one database both clusters' guards and workloads use, migrated."""
    import psycopg

    from guardedcron.guard.migrations import migrate
    from tests.e2e.workload import SCHEMA

    dsn = postgres.create_database("e2e")
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        conn.execute(SCHEMA)
    return WorkDb(dsn)


@pytest.fixture(scope="session")
def clusters(control_plane_factory: StartControlPlane, e2e_db: WorkDb) -> dict[str, Cluster]:
    """Control planes of their own: the chart-install tests install the CRD with Helm into
    the primary one, and Helm will not adopt a CRD applied by kubectl (nor the reverse)."""
    return {name: Cluster(name, control_plane_factory(name), e2e_db.dsn) for name in (EAST, WEST)}


def _scenario(request: pytest.FixtureRequest, clusters: dict[str, Cluster], db: WorkDb,
              guard_images: tuple[str, ...] = ()) -> Iterator[Scenario]:
    with Scenario(clusters, db, guard_images) as running:
        entry = (f"containers of {request.node.name}", running.container_logs)
        FAILURE_LOGS.append(entry)
        try:
            yield running
        finally:
            FAILURE_LOGS.remove(entry)


@pytest.fixture
def scenario(
    request: pytest.FixtureRequest, clusters: dict[str, Cluster], e2e_db: WorkDb
) -> Iterator[Scenario]:
    """Namespaces served by process-kubelets, removed after the test; their containers'
    output goes into the report of a failed test."""
    yield from _scenario(request, clusters, e2e_db)


@pytest.fixture(scope="session")
def operators(
    clusters: dict[str, Cluster], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, OperatorProcess]]:
    """The CRDs applied and an operator running in each cluster under the chart's RBAC;
    their logs go into the report of every failed e2e test from here on."""
    started: dict[str, OperatorProcess] = {}
    try:
        for name, cluster in clusters.items():
            cluster.apply_crds()
            process = OperatorProcess(cluster, tmp_path_factory.mktemp(f"operator-{name}"))
            FAILURE_LOGS.append((f"operator of {name} (log tail)", process.log_tail))
            started[name] = process
            process.install()
            process.start()
        yield started
    finally:
        for process in started.values():
            process.stop()


@pytest.fixture
def operator_scenario(
    request: pytest.FixtureRequest, clusters: dict[str, Cluster], e2e_db: WorkDb,
    operators: dict[str, OperatorProcess],
) -> Iterator[Scenario]:
    """A scenario whose kubelets also know the guard image the chart sets."""
    images = tuple(sorted({p.guard_image for p in operators.values()}))
    yield from _scenario(request, clusters, e2e_db, images)
