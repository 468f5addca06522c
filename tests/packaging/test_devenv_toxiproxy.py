"""The Toxiproxy build cache: the pinned release, warm reuse, stale detection, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guardedcron_devenv import binaries, toxiproxy
from guardedcron_devenv.binaries import BuildError
from guardedcron_devenv.toxiproxy import (
    BINARY_NAME,
    TOXIPROXY_SOURCES,
    build_stamp,
    ensure_toxiproxy,
    toxiproxy_version,
)


def test_the_pinned_release_and_its_checksums_are_committed() -> None:
    assert toxiproxy_version() == "v2.5.0"
    sums = (TOXIPROXY_SOURCES / "go.sum").read_text()
    # The build uses -mod=mod, but a complete go.sum keeps it offline-reproducible.
    assert "github.com/Shopify/toxiproxy/v2 v2.5.0 h1:" in sums
    assert "github.com/rs/zerolog v1.28.0 h1:" in sums


def _fake_cache(tmp_path: Path, stamp: dict[str, str]) -> Path:
    binary = tmp_path / "guardedcron" / f"toxiproxy-{toxiproxy_version()}" / "bin" / BINARY_NAME
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (binary.parent.parent / binaries.STAMP_FILE).write_text(json.dumps(stamp))
    return binary


@pytest.fixture
def no_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache under tmp_path and no Go on PATH: any build attempt fails at once."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv(binaries.REBUILD_ENV, raising=False)


@pytest.mark.usefixtures("no_go")
def test_a_warm_cache_is_reused_without_building(tmp_path: Path) -> None:
    current = build_stamp(binaries.sources_digest(TOXIPROXY_SOURCES), toxiproxy_version())
    binary = _fake_cache(tmp_path, current)
    lines: list[str] = []
    assert ensure_toxiproxy(progress=lines.append) == binary
    assert lines == []


@pytest.mark.usefixtures("no_go")
def test_a_stale_stamp_triggers_a_build_and_says_what_is_missing(tmp_path: Path) -> None:
    _fake_cache(tmp_path, build_stamp("another digest", toxiproxy_version()))
    missing_go = r"'go'\) is not on PATH; it is needed once to build toxiproxy v2\.5\.0"
    with pytest.raises(BuildError, match=missing_go):
        ensure_toxiproxy(progress=lambda line: None)


@pytest.mark.usefixtures("no_go")
def test_rebuild_can_be_forced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cache(tmp_path, build_stamp(binaries.sources_digest(TOXIPROXY_SOURCES), toxiproxy_version()))
    monkeypatch.setenv(binaries.REBUILD_ENV, "1")
    with pytest.raises(BuildError, match="not on PATH"):
        ensure_toxiproxy(progress=lambda line: None)


def test_the_stamp_changes_with_the_release_and_the_sources() -> None:
    base = build_stamp("digest", "v2.5.0")
    assert build_stamp("other", "v2.5.0") != base
    assert build_stamp("digest", "v2.6.0") != base
    assert f"{toxiproxy.TOXIPROXY_MODULE}.Version=v2.5.0" in base["command"]


@pytest.mark.usefixtures("no_go")
@pytest.mark.parametrize("damage", ["binary not executable", "stamp not JSON"])
def test_a_damaged_cache_is_built_again(tmp_path: Path, damage: str) -> None:
    """The cache check is the control plane's (binaries.binaries_current): a current stamp
    counts only beside an executable binary, and an unreadable stamp is stale."""
    binary = _fake_cache(
        tmp_path, build_stamp(binaries.sources_digest(TOXIPROXY_SOURCES), toxiproxy_version()))
    if damage == "binary not executable":
        binary.chmod(0o644)
    else:
        (binary.parent.parent / binaries.STAMP_FILE).write_text("{not json")
    with pytest.raises(BuildError, match="not on PATH"):
        ensure_toxiproxy(progress=lambda line: None)
