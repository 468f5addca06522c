"""$KUBEBUILDER_ASSETS: a user's envtest binaries are used, not built again.

The assets folder here holds links to the cached real etcd, kube-apiserver and kubectl
(what setup-envtest installs). ensure_binaries must use them as they are, build only
kube-controller-manager (envtest ships none), and the control plane made of the mix
must work: the namespace's default service account is made by the controller-manager.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from guardedcron_devenv.binaries import ASSETS_ENV, Paths, assets_link_dir, build_cache_root, ensure_binaries
from guardedcron_devenv.controlplane import ControlPlane
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e
# Linking kube-controller-manager from the warm Go build cache the session's own build
# left: about a minute on two idle cores, several on busy ones.
BUILD_BOUND_S = 900


@pytest.mark.timeout(BUILD_BOUND_S)
def test_envtest_binaries_are_used_and_the_controller_manager_is_built_beside_them(
    kube_binaries: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    assets = tmp_path / "k8s" / "1.35.8-linux-amd64"
    assets.mkdir(parents=True)
    for binary in (kube_binaries.etcd, kube_binaries.kube_apiserver, kube_binaries.kubectl):
        (assets / binary.name).symlink_to(binary)
    monkeypatch.setenv(ASSETS_ENV, str(assets))
    lines: list[str] = []

    paths = ensure_binaries(progress=lines.append)

    assert paths.bin_dir == assets_link_dir(build_cache_root(os.environ), assets)
    for used in ("etcd", "kube-apiserver", "kubectl"):
        assert (paths.bin_dir / used).resolve() == (assets / used).resolve()
    built = paths.kube_controller_manager.resolve()
    assert built != kube_binaries.kube_controller_manager.resolve()
    assert built.parent.parent.name.startswith("prebuilt-companions-") and built.stat().st_size > 0
    assert paths.kubernetes_version == kube_binaries.kubernetes_version  # read from the binary
    assert paths.etcd_version == kube_binaries.etcd_version
    [said] = [line for line in lines if ASSETS_ENV in line]
    assert str(assets) in said and "kube-controller-manager (not in envtest's assets)" in said

    with ControlPlane(paths, name="envtest-assets", logs_dir=tmp_path / "logs",
                      progress=lambda line: None) as plane:
        plane.kubectl("create", "namespace", "from-assets")
        wait_for("the controller-manager made the default service account",
                 lambda: plane.kubectl("get", "serviceaccount", "default", "-n", "from-assets",
                                       check=False).returncode == 0)
