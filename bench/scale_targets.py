"""Where bench/operator_scale.py runs the operator: a real control plane, or the emulator.

Both give the benchmark the same things: a kubeconfig for the operator's process, a way
to create the GuardedCronJobs, live counts of applied CronJobs and Ready statuses, and
the requests served since a mark, split into reads and writes by (verb, resource,
subresource), so an unexpected write can be told apart from another.

- `RealApiServer`: etcd, kube-apiserver and kube-controller-manager from
  guardedcron_devenv (binaries built from Go, cached in ~/.cache/guardedcron). Requests
  are counted by the API server itself (`apiserver_request_total` on its /metrics), for
  the resources the operator writes; the benchmark's own watches are not counted
  (a watch is counted when it ends, and they end after the last count). The counts
  include the control plane's own writes to those resources: the schedules used here
  fire on the 1st of January only, so the CronJob controller has nothing to write.
- `Emulator`: kmock (tests/support/emulator.py) in the benchmark's process.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import kopf

from guardedcron import contract
from guardedcron.kube import CRONJOBS, GUARDED_CRONJOBS, KubeClient, Resource
from guardedcron_devenv.controlplane import ControlPlane

CRD_DIR = Path(__file__).resolve().parent.parent / "crds"
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
# What the operator writes; a write to anything else is not the operator's.
COUNTED_RESOURCES = ("guardedcronjobs", "cronjobs", "events")
READ_VERBS = frozenset({"GET", "LIST", "WATCH", "CONNECT"})
SEED_CONCURRENCY = 16
REQUEST_LINE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')

Tally = Counter[str]  # "VERB resource[/subresource]" -> requests


class Target(Protocol):
    kubeconfig: Path

    async def seed(self, objects: Sequence[dict[str, Any]]) -> None: ...
    def applied(self) -> int: ...
    def ready(self) -> int: ...
    async def tally(self) -> Tally: ...


def is_ready(obj: Mapping[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def split(tally: Tally, objects: int) -> dict[str, Any]:
    """Reads and writes of a tally (a difference of two), with per-object rates."""
    reads = {k: v for k, v in tally.items() if k.split()[0] in READ_VERBS and v}
    writes = {k: v for k, v in tally.items() if k.split()[0] not in READ_VERBS and v}
    return {
        "reads": sum(reads.values()), "writes": sum(writes.values()),
        "reads_per_object": round(sum(reads.values()) / objects, 3),
        "writes_per_object": round(sum(writes.values()) / objects, 3),
        "reads_by_kind": dict(sorted(reads.items())), "writes_by_kind": dict(sorted(writes.items())),
    }


class RealApiServer:
    """A real control plane; call inside `async with`."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.kubeconfig = plane.kubeconfig
        self.info = kopf.ConnectionInfo(server=plane.server, ca_path=str(plane.ca_file),
                                        certificate_path=str(plane.admin_cert_file),
                                        private_key_path=str(plane.admin_key_file))
        self.client = KubeClient(self.info)
        self._ready: dict[str, bool] = {}
        self._cronjobs: set[str] = set()
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> RealApiServer:
        tls = ssl.create_default_context(cafile=str(self.plane.ca_file))
        tls.load_cert_chain(str(self.plane.admin_cert_file), str(self.plane.admin_key_file))
        self._session = await self._stack.enter_async_context(aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=tls), timeout=aiohttp.ClientTimeout(total=None)))
        self._stack.push_async_callback(self.client.close)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in getattr(self, "_watches", ()):
            task.cancel()
        await self._stack.aclose()

    async def seed(self, objects: Sequence[dict[str, Any]]) -> None:
        self.plane.kubectl("apply", "-f", str(CRD_DIR))
        self.plane.wait_established(f"{contract.PLURAL}.{contract.API_GROUP}")
        namespaces = sorted({o["metadata"]["namespace"] for o in objects})
        await self._all([self.client.create(NAMESPACES, None, {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}) for ns in namespaces])
        await self._all([self.client.create(GUARDED_CRONJOBS, o["metadata"]["namespace"], o)
                         for o in objects])
        self._watches = [asyncio.create_task(self._watch(GUARDED_CRONJOBS, self._on_gcj)),
                         asyncio.create_task(self._watch(CRONJOBS, self._on_cronjob))]

    @staticmethod
    async def _all(calls: Sequence[Any]) -> None:
        gate = asyncio.Semaphore(SEED_CONCURRENCY)

        async def one(call: Any) -> None:
            async with gate:
                await call

        await asyncio.gather(*(one(c) for c in calls))

    def _on_gcj(self, kind: str, obj: Mapping[str, Any]) -> None:
        uid = obj["metadata"]["uid"]
        if kind == "DELETED":
            self._ready.pop(uid, None)
        else:
            self._ready[uid] = is_ready(obj)

    def _on_cronjob(self, kind: str, obj: Mapping[str, Any]) -> None:
        uid = obj["metadata"]["uid"]
        if kind == "DELETED":
            self._cronjobs.discard(uid)
        else:
            self._cronjobs.add(uid)

    async def _watch(self, resource: Resource, on_event: Any) -> None:
        """Follow every change; a closed watch starts again (its ADDED events repeat)."""
        url = self.plane.server + resource.path()
        while True:
            async with self._session.get(url, params={"watch": "true"}) as response:
                response.raise_for_status()
                async for line in response.content:
                    if line.strip():
                        event = json.loads(line)
                        if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                            on_event(event["type"], event["object"])

    def applied(self) -> int:
        return len(self._cronjobs)

    def ready(self) -> int:
        return sum(self._ready.values())

    async def tally(self) -> Tally:
        async with self._session.get(self.plane.server + "/metrics") as response:
            response.raise_for_status()
            text = await response.text()
        tally: Tally = Counter()
        for line in text.splitlines():
            match = REQUEST_LINE.match(line)
            if match is None:
                continue
            labels = dict(LABEL.findall(match["labels"]))
            if labels.get("resource") not in COUNTED_RESOURCES:
                continue
            what = labels["resource"] + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            tally[f"{labels['verb']} {what}"] += int(float(match["value"]))
        return tally


