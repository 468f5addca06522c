"""The binary cache: versions read from our go.mod files, warm reuse, stale detection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guardedcron_devenv import binaries
from guardedcron_devenv.binaries import (
    NODE_TARGETS,
    TARGETS,
    BuildError,
    build_cache_root,
    build_stamp,
    build_version_dir_name,
    ensure_binaries,
    pinned_versions,
    required_version,
    sources_digest,
    target_sources,
)


def test_required_version_reads_block_and_single_line_forms() -> None:
    block = "module x\n\nrequire (\n\tk8s.io/kubernetes v1.35.8\n\tother v1.0.0\n)\n"
    single = "module y\nrequire go.etcd.io/etcd/server/v3 v3.6.16\n"
    assert required_version(block, "k8s.io/kubernetes") == "v1.35.8"
    assert required_version(single, "go.etcd.io/etcd/server/v3") == "v3.6.16"
    with pytest.raises(ValueError, match=r"does not require k8s\.io/kubernetes"):
        required_version(single, "k8s.io/kubernetes")


def test_pinned_versions_come_from_the_committed_go_modules() -> None:
    kube, etcd = pinned_versions()
    assert kube.startswith("v1.3") and int(kube.split(".")[1]) >= 34
    assert etcd.startswith("v3.")
    # etcd older than 3.5.11 lacks the health endpoints Kubernetes >= 1.31 reads.
    minor, patch = (int(part) for part in etcd[1:].split(".")[1:3])
    assert (minor, patch) >= (5, 11)


def test_cache_root_follows_xdg_then_home() -> None:
    assert build_cache_root({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/x/guardedcron")
    assert build_cache_root({"HOME": "/h"}) == Path("/h/.cache/guardedcron")
    assert build_version_dir_name("v1.35.8", "v3.6.16") == "kube-v1.35.8-etcd-v3.6.16"


def _fake_cache(tmp_path: Path, stamp: dict[str, str]) -> Path:
    kube, etcd = pinned_versions()
    bin_dir = tmp_path / "guardedcron" / build_version_dir_name(kube, etcd) / "bin"
    bin_dir.mkdir(parents=True)
    for target in TARGETS:
        (bin_dir / target.name).write_text("#!/bin/sh\n")
        (bin_dir / target.name).chmod(0o755)
    (bin_dir.parent / binaries.STAMP_FILE).write_text(json.dumps(stamp))
    return bin_dir


@pytest.fixture
def no_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache under tmp_path and no Go on PATH: any build attempt fails at once."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv(binaries.REBUILD_ENV, raising=False)


@pytest.mark.usefixtures("no_go")
def test_a_warm_cache_is_reused_without_building(tmp_path: Path) -> None:
    kube, etcd = pinned_versions()
    bin_dir = _fake_cache(tmp_path, build_stamp(sources_digest(only=target_sources(TARGETS)), kube, etcd))
    lines: list[str] = []
    paths = ensure_binaries(progress=lines.append)
    assert paths.kube_apiserver == bin_dir / "kube-apiserver"
    assert (paths.kubernetes_version, paths.etcd_version) == (kube, etcd)
    assert lines == []


@pytest.mark.usefixtures("no_go")
def test_a_stale_stamp_triggers_a_build(tmp_path: Path) -> None:
    kube, etcd = pinned_versions()
    _fake_cache(tmp_path, build_stamp("another digest", kube, etcd))
    with pytest.raises(BuildError, match=r"'go'\) is not on PATH"):
        ensure_binaries(progress=lambda line: None)


@pytest.mark.usefixtures("no_go")
def test_rebuild_can_be_forced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kube, etcd = pinned_versions()
    _fake_cache(tmp_path, build_stamp(sources_digest(only=target_sources(TARGETS)), kube, etcd))
    monkeypatch.setenv(binaries.REBUILD_ENV, "1")
    with pytest.raises(BuildError, match="not on PATH"):
        ensure_binaries(progress=lambda line: None)


def test_each_group_is_keyed_on_its_own_sources_only(tmp_path: Path) -> None:
    """Editing a node main or Toxiproxy must not relink the control plane, and back."""
    root = tmp_path / "go"
    for relative in ("kube/go.mod", "kube/go.sum", "kube/cmd/kube-apiserver/main.go",
                     "kube/cmd/kubelet/main.go", "etcd/main.go", "toxiproxy/main.go"):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(relative)
    plane, node = target_sources(TARGETS), target_sources(NODE_TARGETS)

    def digests() -> tuple[str, str]:
        return sources_digest(root, only=plane), sources_digest(root, only=node)

    before = digests()
    (root / "toxiproxy/main.go").write_text("edited")
    assert digests() == before
    (root / "kube/cmd/kubelet/main.go").write_text("edited")
    after_node_edit = digests()
    assert after_node_edit[0] == before[0] and after_node_edit[1] != before[1]
    (root / "kube/go.sum").write_text("edited")  # shared: both rebuild
    assert all(a != b for a, b in zip(digests(), after_node_edit, strict=True))
