"""Builds and caches the Kubernetes control-plane binaries the e2e tests and the demo run.

No package registry here ships kube-apiserver or etcd, but both are published as Go
modules. Our own tiny modules under `go/` pin one release of each; this module builds
them with the local Go toolchain, once per version, into a cache folder:

    ${XDG_CACHE_HOME:-~/.cache}/guardedcron/kube-<version>-etcd-<version>/bin/   control plane
    ${XDG_CACHE_HOME:-~/.cache}/guardedcron/node-<version>/bin/                  a real node

Each group is keyed on the sources it is built from only, so adding a node binary does
not rebuild the control plane.

A cold build takes many minutes on two cores; each `go build` runs through
long_step.run_long_step, which prints a line every 15 s (what is being built, for how
long, the log's path) and stops a build that passes GO_BUILD_TIMEOUT_S. A warm call only
checks the binaries and the stamp. Delete the folder, or set GUARDEDCRON_REBUILD=1, to
force a rebuild.

Prebuilt envtest binaries: when $KUBEBUILDER_ASSETS names a folder holding executable
`etcd` and `kube-apiserver` (what controller-runtime's setup-envtest installs), those
are used and not built. envtest does not ship kube-controller-manager, which the e2e
tests need (Jobs, garbage collection, service-account tokens), so it is still built from
our pinned module (and kubectl too when the folder has none); the four are linked into
one folder under the cache, keyed by the assets' path.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from guardedcron_devenv.long_step import FAILURE_TAIL_LINES as FAILURE_TAIL_LINES
from guardedcron_devenv.long_step import BuildError as BuildError
from guardedcron_devenv.long_step import Progress as Progress
from guardedcron_devenv.long_step import run_long_step

GO_SOURCES: Final = Path(__file__).resolve().parent / "go"
KUBE_MODULE: Final = "k8s.io/kubernetes"
ETCD_MODULE: Final = "go.etcd.io/etcd/server/v3"
REBUILD_ENV: Final = "GUARDEDCRON_REBUILD"
STAMP_FILE: Final = "stamp.json"
BUILD_LOG: Final = "build.log"
# The bound on one `go build` (one binary): a cold kube-apiserver build takes about ten
# minutes on two busy cores; past an hour something hangs.
GO_BUILD_TIMEOUT_S: Final = 3600.0
ASSETS_ENV: Final = "KUBEBUILDER_ASSETS"
# What envtest's assets must hold for us to use them; kubectl is used when present.
ASSETS_REQUIRED: Final = ("etcd", "kube-apiserver")
VERSION_QUERY_TIMEOUT_S: Final = 30.0


@dataclass(frozen=True)
class BuildTarget:
    name: str  # the binary's file name
    module_dir: str  # folder under go/ holding the go.mod
    package: str  # package path relative to that folder
    tags: tuple[str, ...] = ()  # Go build tags


TARGETS: Final = (
    BuildTarget("etcd", "etcd", "."),
    BuildTarget("kube-apiserver", "kube", "./cmd/kube-apiserver"),
    BuildTarget("kube-controller-manager", "kube", "./cmd/kube-controller-manager"),
    BuildTarget("kubectl", "kube", "./cmd/kubectl"),
)
NODE_TARGETS: Final = (
    BuildTarget("kubelet", "kube", "./cmd/kubelet"),
    BuildTarget("kube-scheduler", "kube", "./cmd/kube-scheduler"),
    BuildTarget("kube-proxy", "kube", "./cmd/kube-proxy"),
)


def target_sources(targets: tuple[BuildTarget, ...]) -> tuple[str, ...]:
    """The files under go/ a group of targets is built from (module files and mains)."""
    sources: set[str] = set()
    for target in targets:
        sources |= {f"{target.module_dir}/go.mod", f"{target.module_dir}/go.sum"}
        if target.package == ".":
            sources.add(f"{target.module_dir}/")
        else:
            sources.add(f"{target.module_dir}/{target.package.removeprefix('./')}/")
    return tuple(sorted(sources))


@dataclass(frozen=True)
class NodeBinaries:
    """kubelet, kube-scheduler and kube-proxy of the control plane's release."""

    bin_dir: Path
    kubernetes_version: str

    @property
    def kubelet(self) -> Path:
        return self.bin_dir / "kubelet"

    @property
    def kube_scheduler(self) -> Path:
        return self.bin_dir / "kube-scheduler"

    @property
    def kube_proxy(self) -> Path:
        return self.bin_dir / "kube-proxy"


