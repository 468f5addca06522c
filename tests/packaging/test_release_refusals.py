"""`make release` refuses, with one line and nothing built, a tree it cannot release:
uncommitted or untracked files, or version strings that disagree. Each case runs the
real command on a temporary clone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.release import VERSION, git, releasable_clone, release

OTHER_VERSION = "9.9.9"


def edit(relative: str, old: str, new: str) -> Callable[[Path], None]:
    def change(clone: Path) -> None:
        path = clone / relative
        text = path.read_text()
        assert old in text, (relative, old)
        path.write_text(text.replace(old, new, 1))
    return change


def committed(change: Callable[[Path], None]) -> Callable[[Path], None]:
    def change_and_commit(clone: Path) -> None:
        change(clone)
        git(clone, "commit", "--quiet", "--all", "--message", "a change")
    return change_and_commit


def untracked(clone: Path) -> None:
    (clone / "operator" / "guardedcron" / "scratch.py").write_text("")


CASES = {
    "modified file": (edit("README.md", "guardedcron", "guardedkron"),
                      "uncommitted changes or untracked files (M README.md"),
    "untracked file": (untracked, "uncommitted changes or untracked files (?? operator/"),
    "chart version": (committed(edit("charts/guardedcron/Chart.yaml", f"version: {VERSION}",
                                     f"version: {OTHER_VERSION}")),
                      f"Chart.yaml version is {OTHER_VERSION}, pyproject.toml's version is {VERSION}"),
    "chart appVersion": (committed(edit("charts/guardedcron/Chart.yaml", f'appVersion: "{VERSION}"',
                                        f'appVersion: "{OTHER_VERSION}"')),
                         f"Chart.yaml appVersion is {OTHER_VERSION}"),
    "image tag": (committed(edit("charts/guardedcron/values.yaml", 'tag: ""', f'tag: "{OTHER_VERSION}"')),
                  f"values.yaml image.tag is {OTHER_VERSION}"),
    "pyproject version": (committed(edit("pyproject.toml", f'version = "{VERSION}"',
                                         f'version = "{OTHER_VERSION}"')),
                          f"Chart.yaml version is {VERSION}, pyproject.toml's version is {OTHER_VERSION}"),
    "no changelog section": (committed(edit("CHANGELOG.md", f"## [{VERSION}]", "## [0.0.0]")),
                             f"CHANGELOG.md has no '## [{VERSION}]' section"),
}


@pytest.mark.parametrize("change, reason", list(CASES.values()), ids=list(CASES))
def test_release_refuses_and_builds_nothing(
    change: Callable[[Path], None], reason: str, tmp_path: Path
) -> None:
    clone = releasable_clone(tmp_path)
    change(clone)
    refused = release(clone)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("guardedcron: release refused: ")
    assert reason in refused.stderr
    assert not (clone / "dist").exists()
