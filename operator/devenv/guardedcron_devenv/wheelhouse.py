"""A folder of wheels for guardedcron's runtime dependencies and its build requirements,
so that the release build and its tests install offline.

    python -m guardedcron_devenv.wheelhouse [--source .]   # prints the folder, downloading once

The set-up step (.ci/bootstrap) runs this while the package index is reachable; later
calls find the folder under ${XDG_CACHE_HOME:-~/.cache}/guardedcron/wheelhouse-<key>/,
where the key hashes the requirements read from pyproject.toml, the Python version and
the platform: a changed pin gets a new folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Final

from guardedcron_devenv.binaries import BuildError, build_cache_root, exclusive_lock

DONE_FILE: Final = "requirements.json"
DOWNLOAD_TIMEOUT_S: Final = 600.0


def wheelhouse_requirements(pyproject: Path) -> list[str]:
    """What an offline build and install need: the build system's requirements and the
    runtime dependencies, as pyproject.toml states them."""
    project = tomllib.loads(pyproject.read_text())
    return sorted([*project["build-system"]["requires"], *project["project"]["dependencies"]])


def wheelhouse_dir(requirements: list[str]) -> Path:
    identity = [sys.version, platform.machine(), *requirements]
    key = hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]
    return build_cache_root(os.environ) / f"wheelhouse-{key}"


def ensure_wheelhouse(pyproject: Path) -> Path:
    """The wheel folder for `pyproject`'s requirements, downloaded by pip the first time."""
    requirements = wheelhouse_requirements(pyproject)
    folder = wheelhouse_dir(requirements)
    done = folder / DONE_FILE
    if done.is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(folder.parent / f".{folder.name}.lock"):
        if done.is_file():  # another process filled it while we waited
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        print(f"guardedcron: downloading the wheels of {len(requirements)} requirements into {folder}",
              file=sys.stderr, flush=True)
        download = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
             "--only-binary=:all:", "--dest", str(folder), *requirements],
            capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False,
        )
        if download.returncode != 0:
            raise BuildError(f"pip could not download {requirements}: {download.stderr.strip()[-800:]}")
        done.write_text(json.dumps(requirements) + "\n")
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m guardedcron_devenv.wheelhouse",
        description="Download the wheels an offline release build and install need (once).",
    )
    parser.add_argument("--source", type=Path, default=Path.cwd(),
                        help="the repository folder holding pyproject.toml (default: the current one)")
    args = parser.parse_args(argv)
    try:
        print(ensure_wheelhouse(args.source.resolve() / "pyproject.toml"))
    except BuildError as error:
        print(f"guardedcron: no wheelhouse: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
