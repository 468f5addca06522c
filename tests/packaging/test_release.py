"""`make release` in a clone of the repository: the real command builds dist/, then the
wheel installs offline into a fresh venv and its commands run (a lease won in a real
PostgreSQL), the sdist builds offline into the same wheel, the packaged chart lints and
renders, the SBOM lists the dependencies and the checksums verify.

Nothing here reaches a package index: pip reads only the wheelhouse the set-up step
filled (guardedcron_devenv.wheelhouse), and the clone's release section is added here.
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from guardedcron_devenv.tools import ensure_helm
from guardedcron_devenv.wheelhouse import DONE_FILE, wheelhouse_dir, wheelhouse_requirements
from tests.support import REPO
from tests.support.release import VERSION, releasable_clone, release, sh


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    folder = wheelhouse_dir(wheelhouse_requirements(REPO / "pyproject.toml"))
    if not (folder / DONE_FILE).is_file():
        pytest.fail(f"no wheelhouse at {folder}: `make setup` downloads it (tests stay offline)")
    return folder


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path) -> Path:
    clone = releasable_clone(tmp_path_factory.mktemp("release"))
    built = release(clone)
    assert built.returncode == 0, built.stderr
    return clone / "dist"


def install_offline(artifact: Path, wheelhouse: Path, venv: Path) -> Path:
    """A fresh venv with `artifact` installed from the wheelhouse alone; its bin folder.
    Our pip installs into it (--python) and skips bytecode: seconds instead of a quarter
    minute for the venv's own pip, and the same files land."""
    created = sh([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert created.returncode == 0, created.stderr
    installed = sh([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                    "--quiet", "--no-compile", "--no-index", "--disable-pip-version-check",
                    "--find-links", str(wheelhouse), str(artifact)])
    assert installed.returncode == 0, installed.stderr
    return venv / "bin"


def test_release_builds_every_artifact_and_their_checksums(dist: Path) -> None:
    assert sorted(p.name for p in dist.iterdir()) == sorted([
        f"guardedcron-{VERSION}-py3-none-any.whl", f"guardedcron-{VERSION}.tar.gz",
        f"guardedcron-{VERSION}.tgz", f"guardedcron-{VERSION}.python.cdx.json", "SHA256SUMS",
    ])
    listed = (dist / "SHA256SUMS").read_text().splitlines()
    assert len(listed) == 4
    verified = sh(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=dist)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_the_wheel_installs_offline_and_its_commands_run(
    dist: Path, wheelhouse: Path, tmp_path: Path, empty_dsn: str
) -> None:
    bin_dir = install_offline(dist / f"guardedcron-{VERSION}-py3-none-any.whl", wheelhouse, tmp_path / "v")
    answered = sh([str(bin_dir / "guardedcron"), "--version"])
    assert answered.returncode == 0, answered.stderr
    assert VERSION in answered.stdout
    # The installed guard against a real PostgreSQL: the schema made, then a lease won.
    guard = [str(bin_dir / "guardedcron")]
    migrated = sh([*guard, "db", "migrate", "--dsn", empty_dsn])
    assert migrated.returncode == 0, migrated.stderr
    won = sh([*guard, "acquire", "--dsn", empty_dsn, "--lock", "release/check", "--holder", "wheel",
              "--lease-seconds", "60", "--out", str(tmp_path / "run")])
    assert won.returncode == 0, won.stderr
    assert json.loads((tmp_path / "run" / "lease.json").read_text())["fence"] == 1
    plugin = sh([str(bin_dir / "kubectl-gcj"), "--help"])
    assert plugin.returncode == 0, plugin.stderr
    assert "gcj" in plugin.stdout
    # The CRD that `guardedcron render` reads travels in the wheel, not the devenv.
    site = next((tmp_path / "v" / "lib").glob("python3*/site-packages"))
    assert list((site / "guardedcron" / "crds").glob("*.yaml"))
    assert not (site / "guardedcron_devenv").exists()


def test_the_sdist_builds_offline_into_the_same_wheel(dist: Path, wheelhouse: Path, tmp_path: Path) -> None:
    built = sh([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index",
                "--find-links", str(wheelhouse), "--wheel-dir", str(tmp_path),
                str(dist / f"guardedcron-{VERSION}.tar.gz")])
    assert built.returncode == 0, built.stderr
    [rebuilt] = tmp_path.glob("guardedcron-*.whl")
    with zipfile.ZipFile(rebuilt) as ours, zipfile.ZipFile(dist / rebuilt.name) as released:
        assert sorted(ours.namelist()) == sorted(released.namelist())
        assert any(name.startswith("guardedcron/crds/") for name in ours.namelist())


def test_the_packaged_chart_lints_and_renders_the_release_image(dist: Path) -> None:
    chart = dist / f"guardedcron-{VERSION}.tgz"
    helm = str(ensure_helm())
    linted = sh([helm, "lint", str(chart)])
    assert linted.returncode == 0, linted.stdout + linted.stderr
    rendered = sh([helm, "template", "gc", str(chart), "--namespace", "guardedcron-system"])
    assert rendered.returncode == 0, rendered.stderr
    [deployment] = [doc for doc in yaml.safe_load_all(rendered.stdout)
                    if doc and doc["kind"] == "Deployment"]
    images = {c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert images and all(image.endswith(f":{VERSION}") for image in images)


def test_the_sbom_lists_what_the_wheel_installs(dist: Path) -> None:
    sbom = json.loads((dist / f"guardedcron-{VERSION}.python.cdx.json").read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    root = sbom["metadata"]["component"]
    assert (root["name"], root["version"]) == ("guardedcron", VERSION)
    names = {component["name"].lower().replace("_", "-") for component in sbom["components"]}
    # The declared dependencies and what they pull in; nothing of the build machine's.
    assert {"kopf", "psycopg", "psycopg-binary", "pyyaml", "kubernetes", "aiohttp", "tzdata"} <= names
    assert not names & {"pip", "setuptools", "pytest", "guardedcron-devenv", "cyclonedx-bom"}
