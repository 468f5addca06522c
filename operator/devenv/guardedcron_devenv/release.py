"""`make release`: every artifact of a release, built from the committed tree into dist/.

    python -m guardedcron_devenv.release [--image] [--source .]

It refuses, building nothing, when the working tree has changes or untracked files, or
when the version strings disagree: pyproject.toml's version, Chart.yaml's version and
appVersion, the chart's default image tag when it sets one, and a `## [X.Y.Z]` section
in CHANGELOG.md (docs/releasing.md). Then, from `git archive HEAD` (so nothing
uncommitted or ignored gets in):

    guardedcron-X.Y.Z.tar.gz, guardedcron-X.Y.Z-py3-none-any.whl
                                        python -m build (the wheel built from the sdist)
    guardedcron-X.Y.Z.tgz               helm package
    guardedcron-X.Y.Z.python.cdx.json   CycloneDX SBOM of the wheel installed with its dependencies
    guardedcron-image-X.Y.Z.tar, guardedcron-image-X.Y.Z.cdx.json
                                        with --image: docker save, and the image's Python packages
    SHA256SUMS                          sha256sum --check reads it

Builds and installs take their wheels from the cached wheelhouse (wheelhouse.py), so
this runs offline once the set-up step has filled it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import yaml

from guardedcron_devenv.binaries import BuildError, Progress
from guardedcron_devenv.docker_engine import EngineError, ensure_engine
from guardedcron_devenv.image import IMAGE_REPOSITORY, VENV_DIR, ensure_image
from guardedcron_devenv.tools import ToolInstallError, ensure_helm, file_sha256
from guardedcron_devenv.wheelhouse import ensure_wheelhouse

CHART_PATH: Final = Path("charts/guardedcron")
STEP_TIMEOUT_S: Final = 600.0
CHECKSUMS_FILE: Final = "SHA256SUMS"
# The image's Python packages as `name==version` lines (pip is not in the image).
LIST_DISTRIBUTIONS: Final = (
    "import importlib.metadata as m\n"
    "for d in m.distributions():\n"
    "    print(f\"{d.metadata['Name']}=={d.version}\")\n"
)


class ReleaseRefused(Exception):
    """The tree is not in a state to release from; the message says what to fix."""


@dataclass(frozen=True)
class VersionClaim:
    where: str
    version: str


def changelog_has_section(changelog: str, version: str) -> bool:
    """A `## [X.Y.Z]` heading (a date may follow) names the release; Unreleased does not."""
    return re.search(rf"^## \[{re.escape(version)}\]", changelog, re.MULTILINE) is not None


def release_version(source: Path) -> str:
    """The one version every file agrees on, or ReleaseRefused naming the disagreement."""
    version = str(tomllib.loads((source / "pyproject.toml").read_text())["project"]["version"])
    chart = yaml.safe_load((source / CHART_PATH / "Chart.yaml").read_text())
    values = yaml.safe_load((source / CHART_PATH / "values.yaml").read_text())
    claims = [
        VersionClaim("Chart.yaml version", str(chart["version"])),
        VersionClaim("Chart.yaml appVersion", str(chart["appVersion"])),
    ]
    # An empty tag means the chart uses appVersion, checked above.
    if image_tag := str(values.get("image", {}).get("tag") or ""):
        claims.append(VersionClaim("values.yaml image.tag", image_tag))
    for claim in claims:
        if claim.version != version:
            raise ReleaseRefused(f"{claim.where} is {claim.version}, pyproject.toml's version is {version}")
    if not changelog_has_section((source / "CHANGELOG.md").read_text(), version):
        raise ReleaseRefused(f"CHANGELOG.md has no '## [{version}]' section (see docs/releasing.md)")
    return version


def require_clean_tree(source: Path) -> None:
    status = run(["git", "status", "--porcelain", "--untracked-files=normal"], cwd=source)
    if status.strip():
        first = status.splitlines()[0].strip()
        raise ReleaseRefused(f"the working tree has uncommitted changes or untracked files ({first}, ...)")


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=STEP_TIMEOUT_S, check=False)
    if result.returncode != 0:
        raise BuildError(f"`{' '.join(command)}` failed (exit {result.returncode}): "
                         f"{(result.stderr or result.stdout).strip()[-1500:]}")
    return result.stdout


def export_head(source: Path, into: Path) -> Path:
    """The committed tree, as a tag would have it."""
    archive = into / "head.tar"
    run(["git", "archive", "--format=tar", "--output", str(archive), "HEAD"], cwd=source)
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="tar")
    return tree


def offline_pip_env(wheelhouse: Path) -> dict[str, str]:
    # The variables reach the pip that `python -m build` runs for its isolated environment too.
    return {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse),
            "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def build_python(tree: Path, dist: Path, wheelhouse: Path) -> tuple[Path, Path]:
    """The sdist, and the wheel built from that sdist (so the sdist is known to build)."""
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(tree)], cwd=tree,
        env=offline_pip_env(wheelhouse))
    [sdist] = dist.glob("guardedcron-*.tar.gz")
    [wheel] = dist.glob("guardedcron-*.whl")
    return sdist, wheel


def package_chart(tree: Path, dist: Path) -> Path:
    run([str(ensure_helm()), "package", str(tree / CHART_PATH), "--destination", str(dist)], cwd=tree)
    [chart] = dist.glob("guardedcron-*.tgz")
    return chart


def python_sbom(wheel: Path, tree: Path, wheelhouse: Path, scratch: Path, output: Path) -> None:
    """CycloneDX of what `pip install <wheel>` brings: installed into an empty venv (no pip
    of its own, so only guardedcron's dependencies are in it), read by cyclonedx-py."""
    venv = scratch / "sbom-venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=scratch)
    run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
         "--no-compile", str(wheel)], cwd=scratch, env=offline_pip_env(wheelhouse))
    run([*cyclonedx_command(), "environment", "--output-reproducible", "--pyproject",
         str(tree / "pyproject.toml"), "--output-file", str(output), str(venv)], cwd=scratch)


