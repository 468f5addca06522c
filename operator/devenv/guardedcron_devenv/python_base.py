"""A local stand-in for the `python:3.11-slim-bookworm` base image, made from Debian packages.

No image registry is reachable here, so the Dockerfile's base cannot be pulled. Debian
bookworm ships Python 3.11 too: debootstrap lays out a minimal bookworm root filesystem
with python3, python3-venv and `python` on PATH (the Dockerfile calls `python`), this
machine's CA bundle replaces Debian's (pip inside the build must trust whatever this
machine trusts to reach the package index), and documentation, manuals, translations
and apt's caches go, as in Debian's slim images. `docker import` turns the tarball into
an image that the build names through the Dockerfile's PYTHON_IMAGE argument.

debootstrap takes a minute or two and needs the network, so the tarball is cached:

    ${XDG_CACHE_HOME:-~/.cache}/guardedcron/python-base-<key>/rootfs.tar

The key covers the suite, the mirror, the versions apt knows for the main packages in
that suite (what debootstrap will install), the CA bundle and this recipe's own source.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from guardedcron_devenv.binaries import (
    STAMP_FILE,
    BuildError,
    Progress,
    build_cache_root,
    build_cached,
)
from guardedcron_devenv.docker_engine import DockerEngine
from guardedcron_devenv.long_step import run_long_step

SUITE: Final = "bookworm"
MIRROR: Final = "http://deb.debian.org/debian"
PACKAGES: Final = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
# The versions that decide what the stand-in is; any change makes a new base.
KEYED_PACKAGES: Final = (
    "python3.11", "python3.11-venv", "python-is-python3", "ca-certificates", "libc6", "libssl3",
)  # fmt: skip
DEFAULT_CA_BUNDLE: Final = Path("/etc/ssl/certs/ca-certificates.crt")
IMAGE_REPOSITORY: Final = "guardedcron-stand-in/python"
IMAGE_TAG_PREFIX: Final = f"3.11-slim-{SUITE}"
# What the real python image sets and the Dockerfile relies on.
IMAGE_CHANGES: Final = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
)
# Trimmed as Debian's slim images do; copyright files stay.
TRIMMED: Final = ("usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt/archives",
                  "var/lib/apt/lists", "var/log")
# Bounds on every wait in this module (seconds).
DEBOOTSTRAP_TIMEOUT_S: Final = 30 * 60.0
IMPORT_TIMEOUT_S: Final = 10 * 60.0
APT_QUERY_TIMEOUT_S: Final = 60.0
ROOTFS_TAR: Final = "rootfs.tar"
BUILD_LOG: Final = "debootstrap.log"


@dataclass(frozen=True)
class BaseRecipe:
    """What the stand-in base is made of; its key names the cache folder and the image."""

    suite: str
    mirror: str
    versions: tuple[tuple[str, str], ...]
    ca_bundle: Path
    ca_bundle_digest: str
    recipe_digest: str

    def stamp(self) -> dict[str, str]:
        return {
            "suite": self.suite,
            "mirror": self.mirror,
            "packages": " ".join(PACKAGES),
            "versions": " ".join(f"{name}={version}" for name, version in self.versions),
            "ca_bundle": self.ca_bundle_digest,
            "recipe": self.recipe_digest,
        }

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.stamp(), sort_keys=True).encode()).hexdigest()[:16]

    @property
    def image(self) -> str:
        return f"{IMAGE_REPOSITORY}:{IMAGE_TAG_PREFIX}-{self.key}"


def suite_version(madison_output: str, package: str, suite: str, mirror: str) -> str:
    """The version `apt-cache madison` lists for `package` in `suite`/main of `mirror`."""
    pattern = re.compile(
        rf"^\s*{re.escape(package)}\s*\|\s*(\S+)\s*\|\s*{re.escape(mirror)}/?\s+{re.escape(suite)}/main\s",
        re.MULTILINE,
    )
    match = pattern.search(madison_output)
    if match is None:
        raise BuildError(
            f"apt knows no version of {package} in {suite}/main from {mirror}; "
            "run `apt-get update` (or .ci/bootstrap) so the stand-in base can be keyed"
        )
    return match.group(1)


def ca_bundle_path() -> Path:
    """The bundle this machine's tools trust (SSL_CERT_FILE when set, as pip and curl read it)."""
    return Path(os.environ.get("SSL_CERT_FILE") or DEFAULT_CA_BUNDLE)


def current_recipe() -> BaseRecipe:
    """The recipe as this machine would make it now (apt's lists, CA bundle, this source)."""
    try:
        result = subprocess.run(
            ["apt-cache", "madison", *KEYED_PACKAGES], capture_output=True, text=True,
            timeout=APT_QUERY_TIMEOUT_S, check=False,
        )  # fmt: skip
    except FileNotFoundError as error:
        raise BuildError(f"apt-cache is missing ({error}); the stand-in base is made from "
                         "Debian packages and needs a Debian machine") from None
    versions = tuple((name, suite_version(result.stdout, name, SUITE, MIRROR)) for name in KEYED_PACKAGES)
    bundle = ca_bundle_path()
    if not bundle.is_file():
        raise BuildError(f"no CA bundle at {bundle}: pip inside the image build could not "
                         "verify the package index (set SSL_CERT_FILE to this machine's bundle)")
    return BaseRecipe(
        suite=SUITE,
        mirror=MIRROR,
        versions=versions,
        ca_bundle=bundle,
        ca_bundle_digest=hashlib.sha256(bundle.read_bytes()).hexdigest(),
        recipe_digest=hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    )