@dataclass(frozen=True)
class Paths:
    """Where the built binaries are, and which releases they are."""

    bin_dir: Path
    kubernetes_version: str
    etcd_version: str

    @property
    def etcd(self) -> Path:
        return self.bin_dir / "etcd"

    @property
    def kube_apiserver(self) -> Path:
        return self.bin_dir / "kube-apiserver"

    @property
    def kube_controller_manager(self) -> Path:
        return self.bin_dir / "kube-controller-manager"

    @property
    def kubectl(self) -> Path:
        return self.bin_dir / "kubectl"


def required_version(go_mod_text: str, module: str) -> str:
    """The version a go.mod requires of `module` (single-line or block form)."""
    pattern = rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)"
    match = re.search(pattern, go_mod_text, flags=re.MULTILINE)
    if match is None:
        raise ValueError(f"go.mod does not require {module}")
    return match.group(1)


def build_cache_root(env: dict[str, str] | os._Environ[str]) -> Path:
    """The guardedcron cache folder, following the XDG base-directory convention."""
    xdg = env.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg else Path(env.get("HOME", str(Path.home()))) / ".cache"
    return base / "guardedcron"


def build_version_dir_name(kubernetes_version: str, etcd_version: str) -> str:
    return f"kube-{kubernetes_version}-etcd-{etcd_version}"


def build_stamp(
    sources_digest: str, kubernetes_version: str, etcd_version: str,
    targets: tuple[BuildTarget, ...] = TARGETS,
) -> dict[str, str]:
    """What a build is keyed on: a change to any value makes the cached binaries stale."""
    commands = [
        " ".join(build_go_command(target, Path("bin"), kubernetes_version)) for target in targets
    ]
    return {
        "kubernetes": kubernetes_version,
        "etcd": etcd_version,
        "sources": sources_digest,
        "commands": "; ".join(commands),
    }


def build_version_ldflags(kubernetes_version: str) -> list[str]:
    """Linker flags that stamp the release into Kubernetes binaries, as its own build does.

    Without them `/version` and `kubectl version` report v0.0.0-master, which clients
    that check the server's version would misread.
    """
    major, minor = kubernetes_version.removeprefix("v").split(".")[:2]
    values = {
        "gitVersion": kubernetes_version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
    }
    return [
        f"-X {package}.{name}={value}"
        for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for name, value in values.items()
    ]


def build_go_command(target: BuildTarget, out_dir: Path, kubernetes_version: str) -> list[str]:
    ldflags = ["-s", "-w"]
    if target.module_dir == "kube":
        ldflags += build_version_ldflags(kubernetes_version)
    tags = [f"-tags={','.join(target.tags)}"] if target.tags else []
    return [
        "go", "build", "-trimpath", *tags, f"-ldflags={' '.join(ldflags)}",
        "-o", str(out_dir / target.name), target.package,
    ]  # fmt: skip


def build_go_env(base: dict[str, str] | os._Environ[str], cache_root: Path) -> dict[str, str]:
    env = dict(base)
    env["GOCACHE"] = str(cache_root / "go-build")
    # -mod=mod lets go fill go.sum gaps itself; buildvcs is off because the module sits
    # in our git checkout and the binaries need no VCS stamp.
    env["GOFLAGS"] = "-mod=mod -buildvcs=false"
    # Static binaries, as Kubernetes' own release builds are; no C toolchain needed.
    env["CGO_ENABLED"] = "0"
    return env


