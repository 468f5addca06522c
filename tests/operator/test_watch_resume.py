"""A watch that ends resumes from its resourceVersion: no re-listing, on a real API server.

The operator's watches are kopf's (1.45): each asks for bookmarks
(`allowWatchBookmarks=true`), keeps the resourceVersion of the last event or bookmark,
and when the API server ends the watch (its timeout; a dropped connection) opens the
next one from that version; it lists again only after `410 Gone` (the version has left
the API server's window). A re-listing would hand every object to kopf again, N
bodies at once: at 10,000 objects it is the start-up's memory peak, once per watch
timeout. This test runs the operator (kopf with guardedcron's registry and settings)
on a real control plane whose watches end every WATCH_SECONDS, and counts, at the
API server itself, that the operator's LISTs stay one per resource while its watches
end and start again, and that an object created after several restarts is still seen.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kopf
import pytest
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import watching
from kopf.testing import KopfRunner

from guardedcron.handlers import kopf_startup, reconcile
from guardedcron.handlers.context import OperatorContext
from guardedcron.handlers.registry import GCJ, build_registry
from guardedcron.kube import CRONJOBS, GUARDED_CRONJOBS, KubeClient, NotFound
from guardedcron.kube import client as kube_client
from guardedcron.spec import Settings
from guardedcron_devenv.binaries import ensure_binaries
from guardedcron_devenv.controlplane import ControlPlane
from tests.operator.passes import SETTINGS
from tests.support.gcj import base_gcj, put

pytestmark = pytest.mark.e2e

NS = "resume"
CRD_DIR = Path(__file__).resolve().parents[2] / "crds"
WATCH_SECONDS = 2  # the API server ends each of the operator's watches after this
RESTARTS = 3  # watches of GuardedCronJobs ended and started again before the new object
WAIT_SECONDS = 60.0  # for each step; a loaded machine
WATCHED = ("guardedcronjobs", "cronjobs", "jobs", "pods")  # handlers/registry.py's caches
REQUEST = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$')
LABEL = re.compile(r'(\w+)="([^"]*)"')


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(ensure_binaries(lambda line: None), name="watch-resume",
                      logs_dir=tmp_path_factory.mktemp("watch-resume-logs"),
                      progress=lambda line: None) as plane:
        plane.kubectl("apply", "-f", str(CRD_DIR))
        plane.wait_established("guardedcronjobs.guardedcron.io")
        plane.kubectl("create", "namespace", NS)
        yield plane


def namespaced_requests(plane: ControlPlane) -> Counter[str]:
    """The API server's own count of requests in one namespace, as "VERB resource".
    The control plane's controllers list and watch cluster-wide; the operator, watching
    one namespace, in that namespace."""
    counts: Counter[str] = Counter()
    for line in plane.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        match = REQUEST.match(line)
        if match is None:
            continue
        labels = dict(LABEL.findall(match["labels"]))
        if labels.get("scope") == "namespace" and labels.get("resource") in WATCHED:
            counts[f"{labels['verb']} {labels['resource']}"] += int(float(match["value"]))
    return counts


class WatchRequests:
    """The URLs of the watches kopf opens (kopf's own stream call, passed through)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.urls: list[str] = []
        real = kopf_api.stream

        def stream(url: str, **kwargs: Any) -> AsyncIterator[Any]:
            self.urls.append(url)
            return real(url, **kwargs)

        monkeypatch.setattr(kopf_api, "stream", stream)

    def of(self, plural: str) -> list[dict[str, list[str]]]:
        return [parse_qs(urlsplit(url).query) for url in self.urls
                if urlsplit(url).path.endswith(f"/{plural}")]


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {WAIT_SECONDS:.0f} s waiting for {what}")
        await asyncio.sleep(0.3)


async def cronjob_exists(client: KubeClient, name: str, namespace: str = NS) -> bool:
    try:
        await client.get(CRONJOBS, namespace, name)
    except NotFound:
        return False
    return True


def admin_client(plane: ControlPlane) -> KubeClient:
    """A client of the test's own, as the control plane's administrator."""
    return KubeClient(kopf.ConnectionInfo(server=plane.server, ca_path=str(plane.ca_file),
                                          certificate_path=str(plane.admin_cert_file),
                                          private_key_path=str(plane.admin_key_file)))


def gcj(name: str, namespace: str = NS) -> dict[str, Any]:
    obj = put(put(base_gcj(), "metadata.name", name), "metadata.namespace", namespace)
    return put(obj, "spec.schedule", "0 0 1 1 *")


async def test_a_watch_that_ends_resumes_from_its_version_without_listing(
        plane: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(plane.kubeconfig))
    watches = WatchRequests(monkeypatch)
    client = admin_client(plane)
    try:
        await client.create(GUARDED_CRONJOBS, NS, gcj("before"))
        before = namespaced_requests(plane)
        kopf_settings = kopf.OperatorSettings()
        kopf_settings.watching.server_timeout = WATCH_SECONDS
        context = OperatorContext(client=KubeClient(), settings=Settings(build=SETTINGS, namespaces=(NS,)))
        registry = build_registry(context)
        handed: list[object] = []

        @kopf.on.event(*GCJ, id="record_managed_fields", registry=registry)
        async def record(*, body: kopf.Body, **_: Any) -> None:
            handed.append(body["metadata"].get("managedFields"))

        monkeypatch.setattr(watching, "continuous_watch", watching.continuous_watch)
        kopf_startup.install()  # as `guardedcron operator` does
        runner = KopfRunner(["run", "--standalone", "--namespace", NS], registry=registry,
                            settings=kopf_settings, timeout=WAIT_SECONDS)
        with runner:
            await until(lambda: cronjob_exists(client, "before"),
                        "the CronJob of the GuardedCronJob listed at start")

            async def watches_ended() -> bool:
                # WATCH is counted when the watch ends.
                served = await asyncio.to_thread(namespaced_requests, plane)
                return served["WATCH guardedcronjobs"] - before["WATCH guardedcronjobs"] >= RESTARTS

            await until(watches_ended, f"{RESTARTS} watches of GuardedCronJobs ended by the server")
            await client.create(GUARDED_CRONJOBS, NS, gcj("after"))
            await until(lambda: cronjob_exists(client, "after"),
                        "the CronJob of the GuardedCronJob created after the restarts")
            served = namespaced_requests(plane) - before
        stored = (await client.get(GUARDED_CRONJOBS, NS, "before"))["metadata"]["managedFields"]
        assert runner.exit_code == 0, runner.output
    finally:
        await client.close()

    for plural in WATCHED:
        # Two listings per resource, at start (the caches' priming, then kopf's watch);
        # every later watch resumed instead.
        assert served[f"LIST {plural}"] == 2, (plural, served)
    assert served["WATCH guardedcronjobs"] >= RESTARTS, served
    opened = watches.of("guardedcronjobs")
    assert len(opened) > RESTARTS, opened
    for query in opened:
        assert query["allowWatchBookmarks"] == ["true"], query
        assert query.get("resourceVersion"), f"a watch started without a resourceVersion: {query}"
    versions = [int(query["resourceVersion"][0]) for query in opened]
    assert versions == sorted(versions), versions  # each resumes from where the last one was

    # The API server keeps who wrote what (the creator, kopf's annotations, the status);
    # kopf's workers get none of it: a GuardedCronJob is never applied by the operator.
    assert len(stored) >= 2, stored
    assert handed and all(fields is None for fields in handed), handed


async def test_the_first_listing_comes_in_pages_and_misses_no_object(
        plane: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf lists each resource LIST_CHUNK_SIZE objects at a time (reconcile.configure_kopf),
    and so does the caches' priming (kube/client.py LIST_PAGE_SIZE): with pages of 2, five
    GuardedCronJobs take three LISTs each, and each gets its CronJob."""
    namespace, page, names = "paged", 2, [f"paged-{index}" for index in range(5)]
    monkeypatch.setenv("KUBECONFIG", str(plane.kubeconfig))
    monkeypatch.setattr(reconcile, "LIST_CHUNK_SIZE", page)
    monkeypatch.setattr(kube_client, "LIST_PAGE_SIZE", page)
    plane.kubectl("create", "namespace", namespace)
    client = admin_client(plane)
    try:
        for name in names:
            await client.create(GUARDED_CRONJOBS, namespace, gcj(name, namespace))
        before = namespaced_requests(plane)
        settings = Settings(build=SETTINGS, namespaces=(namespace,))
        context = OperatorContext(client=KubeClient(), settings=settings)
        monkeypatch.setattr(watching, "continuous_watch", watching.continuous_watch)
        kopf_startup.install()
        runner = KopfRunner(["run", "--standalone", "--namespace", namespace],
                            registry=build_registry(context), timeout=WAIT_SECONDS)
        with runner:
            async def every_cronjob() -> bool:
                return all([await cronjob_exists(client, name, namespace) for name in names])

            await until(every_cronjob, "a CronJob for each of the five listed GuardedCronJobs")
            served = namespaced_requests(plane) - before
        assert runner.exit_code == 0, runner.output
    finally:
        await client.close()
    # ceil(5 / 2) pages of GuardedCronJobs, twice; the other resources have none here: one
    # each for the priming, one for kopf.
    assert served["LIST guardedcronjobs"] == 2 * -(-len(names) // page), served
    assert served["LIST cronjobs"] == 2, served
