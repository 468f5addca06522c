"""promtool and actionlint are built (promtool minutes, actionlint seconds; once per
version) when the session collects a test that needs them, before any test runs: the
build then does not count against a test's timeout, and its progress lines reach the
terminal. A failed build fails those tests with its error."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from guardedcron_devenv.actionlint import ensure_actionlint
from guardedcron_devenv.binaries import Progress
from guardedcron_devenv.promtool import ensure_promtool

# Each fixture below and the build that gives it its binary.
BUILDS: dict[str, Callable[[Progress], Path]] = {
    "promtool_binary": ensure_promtool,
    "actionlint_binary": ensure_actionlint,
}
_build: dict[str, Path | BaseException] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    wanted = [
        fixture for fixture in BUILDS
        if any(fixture in getattr(item, "fixturenames", ()) for item in session.items)
    ]  # fmt: skip
    if not wanted:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")

    def progress(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)

    for fixture in wanted:
        try:
            _build[fixture] = BUILDS[fixture](progress)
        except Exception as error:  # reported by every test that needs the binary, below
            _build[fixture] = error


def _built(fixture: str) -> Path:
    built = _build.get(fixture)
    if built is None:  # the hook did not run for this item (e.g. selected by node id)
        built = BUILDS[fixture](print)
    if isinstance(built, BaseException):
        raise built
    return built


@pytest.fixture(scope="session")
def promtool_binary() -> Path:
    return _built("promtool_binary")


@pytest.fixture(scope="session")
def actionlint_binary() -> Path:
    return _built("actionlint_binary")
