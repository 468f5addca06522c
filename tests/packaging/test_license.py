"""The licence the metadata declares is shipped: LICENSE is the Apache License 2.0 as the
ASF publishes it, the wheel and sdist carry it (pyproject's license-files), and the image
build, which builds the wheel, is sent it."""

from __future__ import annotations

import hashlib
import tomllib

from tests.support.chart import REPO

# sha256 of https://www.apache.org/licenses/LICENSE-2.0.txt: the full text, unedited.
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_license_is_the_apache_license_2_0_text() -> None:
    text = (REPO / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256


def test_pyproject_declares_it_and_ships_the_file() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"  # an SPDX expression (PEP 639)
    assert project["license-files"] == ["LICENSE"]
    assert not [c for c in project.get("classifiers", ()) if c.startswith("License ::")]  # PEP 639


def test_the_image_build_is_sent_the_license() -> None:
    dockerignore = (REPO / ".dockerignore").read_text().splitlines()
    assert "!LICENSE" in dockerignore
    copies = [line.split()[1:-1] for line in (REPO / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ") and "--from" not in line]
    assert any("LICENSE" in sources and "pyproject.toml" in sources for sources in copies)
