"""The declared minimum version of every runtime dependency is enough.

pyproject.toml's floors are promises: `pip install guardedcron` may pick any version at
or above them. This installs exactly the floors (pip, from the package index, into a
fresh venv; wheels only, as the image installs them) and runs
tests/packaging/minimum_versions_probe.py there: every runtime module imports, the
metrics server serves, the CLI logs in through an exec credential plugin, the JSON log
format works and `--version` answers. A floor set too low (prometheus-client 0.20 had
no prometheus_client.aiohttp) fails here.

The venv is cached under ~/.cache/guardedcron, keyed by the pins and the Python version,
so only a changed floor pays for the install again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from guardedcron_devenv.binaries import build_cache_root, exclusive_lock

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("minimum_versions_probe.py")
FLOOR_OPERATORS = (">=", "==", "~=")
# Bounds: one pip install of a dozen wheels, and the probe.
INSTALL_TIMEOUT_S = 600.0
PROBE_TIMEOUT_S = 120.0


def minimum_pins(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """`name[extras]==floor` for every runtime dependency; one without a floor is an error."""
    pins = []
    for line in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        requirement = Requirement(line)
        floors = [spec.version for spec in requirement.specifier if spec.operator in FLOOR_OPERATORS]
        assert len(floors) == 1, f"{line!r} must declare one minimum version (>=)"
        extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
        pins.append(f"{requirement.name}{extras}=={floors[0]}")
    return sorted(pins)


def minimum_venv(pins: list[str]) -> Path:
    """A venv with exactly `pins` installed, made once per set of pins and Python version."""
    key = hashlib.sha256("\n".join([sys.version, *pins]).encode()).hexdigest()[:16]
    root = build_cache_root(os.environ) / f"minimum-deps-{key}"
    venv, done = root / "venv", root / "installed.json"
    root.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(root / ".lock"):
        if done.is_file():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=INSTALL_TIMEOUT_S)
        install = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q",
             "--only-binary=:all:", *pins],
            capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
        assert install.returncode == 0, f"pip could not install the floors {pins}:\n{install.stderr}"
        done.write_text(json.dumps(pins) + "\n")
    return venv


def installed_versions(venv: Path) -> dict[str, str]:
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json"],
                            capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=True)
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(listed.stdout)}


def test_every_runtime_dependency_has_a_floor_and_the_known_ones_are_right() -> None:
    pins = minimum_pins()
    names = {pin.split("==")[0].split("[")[0].lower() for pin in pins}
    assert names >= {"kopf", "aiohttp", "prometheus-client", "psycopg", "pyyaml", "kubernetes"}
    # prometheus_client.aiohttp, which serves /metrics, first shipped in 0.24.
    assert "prometheus-client==0.24" in pins


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 2 * PROBE_TIMEOUT_S)
def test_the_operator_and_the_cli_work_on_the_minimum_versions(tmp_path: Path) -> None:
    pins = minimum_pins()
    venv = minimum_venv(pins)
    versions = installed_versions(venv)
    for pin in pins:
        name, floor = pin.split("==")
        installed = versions[name.split("[")[0].lower().replace("_", "-")]
        assert Requirement(f"x=={floor}").specifier.contains(installed), (pin, installed)
    assert "guardedcron" not in versions  # the source tree below is what runs

    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(REPO / "operator")}
    probe = subprocess.run([str(venv / "bin" / "python"), str(PROBE)], capture_output=True, text=True,
                           env=env, timeout=PROBE_TIMEOUT_S, check=False)
    assert probe.returncode == 0, f"on {pins}:\n{probe.stderr}"
    report = json.loads(probe.stdout)
    assert {"guardedcron.handlers.registry", "guardedcron.cli.operator", "guardedcron.cli.kubeconfig",
            "guardedcron.observability.metrics", "guardedcron.guard.lease"} <= set(report["modules"])
    [series] = [line for line in report["metrics"].splitlines()
                if line.startswith("guardedcron_suspended_after_failures{")]
    assert 'namespace="billing"' in series and 'name="nightly"' in series and series.endswith(" 1.0")
    assert report["login"] == {"server": "https://127.0.0.1:6443", "scheme": "Bearer",
                               "token": "probe-token", "namespace": "team-a"}
    assert (report["log"]["message"], report["log"]["namespace"], report["log"]["name"]) == (
        "probe", "billing", "nightly")
    assert report["version"].startswith("guardedcron ")
