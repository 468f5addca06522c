"""Run the real release command (guardedcron_devenv.release) on a clone of the repository."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from tests.support import REPO

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
STEP_TIMEOUT_S = 300


def sh(command: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=STEP_TIMEOUT_S,
                          check=False)


def git(clone: Path, *args: str) -> None:
    done = sh(["git", "-c", "user.name=release test", "-c", "user.email=release@test.invalid",
               *args], cwd=clone)
    assert done.returncode == 0, done.stderr


def releasable_clone(into: Path) -> Path:
    """A clone of the committed repository whose CHANGELOG names the current version."""
    clone = into / "repo"
    done = sh(["git", "clone", "--quiet", str(REPO), str(clone)])
    assert done.returncode == 0, done.stderr
    changelog = clone / "CHANGELOG.md"
    changelog.write_text(changelog.read_text().replace(
        "## [Unreleased]", f"## [Unreleased]\n\n## [{VERSION}] - 2026-12-07", 1))
    git(clone, "commit", "--quiet", "--all", "--message", f"Release {VERSION}")
    return clone


def release(clone: Path) -> subprocess.CompletedProcess[str]:
    return sh([sys.executable, "-m", "guardedcron_devenv.release", "--source", str(clone)])
