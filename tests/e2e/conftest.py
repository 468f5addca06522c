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

from guardedcron.devenv.binaries import Paths, ensure_binaries
from guardedcron.devenv.controlplane import ControlPlane

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