def sources_digest(root: Path = GO_SOURCES, only: tuple[str, ...] = ("",)) -> str:
    """A digest of our Go sources under `root` (those whose relative path starts with one
    of `only`), so editing a main or go.mod rebuilds what is built from it."""
    digest = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.is_file())
    for path in files:
        relative = str(path.relative_to(root))
        if not relative.startswith(only):
            continue
        digest.update(relative.encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def pinned_versions(root: Path = GO_SOURCES) -> tuple[str, str]:
    kube = required_version((root / "kube" / "go.mod").read_text(), KUBE_MODULE)
    etcd = required_version((root / "etcd" / "go.mod").read_text(), ETCD_MODULE)
    return kube, etcd


def ensure_binaries(progress: Progress = print) -> Paths:
    """Return the cached binaries, building them first if absent, stale or forced; with
    $KUBEBUILDER_ASSETS, envtest's etcd and kube-apiserver instead of building them."""
    kube_version, etcd_version = pinned_versions()
    cache_root = build_cache_root(os.environ)
    assets = prebuilt_assets(os.environ)
    if assets is not None:
        return _with_prebuilt(assets, kube_version, cache_root, progress)
    version_dir = cache_root / build_version_dir_name(kube_version, etcd_version)
    paths = Paths(version_dir / "bin", kube_version, etcd_version)
    build_cached(
        version_dir,
        lambda: build_stamp(
            sources_digest(only=target_sources(TARGETS)), kube_version, etcd_version
        ),
        lambda wanted: binaries_current(paths.bin_dir, TARGETS, wanted),
        lambda: build_targets(TARGETS, paths.bin_dir, kube_version, cache_root, progress),
    )
    return paths


def prebuilt_assets(env: dict[str, str] | os._Environ[str]) -> Path | None:
    """The envtest folder $KUBEBUILDER_ASSETS names, None when unset; a folder without an
    executable etcd and kube-apiserver is an error (the variable says to use it)."""
    value = env.get(ASSETS_ENV, "")
    if not value:
        return None
    folder = Path(value)
    missing = [name for name in ASSETS_REQUIRED if not os.access(folder / name, os.X_OK)]
    if missing:
        raise BuildError(
            f"${ASSETS_ENV} is {folder}, which holds no executable {' or '.join(missing)}; "
            f"point it at a folder with etcd and kube-apiserver (setup-envtest's), or unset it "
            "to build them from the pinned Go modules"
        )
    return folder


def assets_link_dir(cache_root: Path, assets: Path) -> Path:
    """Where the envtest binaries and the ones built beside them are linked together."""
    key = hashlib.sha256(str(assets.resolve()).encode()).hexdigest()[:12]
    return cache_root / f"kubebuilder-assets-{key}" / "bin"


def _with_prebuilt(assets: Path, kube_version: str, cache_root: Path, progress: Progress) -> Paths:
    by_name = {t.name: t for t in TARGETS}
    has_kubectl = os.access(assets / "kubectl", os.X_OK)
    # envtest never ships kube-controller-manager; kubectl only in some releases.
    built = (by_name["kube-controller-manager"],) + (() if has_kubectl else (by_name["kubectl"],))
    names = " and ".join(t.name for t in built)
    apiserver_version = _reported_version(assets / "kube-apiserver", r"v\d+\.\d+\.\d+\S*")
    etcd_version = "v" + _reported_version(assets / "etcd", r"etcd Version: v?(\S+)")
    progress(
        f"guardedcron: etcd {etcd_version} and kube-apiserver {apiserver_version} from "
        f"${ASSETS_ENV} ({assets}); {names} (not in envtest's assets) from Go modules, "
        f"Kubernetes {kube_version}"
    )
    version_dir = cache_root / f"prebuilt-companions-{kube_version}"
    companions = version_dir / "bin"
    build_cached(
        version_dir,
        lambda: build_stamp(sources_digest(only=target_sources(built)), kube_version, "", built),
        lambda wanted: binaries_current(companions, built, wanted),
        lambda: build_targets(built, companions, kube_version, cache_root, progress),
    )
    link_dir = assets_link_dir(cache_root, assets)
    link_dir.mkdir(parents=True, exist_ok=True)
    sources = {name: assets / name for name in (*ASSETS_REQUIRED, *(("kubectl",) if has_kubectl else ()))}
    sources |= {t.name: companions / t.name for t in built}
    for name, source in sources.items():
        _link(link_dir / name, source)
    return Paths(link_dir, apiserver_version, etcd_version)


def _link(link: Path, target: Path) -> None:
    """Point `link` at `target`, replacing what was there in one step."""
    partial = link.with_name(f".{link.name}.partial")
    partial.unlink(missing_ok=True)
    partial.symlink_to(target.resolve())
    os.replace(partial, link)


def _reported_version(binary: Path, pattern: str) -> str:
    """The version a binary prints for --version (first match of `pattern`'s group or
    whole match)."""
    try:
        result = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                                timeout=VERSION_QUERY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BuildError(f"{binary} --version did not answer: {error}") from None
    match = re.search(pattern, result.stdout + result.stderr)
    if result.returncode != 0 or match is None:
        raise BuildError(f"{binary} --version (exit {result.returncode}) printed no version: "
                         f"{(result.stdout + result.stderr).strip()[:200]!r}")
    return match.group(1) if match.groups() else match.group(0)


def ensure_node_binaries(progress: Progress = print) -> NodeBinaries:
    """kubelet, kube-scheduler and kube-proxy, cached like the control plane's binaries."""
    kube_version, _ = pinned_versions()
    cache_root = build_cache_root(os.environ)
    version_dir = cache_root / f"node-{kube_version}"
    node = NodeBinaries(version_dir / "bin", kube_version)
    build_cached(
        version_dir,
        lambda: build_stamp(
            sources_digest(only=target_sources(NODE_TARGETS)), kube_version, "", NODE_TARGETS
        ),
        lambda wanted: binaries_current(node.bin_dir, NODE_TARGETS, wanted),
        lambda: build_targets(NODE_TARGETS, node.bin_dir, kube_version, cache_root, progress),
    )
    return node


def build_cached(
    version_dir: Path,
    stamp: Callable[[], dict[str, str]],
    is_current: Callable[[dict[str, str]], bool],
    build: Callable[[], None],
) -> None:
    """The cache protocol of every Go-built tool: reuse the build when its stamp matches
    (unless GUARDEDCRON_REBUILD is set), else build under a file lock and write the stamp."""
    wanted = stamp()
    forced = os.environ.get(REBUILD_ENV, "") not in ("", "0")
    if not forced and is_current(wanted):
        return
    version_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(version_dir / ".lock"):
        # Another process may have finished the same build while we waited for the lock.
        if not forced and is_current(wanted):
            return
        build()
        # Stamp again: with -mod=mod go may have completed go.sum during the build.
        (version_dir / STAMP_FILE).write_text(json.dumps(stamp(), indent=2) + "\n")


def binaries_current(bin_dir: Path, targets: tuple[BuildTarget, ...], wanted: dict[str, str]) -> bool:
    """The stamp beside `bin_dir` says `wanted` and every target's binary is executable."""
    stamp_path = bin_dir.parent / STAMP_FILE
    if not stamp_path.is_file():
        return False
    try:
        stamp = json.loads(stamp_path.read_text())
    except json.JSONDecodeError:
        return False
    binaries_present = all(os.access(bin_dir / t.name, os.X_OK) for t in targets)
    return bool(stamp == wanted and binaries_present)


@contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_targets(
    targets: tuple[BuildTarget, ...], bin_dir: Path, kubernetes_version: str, cache_root: Path,
    progress: Progress, release: str = "",
) -> None:
    """Build `targets` into `bin_dir` with progress lines (also the Go tools' build, whose
    `release` names what a missing Go would have built instead of a Kubernetes release)."""
    names = ", ".join(t.name for t in targets)
    if shutil.which("go") is None:
        raise BuildError(
            f"the Go toolchain ('go') is not on PATH; it is needed once to build {names} "
            f"({release or f'Kubernetes {kubernetes_version}'})"
        )
    # Build into a scratch folder and move each binary in only when it is complete, so
    # an interrupted build never leaves a half-written binary that looks usable.
    scratch = bin_dir.parent / "bin.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    env = build_go_env(os.environ, cache_root)
    log_path = bin_dir.parent / BUILD_LOG
    log_path.write_text("")
    total_started = time.monotonic()
    for index, target in enumerate(targets, start=1):
        progress(
            f"guardedcron: building {target.name} ({index}/{len(targets)}) from Go modules "
            f"(minutes on a cold cache; log: {log_path})..."
        )
        started = time.monotonic()
        _run_go_build(target, scratch, kubernetes_version, env, log_path, progress)
        os.replace(scratch / target.name, bin_dir / target.name)
        progress(f"guardedcron: built {target.name} in {time.monotonic() - started:.0f} s")
    shutil.rmtree(scratch, ignore_errors=True)
    progress(f"guardedcron: {names} ready in {bin_dir} ({time.monotonic() - total_started:.0f} s)")


def _run_go_build(
    target: BuildTarget, out_dir: Path, kubernetes_version: str, env: dict[str, str], log_path: Path,
    progress: Progress,
) -> None:
    run_long_step(
        build_go_command(target, out_dir, kubernetes_version),
        what=f"building {target.name}", log_path=log_path, timeout_s=GO_BUILD_TIMEOUT_S,
        progress=progress, env=env, cwd=GO_SOURCES / target.module_dir,
    )  # fmt: skip


@dataclass(frozen=True)
class GoTool:
    """A third-party command built unchanged from our tiny module under go/, whose `tool`
    directive pins one release of `module` (promtool.py, actionlint.py). It is cached in

        ${XDG_CACHE_HOME:-~/.cache}/guardedcron/<name>-<version>/bin/<name>

    keyed by that release and the digest of the tiny module's files."""

    target: BuildTarget  # module_dir is also the name of the guardedcron_devenv module
    module: str  # the Go module whose release our go.mod pins
    stamp_key: str  # the stamp's name for that release
    release_name: str  # how messages name the release: "<release_name> <version>"

    @property
    def sources(self) -> Path:
        return GO_SOURCES / self.target.module_dir


def go_tool_version(tool: GoTool) -> str:
    """The release of the tool's Go module that our go.mod pins."""
    return required_version((tool.sources / "go.mod").read_text(), tool.module)


def go_tool_stamp(tool: GoTool, sources: str, version: str) -> dict[str, str]:
    """What a tool's build is keyed on: a change to any value makes the cached binary stale."""
    return {
        tool.stamp_key: version,
        "sources": sources,
        "command": " ".join(build_go_command(tool.target, Path("bin"), version)),
    }


def ensure_go_tool(tool: GoTool, progress: Progress = print) -> Path:
    """Return the tool's cached binary, building it first if absent, stale or forced."""
    version = go_tool_version(tool)
    cache_root = build_cache_root(os.environ)
    version_dir = cache_root / f"{tool.target.name}-{version}"
    bin_dir = version_dir / "bin"
    build_cached(
        version_dir,
        lambda: go_tool_stamp(tool, sources_digest(only=(f"{tool.target.module_dir}/",)), version),
        lambda wanted: binaries_current(bin_dir, (tool.target,), wanted),
        lambda: build_targets((tool.target,), bin_dir, version, cache_root, progress,
                              release=f"{tool.release_name} {version}"),
    )
    return bin_dir / tool.target.name


def go_tool_main(tool: GoTool, argv: list[str] | None = None) -> None:
    """`python -m guardedcron_devenv.<module_dir> <name>`: build (or reuse), print the path."""
    args = sys.argv[1:] if argv is None else argv
    name = tool.target.name
    if args != [name]:
        raise SystemExit(f"usage: python -m guardedcron_devenv.{tool.target.module_dir} {name}")
    # Progress goes to stderr so stdout is the path alone, usable as $(...).
    print(ensure_go_tool(tool, lambda line: print(line, file=sys.stderr)))


def main() -> None:
    """`python -m guardedcron_devenv.binaries`: build (or reuse) and print the folders."""
    print(ensure_binaries().bin_dir)
    print(ensure_node_binaries().bin_dir)


if __name__ == "__main__":
    main()
