"""Container images for a real node without a registry or a Docker engine.

containerd imports the archive format `docker save` writes (a manifest.json naming the
config and layer tars). The node needs one image before anything else: the pod sandbox
("pause") image, whose only job is to hold the pod's namespaces open. We make it, and
small test images, from files of this machine (busybox from Debian's `busybox-static`).
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

BUSYBOX: Final = Path("/bin/busybox")
# Commands a test image offers, each a link to busybox.
BUSYBOX_APPLETS: Final = (
    "sh", "sleep", "cat", "echo", "nc", "wget", "true", "false", "env", "ls", "test", "touch",
)
PAUSE_IMAGE: Final = "guardedcron.local/pause:1"
BUSYBOX_IMAGE: Final = "guardedcron.local/busybox:1"
# pause: sleep for about 68 years; the kubelet kills the sandbox when the pod ends.
PAUSE_COMMAND: Final = ("/bin/busybox", "sleep", "2147483647")
IMPORT_TIMEOUT_SECONDS: Final = 300.0


class ImageError(RuntimeError):
    """An image could not be made or imported; the message says which and why."""


@dataclass(frozen=True)
class ImageFile:
    path: str  # absolute path inside the image
    content: bytes
    mode: int = 0o755


def busybox_files() -> list[ImageFile]:
    if not BUSYBOX.is_file():
        raise ImageError(
            f"{BUSYBOX} is missing: the node's images are made from Debian's busybox-static "
            "package (`bash .ci/bootstrap` installs it)"
        )
    return [ImageFile("/bin/busybox", BUSYBOX.read_bytes())]


def build_image_archive(
    tag: str, files: Sequence[ImageFile], command: Sequence[str], links: Mapping[str, str] | None = None
) -> bytes:
    """A one-layer image in `docker save` form: `tag` runs `command` as root (uid 0)."""
    layer = _layer_tar(files, links or {})
    layer_id = hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": list(command), "Env": ["PATH=/bin"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_id}"]},
        },
        sort_keys=True,
    ).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [tag], "Layers": [f"{layer_id}/layer.tar"]}]
    ).encode()
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        _add(tar, config_name, config, 0o644)
        _add(tar, f"{layer_id}/layer.tar", layer, 0o644)
        _add(tar, "manifest.json", manifest, 0o644)
    return archive.getvalue()


def busybox_image(tag: str, command: Sequence[str]) -> bytes:
    links = {f"/bin/{applet}": "busybox" for applet in BUSYBOX_APPLETS}
    return build_image_archive(tag, busybox_files(), command, links)


def import_image(ctr: str, address: str, archive: bytes) -> None:
    """Load an archive into containerd's Kubernetes namespace, where the kubelet finds it."""
    result = subprocess.run(
        [ctr, "--address", address, "--namespace", "k8s.io", "images", "import", "-"],
        input=archive, capture_output=True, timeout=IMPORT_TIMEOUT_SECONDS, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise ImageError(f"ctr images import failed: {result.stderr.decode(errors='replace').strip()}")


def import_saved_image(
    ctr: str, address: str, save_command: Sequence[str], env: Mapping[str, str] | None = None
) -> None:
    """Stream `save_command`'s output (e.g. `docker save TAG`) into containerd, no temp file."""
    with subprocess.Popen(list(save_command), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=None if env is None else dict(env)) as save:  # fmt: skip
        assert save.stdout is not None
        try:
            result = subprocess.run(
                [ctr, "--address", address, "--namespace", "k8s.io", "images", "import", "-"],
                stdin=save.stdout, capture_output=True, timeout=IMPORT_TIMEOUT_SECONDS, check=False,
            )  # fmt: skip
        finally:
            save.stdout.close()
            try:
                save.wait(timeout=IMPORT_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                save.kill()
                save.wait()
        save_error = save.stderr.read().decode(errors="replace").strip() if save.stderr else ""
    if save.returncode != 0:
        raise ImageError(f"{' '.join(save_command)} failed (exit {save.returncode}): {save_error}")
    if result.returncode != 0:
        raise ImageError(f"ctr images import failed: {result.stderr.decode(errors='replace').strip()}")


def find_ctr() -> str:
    ctr = shutil.which("ctr")
    if ctr is None:
        raise ImageError("ctr is not on PATH: it comes with Debian's containerd package")
    return ctr


def _layer_tar(files: Sequence[ImageFile], links: Mapping[str, str]) -> bytes:
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        folders = sorted({str(Path(f.path).parent) for f in files} | {str(Path(p).parent) for p in links})
        for folder in [*folders, "/tmp"]:
            info = tarfile.TarInfo(folder.lstrip("/"))
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if folder == "/tmp" else 0o755
            tar.addfile(info)
        for image_file in files:
            _add(tar, image_file.path.lstrip("/"), image_file.content, image_file.mode)
        for path, target in sorted(links.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return layer.getvalue()


def _add(tar: tarfile.TarFile, name: str, content: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(content)
    info.mode = mode
    tar.addfile(info, io.BytesIO(content))
