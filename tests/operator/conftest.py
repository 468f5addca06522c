"""Fixtures for the operator's tests: the extended API emulator, a client pointed at it,
a kubeconfig that reaches it (for kopf's login handler), and a clock the test sets.
Helpers that run one pass are in tests/operator/passes.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import kmock
import kopf
import pytest

from guardedcron.kube import KubeClient
from tests.operator.passes import server_url
from tests.support.clock import FakeClock
from tests.support.emulator import GuardedEmulator


@pytest.fixture
async def api() -> AsyncIterator[GuardedEmulator]:
    async with GuardedEmulator() as emulator, kmock.Server(emulator):
        emulator.declare_resources()
        yield emulator


@pytest.fixture
async def client(api: GuardedEmulator) -> AsyncIterator[KubeClient]:
    kube = KubeClient(kopf.ConnectionInfo(server=server_url(api)))
    yield kube
    await kube.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def kubeconfig(api: GuardedEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({  # JSON is YAML
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": server_url(api)}}],
        "users": [{"name": "tester", "user": {"token": "not-checked"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(path))
    yield path