def cyclonedx_command() -> list[str]:
    return [str(Path(sys.executable).with_name("cyclonedx-py"))]


def build_image(version: str, tree: Path, dist: Path, scratch: Path, progress: Progress) -> list[Path]:
    """The image (`make image`'s path), saved as a tarball, and an SBOM of its Python packages."""
    engine = ensure_engine(progress)
    tag = f"{IMAGE_REPOSITORY}:{version}"
    ensure_image(tag, tree, progress, engine)
    tarball = dist / f"guardedcron-image-{version}.tar"
    engine.check("save", "--output", str(tarball), tag, timeout_s=STEP_TIMEOUT_S)
    listed = engine.check("run", "--rm", "--entrypoint", f"{VENV_DIR}/bin/python", tag, "-c",
                          LIST_DISTRIBUTIONS)
    requirements = scratch / "image-requirements.txt"
    requirements.write_text(listed)
    sbom = dist / f"guardedcron-image-{version}.cdx.json"
    run([*cyclonedx_command(), "requirements", "--output-reproducible", "--pyproject",
         str(tree / "pyproject.toml"), "--output-file", str(sbom), str(requirements)], cwd=scratch)
    return [tarball, sbom]


def write_checksums(dist: Path) -> Path:
    lines = []
    for artifact in sorted(p for p in dist.iterdir() if p.name != CHECKSUMS_FILE):
        lines.append(f"{file_sha256(artifact)}  {artifact.name}\n")
    checksums = dist / CHECKSUMS_FILE
    checksums.write_text("".join(lines))
    return checksums


def build_release(source: Path, dist: Path, with_image: bool, progress: Progress = print) -> list[Path]:
    """Check the tree, then build every artifact into `dist` (emptied first)."""
    require_clean_tree(source)
    version = release_version(source)
    wheelhouse = ensure_wheelhouse(source / "pyproject.toml")
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="guardedcron-release-") as scratch_name:
        scratch = Path(scratch_name)
        tree = export_head(source, scratch)
        progress(f"guardedcron: building release {version} into {dist}")
        _, wheel = build_python(tree, dist, wheelhouse)
        package_chart(tree, dist)
        python_sbom(wheel, tree, wheelhouse, scratch, dist / f"guardedcron-{version}.python.cdx.json")
        if with_image:
            build_image(version, tree, dist, scratch, progress)
    write_checksums(dist)
    return sorted(dist.iterdir())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m guardedcron_devenv.release",
        description="Build the wheel, sdist, chart, SBOMs and checksums of a release into dist/.",
    )
    parser.add_argument("--image", action="store_true",
                        help="also build the image with a local Docker engine and save it to a tarball")
    parser.add_argument("--source", type=Path, default=Path.cwd(),
                        help="the repository to release (default: the current folder)")
    args = parser.parse_args(argv)
    source = args.source.resolve()
    try:
        artifacts = build_release(source, source / "dist", args.image)
    except ReleaseRefused as refusal:
        print(f"guardedcron: release refused: {refusal}", file=sys.stderr)
        return 2
    except (BuildError, EngineError, ToolInstallError) as error:
        print(f"guardedcron: release not built: {error}", file=sys.stderr)
        return 1
    for artifact in artifacts:
        print(artifact)
    return 0


if __name__ == "__main__":
    sys.exit(main())
