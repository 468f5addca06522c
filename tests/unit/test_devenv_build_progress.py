"""Go builds say what they are doing while they run, and $KUBEBUILDER_ASSETS is checked.

The builds go through long_step.run_long_step, the image builds' helper: here a slow
stand-in for `go` (first on PATH) plays the compiler, so the lines a person sees during
a cold build are checked without one. The pulse period is shortened for the test; the
15 s period itself is asserted as a constant.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from guardedcron_devenv import binaries, long_step
from guardedcron_devenv.binaries import ASSETS_ENV, BuildError, BuildTarget, build_targets, prebuilt_assets

FAKE_TARGETS = (BuildTarget("kube-apiserver", "kube", "./cmd/kube-apiserver"),
                BuildTarget("kube-controller-manager", "kube", "./cmd/kube-controller-manager"))


def fake_go(folder: Path, body: str) -> dict[str, str]:
    """An environment whose `go` is a shell script: `$out` is the -o argument."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "go"
    script.write_text('#!/bin/sh\nout=""\nprev=""\nfor a in "$@"; do [ "$prev" = "-o" ] && out="$a"; '
                      f'prev="$a"; done\n{body}\n')
    script.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def test_the_pulse_is_at_most_15_seconds() -> None:
    assert long_step.PULSE_S <= 15.0
    assert binaries.GO_BUILD_TIMEOUT_S == 3600.0  # the bound docs/design.md states


def test_a_slow_go_build_prints_what_how_long_and_where_the_log_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in fake_go(tmp_path / "fake", 'echo "compiling $out"; sleep 3.5; '
                              'echo "linking"; echo binary > "$out"').items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(long_step, "PULSE_S", 1.0)
    lines: list[str] = []
    bin_dir = tmp_path / "cache" / "bin"
    build_targets(FAKE_TARGETS[:1], bin_dir, "v1.35.8", tmp_path / "cache", lines.append)

    log_path = bin_dir.parent / binaries.BUILD_LOG
    pulses = [line for line in lines if "still running" in line]
    assert len(pulses) >= 2, lines
    for line in pulses:
        assert line.startswith("guardedcron: building kube-apiserver: still running after "), line
        assert f"(log: {log_path})" in line and "compiling" in line, line
    assert lines[0].startswith("guardedcron: building kube-apiserver (1/1)") and str(log_path) in lines[0]
    assert (bin_dir / "kube-apiserver").read_text() == "binary\n"
    assert "linking" in log_path.read_text()


def test_a_failing_go_build_names_its_log_and_shows_its_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in fake_go(tmp_path / "fake", 'echo "undefined: apiserver.Run" >&2; exit 2').items():
        monkeypatch.setenv(key, value)
    with pytest.raises(BuildError) as raised:
        build_targets(FAKE_TARGETS, tmp_path / "cache" / "bin", "v1.35.8", tmp_path / "cache",
                      lambda line: None)
    message = str(raised.value)
    log_path = tmp_path / "cache" / binaries.BUILD_LOG
    assert message.startswith(f"building kube-apiserver failed (exit 2); full log: {log_path}"), message
    assert "undefined: apiserver.Run" in message
    assert not (tmp_path / "cache" / "bin" / "kube-apiserver").exists()


def test_kubebuilder_assets_without_etcd_and_kube_apiserver_is_refused(tmp_path: Path) -> None:
    assert prebuilt_assets({}) is None
    assert prebuilt_assets({ASSETS_ENV: ""}) is None
    (tmp_path / "kube-apiserver").write_text("#!/bin/sh\n")
    (tmp_path / "kube-apiserver").chmod(0o755)
    with pytest.raises(BuildError) as raised:
        prebuilt_assets({ASSETS_ENV: str(tmp_path)})
    assert str(raised.value).startswith(f"${ASSETS_ENV} is {tmp_path}, which holds no executable etcd;")
    (tmp_path / "etcd").write_text("not executable")
    with pytest.raises(BuildError, match="no executable etcd"):
        prebuilt_assets({ASSETS_ENV: str(tmp_path)})
    (tmp_path / "etcd").chmod(0o755)
    assert prebuilt_assets({ASSETS_ENV: str(tmp_path)}) == tmp_path


def test_the_toxiproxy_build_pulses_the_same_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from guardedcron_devenv import toxiproxy

    for key, value in fake_go(tmp_path / "fake", 'echo "compiling"; sleep 2.5; echo binary > "$out"').items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(long_step, "PULSE_S", 1.0)
    lines: list[str] = []
    binary = tmp_path / "cache" / "bin" / toxiproxy.BINARY_NAME
    toxiproxy._build(binary, "v2.5.0", tmp_path / "cache", lines.append)
    log_path = tmp_path / "cache" / binaries.BUILD_LOG
    pulses = [line for line in lines if "still running" in line]
    assert pulses and all(line.startswith("guardedcron: building toxiproxy: still running after ")
                          and f"(log: {log_path})" in line for line in pulses), lines
    assert binary.read_text() == "binary\n"
