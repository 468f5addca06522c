"""`make release WITH_IMAGE=1` in a clone: the image saved as a tarball that holds the
image the engine built from the committed tree, and an SBOM of exactly the Python
packages inside it; both in SHA256SUMS."""

from __future__ import annotations

import json
import re
import sys
import tarfile

import pytest

from guardedcron_devenv.docker_engine import DockerEngine
from guardedcron_devenv.image import VENV_DIR, BuiltImage
from guardedcron_devenv.release import LIST_DISTRIBUTIONS
from tests.support.release import VERSION, releasable_clone, sh

pytestmark = pytest.mark.image


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_release_with_image_saves_the_built_image_and_an_sbom_of_its_packages(
    tmp_path_factory: pytest.TempPathFactory, docker_engine: DockerEngine, built_image: BuiltImage,
) -> None:
    # built_image: the session's build of the same sources, so this one is Docker's cache.
    clone = releasable_clone(tmp_path_factory.mktemp("release-image"))
    built = sh([sys.executable, "-m", "guardedcron_devenv.release", "--image", "--source", str(clone)])
    assert built.returncode == 0, built.stdout + built.stderr
    dist = clone / "dist"
    tarball, sbom = dist / f"guardedcron-image-{VERSION}.tar", dist / f"guardedcron-image-{VERSION}.cdx.json"
    assert tarball.is_file() and sbom.is_file(), sorted(p.name for p in dist.iterdir())
    listed = {line.split()[1] for line in (dist / "SHA256SUMS").read_text().splitlines()}
    assert {tarball.name, sbom.name} <= listed and len(listed) == 6, listed
    verified = sh(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=dist)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    # The tarball is `docker save` of the image now tagged with the release's version.
    tag = f"guardedcron:{VERSION}"
    with tarfile.open(tarball) as saved:
        manifest_file = saved.extractfile("manifest.json")
        assert manifest_file is not None
        [manifest] = json.load(manifest_file)
    assert manifest["RepoTags"] == [tag], manifest
    image_id = docker_engine.check("image", "inspect", "--format", "{{.Id}}", tag).strip()
    assert manifest["Config"].removesuffix(".json") == image_id.removeprefix("sha256:"), (manifest, image_id)

    # The SBOM's components are the packages the image carries, name and version.
    inside = docker_engine.check("run", "--rm", "--network", "none", "--entrypoint",
                                 f"{VENV_DIR}/bin/python", tag, "-c", LIST_DISTRIBUTIONS)
    packages = {(canonical(name), version) for name, version in (line.split("==") for line in inside.split())}
    components = {(canonical(c["name"]), c["version"]) for c in json.loads(sbom.read_text())["components"]}
    assert {name for name, _ in packages} >= {"guardedcron", "kopf", "psycopg", "prometheus-client"}
    assert components == packages, components ^ packages