class Emulator:
    """kmock's emulator in this process, reached over HTTP like an API server."""

    def __init__(self, workdir: Path) -> None:
        self.kubeconfig = workdir / "kubeconfig"
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Emulator:
        import kmock
        from tests.support.emulator import GuardedEmulator

        self.api = await self._stack.enter_async_context(GuardedEmulator())
        await self._stack.enter_async_context(kmock.Server(self.api))
        self.api.declare_resources()
        url = str(self.api.url).rstrip("/")
        self.client = KubeClient(kopf.ConnectionInfo(server=url))
        self._stack.push_async_callback(self.client.close)
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": url}}],
            "users": [{"name": "bench", "user": {"token": "bench"}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "bench"}}],
        }))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def seed(self, objects: Sequence[dict[str, Any]]) -> None:
        for obj in objects:
            await self.client.create(GUARDED_CRONJOBS, obj["metadata"]["namespace"], obj)

    def _live(self, plural: str) -> list[Mapping[str, Any]]:
        return [obj.raw for key, obj in self.api.objects.items()
                if key[0].plural == plural and not obj.deleted]

    def applied(self) -> int:
        return len(self._live("cronjobs"))

    def ready(self) -> int:
        return sum(1 for obj in self._live("guardedcronjobs") if is_ready(obj))

    async def tally(self) -> Tally:
        tally: Tally = Counter()
        for request in self.api.requests_list():
            resource = request.resource.plural if request.resource is not None else "other"
            if resource in COUNTED_RESOURCES:
                what = resource + (f"/{request.subresource}" if request.subresource else "")
                tally[f"{request.method.value} {what}"] += 1
        return tally
