"""promtool is built (minutes, once per version) when the session collects a test that
needs it, before any test runs: the build then does not count against a test's timeout,
and its progress lines reach the terminal. A failed build fails those tests with its error."""

from __future__ import annotations

from pathlib import Path

import pytest

from guardedcron_devenv.promtool import ensure_promtool

PROMTOOL_FIXTURE = "promtool_binary"
_build: dict[str, Path | BaseException] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    if not any(PROMTOOL_FIXTURE in getattr(item, "fixturenames", ()) for item in session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")

    def progress(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)

    try:
        _build["promtool"] = ensure_promtool(progress=progress)
    except Exception as error:  # reported by every test that needs promtool, below
        _build["promtool"] = error


@pytest.fixture(scope="session")
def promtool_binary() -> Path:
    built = _build.get("promtool")
    if built is None:  # the hook did not run for this item (e.g. selected by node id)
        built = ensure_promtool()
    if isinstance(built, BaseException):
        raise built
    return built
