"""helm and kubectl come from a pinned PyPI wheel, checked, cached by version."""

from __future__ import annotations

import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from guardedcron_devenv import tools


def test_cache_folder_follows_xdg_and_is_keyed_by_version() -> None:
    home = Path("/home/someone")
    assert tools.build_tools_dir({}, home) == (
        home / ".cache" / "guardedcron" / "tools-helm-4.1.4-kubectl-1.35.2"
    )
    assert tools.build_tools_dir({"XDG_CACHE_HOME": "/var/cache/x"}, home) == Path(
        "/var/cache/x/guardedcron/tools-helm-4.1.4-kubectl-1.35.2"
    )
    assert tools.build_tools_dir({"XDG_CACHE_HOME": ""}, home).parts[:4] == (
        "/", "home", "someone", ".cache"
    )


def test_helm_is_the_pinned_version() -> None:
    helm = tools.ensure_helm()
    out = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    assert out.startswith(f"v{tools.HELM.version}")


def test_kubectl_is_the_pinned_version() -> None:
    kubectl = tools.ensure_kubectl()
    out = subprocess.run([str(kubectl), "version", "--client"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    assert f"v{tools.KUBECTL.version}" in out


def test_warm_calls_reuse_the_cache() -> None:
    first = tools.ensure_helm()
    started = time.perf_counter()
    assert tools.ensure_helm() == first
    assert time.perf_counter() - started < 0.5


def test_a_wheel_without_the_layer_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("fake/__init__.py", "")
    with pytest.raises(tools.ToolInstallError, match="0 jsii tarballs"):
        tools._extract_layer_zip(wheel, tmp_path / "layer.zip")


def test_command_line_names_the_tools(capsys: pytest.CaptureFixture[str]) -> None:
    assert tools.main(["oc"]) == 64
    assert "helm|kubectl" in capsys.readouterr().err
    assert tools.main(["helm"]) == 0
    assert capsys.readouterr().out.strip().endswith("/bin/helm")
