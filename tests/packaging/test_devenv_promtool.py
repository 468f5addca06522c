"""promtool's build cache: keyed by the pinned Prometheus module release, reused warm,
rebuilt when stale, and a build that cannot run says why."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from guardedcron_devenv import binaries
from guardedcron_devenv.binaries import BuildError, build_cache_root, sources_digest
from guardedcron_devenv.promtool import (
    PROMTOOL,
    PROMTOOL_SOURCES,
    build_stamp,
    ensure_promtool,
    prometheus_version,
)


def test_the_pinned_release_and_its_checksums_are_committed() -> None:
    assert prometheus_version() == "v0.316.0"
    go_mod = (PROMTOOL_SOURCES / "go.mod").read_text()
    assert "tool github.com/prometheus/prometheus/cmd/promtool" in go_mod
    assert "github.com/prometheus/prometheus v0.316.0 h1:" in (PROMTOOL_SOURCES / "go.sum").read_text()


def test_the_cached_binary_is_keyed_by_version_and_runs(promtool_binary: Path) -> None:
    version_dir = build_cache_root(os.environ) / f"promtool-{prometheus_version()}"
    assert promtool_binary == version_dir / "bin" / "promtool"
    stamp = json.loads((version_dir / binaries.STAMP_FILE).read_text())
    assert stamp == build_stamp(sources_digest(only=("promtool/",)), prometheus_version())
    help_text = subprocess.run([str(promtool_binary), "test", "rules", "--help"],
                               capture_output=True, text=True, timeout=60, check=False)
    assert help_text.returncode == 0 and "Unit tests for rules." in help_text.stdout


def _fake_cache(cache: Path, stamp: dict[str, str]) -> Path:
    binary = cache / "guardedcron" / f"promtool-{prometheus_version()}" / "bin" / PROMTOOL.name
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (binary.parent.parent / binaries.STAMP_FILE).write_text(json.dumps(stamp))
    return binary


@pytest.fixture
def no_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache under tmp_path and no Go on PATH: any build attempt fails at once."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.delenv(binaries.REBUILD_ENV, raising=False)


@pytest.mark.usefixtures("no_go")
def test_a_current_stamp_is_reused_without_go(tmp_path: Path) -> None:
    wanted = build_stamp(sources_digest(only=("promtool/",)), prometheus_version())
    binary = _fake_cache(tmp_path, wanted)
    assert ensure_promtool(progress=lambda line: None) == binary


@pytest.mark.usefixtures("no_go")
def test_a_stale_stamp_rebuilds_and_a_missing_go_is_named(tmp_path: Path) -> None:
    stale = build_stamp("an older digest of go/promtool", prometheus_version())
    _fake_cache(tmp_path, stale)
    missing_go = r"'go'\) is not on PATH.*build promtool \(Prometheus module v0\.316\.0\)"
    with pytest.raises(BuildError, match=missing_go):
        ensure_promtool(progress=lambda line: None)