def ensure_python_base(engine: DockerEngine, progress: Progress = print) -> str:
    """The stand-in base image's name, made (or taken from the cache) and imported first."""
    recipe = current_recipe()
    if engine.run("image", "inspect", "--format", "{{.Id}}", recipe.image).returncode == 0:
        return recipe.image
    tarball = ensure_rootfs(recipe, progress)
    progress(f"guardedcron: importing the stand-in base as {recipe.image}")
    run_long_step(
        engine.command("import", *(arg for change in IMAGE_CHANGES for arg in ("--change", change)),
                       str(tarball), recipe.image),
        what="docker import of the stand-in base",
        log_path=tarball.parent / "import.log",
        timeout_s=IMPORT_TIMEOUT_S,
        progress=progress,
        env=engine.env(),
    )
    return recipe.image


def ensure_rootfs(recipe: BaseRecipe, progress: Progress = print) -> Path:
    """The cached root filesystem tarball for `recipe`, made with debootstrap if absent."""
    version_dir = build_cache_root(os.environ) / f"python-base-{recipe.key}"
    tarball = version_dir / ROOTFS_TAR
    build_cached(
        version_dir,
        recipe.stamp,
        lambda wanted: _is_current(version_dir, wanted),
        lambda: _make_rootfs(recipe, version_dir, progress),
    )
    return tarball


def _is_current(version_dir: Path, wanted: dict[str, str]) -> bool:
    try:
        stamp = json.loads((version_dir / STAMP_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return bool(stamp == wanted and (version_dir / ROOTFS_TAR).is_file())


def _make_rootfs(recipe: BaseRecipe, version_dir: Path, progress: Progress) -> None:
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap is missing: run `bash .ci/bootstrap` (it installs Debian's "
                         "debootstrap), needed once to make the stand-in Python base")
    if os.geteuid() != 0:
        raise BuildError("making the stand-in Python base needs root (debootstrap)")
    root = version_dir / "rootfs.partial"
    partial_tar = version_dir / f"{ROOTFS_TAR}.partial"
    log_path = version_dir / BUILD_LOG
    log_path.write_text("")
    remove_tree(root)
    started = time.monotonic()
    progress(f"guardedcron: making a stand-in for python:3.11-slim-{recipe.suite} with debootstrap "
             f"(a minute or two; log: {log_path})")
    try:
        run_long_step(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
             recipe.suite, str(root), recipe.mirror],
            what="debootstrap", log_path=log_path, timeout_s=DEBOOTSTRAP_TIMEOUT_S, progress=progress,
        )  # fmt: skip
        _trim(root)
        shutil.copyfile(recipe.ca_bundle, root / "etc/ssl/certs/ca-certificates.crt")
        run_long_step(
            ["tar", "--numeric-owner", "-C", str(root), "-cf", str(partial_tar), "."],
            what="packing the stand-in base", log_path=log_path, timeout_s=IMPORT_TIMEOUT_S,
            progress=progress,
        )  # fmt: skip
        os.replace(partial_tar, version_dir / ROOTFS_TAR)
    finally:
        remove_tree(root)
        partial_tar.unlink(missing_ok=True)
    progress(f"guardedcron: stand-in base ready in {time.monotonic() - started:.0f} s "
             f"({version_dir / ROOTFS_TAR})")


def _trim(root: Path) -> None:
    for relative in TRIMMED:
        folder = root / relative
        if folder.is_dir():
            for child in folder.iterdir():
                _remove(child)
    for doc in (root / "usr/share/doc").glob("*/*"):
        if doc.name != "copyright":
            _remove(doc)
    # The engine provides /dev at run time; debootstrap's device nodes need not ship.
    for entry in (root / "dev").iterdir():
        _remove(entry)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        remove_tree(path)
    else:
        path.unlink()


def mounts_under(folder: Path) -> list[str]:
    """Mount points at or below `folder` (debootstrap mounts /proc, and in some
    containers binds /dev, inside its target while it works)."""
    prefix = str(folder.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return points


def remove_tree(folder: Path) -> None:
    """Remove a folder debootstrap may have worked in: unmount what it left mounted first,
    and refuse to remove anything while a mount remains (it could be the host's /dev)."""
    if not folder.exists() and not folder.is_symlink():
        return
    for point in sorted(mounts_under(folder), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True, timeout=60, check=False)
    left = mounts_under(folder)
    if left:
        raise BuildError(f"cannot remove {folder}: still mounted under it: {', '.join(left)}")
    shutil.rmtree(folder)
