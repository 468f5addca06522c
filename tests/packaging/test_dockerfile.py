"""The Dockerfile as text: hadolint over it, and the default base users build on.

Everything about what the Dockerfile builds is checked on the image itself, built by a
real Docker engine (tests/image/test_image_real.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
HADOLINT = Path(sys.executable).with_name("hadolint")
# The base users get without --build-arg: official Python 3.11 on slim Debian, by tag.
DEFAULT_BASE = re.compile(r"^ARG PYTHON_IMAGE=(?P<image>\S+)$", re.MULTILINE)


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [str(HADOLINT), "--failure-threshold", "style", "--disable-ignore-pragma",
         "--no-color", str(DOCKERFILE)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_is_a_real_check(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install gcc\nUSER root\n")
    result = subprocess.run([str(HADOLINT), "--no-color", str(bad)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # the latest tag


def test_the_default_base_is_python_311_slim_by_a_pinned_tag() -> None:
    text = DOCKERFILE.read_text()
    defaults = DEFAULT_BASE.findall(text)
    assert len(defaults) == 1, "one ARG PYTHON_IMAGE with a default, before the first FROM"
    assert text.index("ARG PYTHON_IMAGE=") < text.index("\nFROM ")
    name, _, digest = defaults[0].partition("@")
    repository, _, tag = name.rpartition(":")
    assert repository == "python" and tag.startswith("3.11-slim") and tag != "latest", defaults[0]
    assert not digest or digest.startswith("sha256:")
    # every stage builds on it, so the stand-in base replaces all of them at once
    assert re.findall(r"^FROM (\S+)", text, flags=re.MULTILINE) == ["${PYTHON_IMAGE}"] * 2
