"""Every Event the operator posts has a reason of its own (issue 34): a spec the operator
refuses, a CronJob the API server refuses, a CronJob of the same name that is someone
else's, and a pass that fails each get theirs. kopf posts none: its log posting would
send them as reason `Logging` (kopf's `settings.posting`), and is off."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import kopf
import pytest

from guardedcron.handlers.context import OperatorContext, PassMemory
from guardedcron.handlers.handled import HandledEssences
from guardedcron.handlers.reconcile import configure_kopf, run_pass
from guardedcron.kube import CRONJOBS, GUARDED_CRONJOBS, KubeClient
from guardedcron.spec import Settings
from tests.operator.passes import SETTINGS, create_gcj, eventually, observe_api, one_pass, start_kopf
from tests.support.clock import T0, FakeClock
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj, put

NS, NAME = "billing", "nightly-invoices"
GCJ_PATH = f"/apis/guardedcron.io/v1alpha1/namespaces/{NS}/guardedcronjobs"
# What kube-apiserver says of a container without an image.
REFUSAL = ('CronJob.batch "refused" is invalid: '
           'spec.jobTemplate.spec.template.spec.containers[0].image: Required value')


def events(api: GuardedEmulator, since: int = 0) -> list[dict[str, Any]]:
    """The Events posted (kopf's and the operator's: both POST core/v1 Events)."""
    return [r.data for r in api.writes(since)
            if r.method.value == "POST" and r.url.path.endswith("/events")]


def reasons_on(api: GuardedEmulator, name: str) -> list[tuple[str, str]]:
    return [(e["reason"], e["type"]) for e in events(api) if e["involvedObject"]["name"] == name]


def refuse_images_missing(obj: Any) -> str | None:
    containers = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    return REFUSAL if any("image" not in c for c in containers) else None


def foreign_cronjob(name: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name, "namespace": NS},
            "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}}


def test_kopf_posts_no_events_of_its_own() -> None:
    settings = kopf.OperatorSettings()
    configure_kopf(settings, namespaced=True, handled=HandledEssences())
    assert settings.posting.enabled is False


async def test_under_kopf_each_refusal_has_its_own_reason_and_none_is_logging(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path) -> None:
    api.validators.append(refuse_images_missing)
    await create_gcj(client, put(put(base_gcj(), "metadata.name", "misspelt"),
                                 "spec.timeZone", "Europe/Stockholmm"))
    await create_gcj(client, put(put(base_gcj(), "metadata.name", "refused"),
                                 "spec.jobTemplate.spec.template.spec.containers[0]",
                                 {"name": "task", "command": ["run"]}))
    await client.create(CRONJOBS, NS, foreign_cronjob("taken"))
    await create_gcj(client, put(base_gcj(), "metadata.name", "taken"))
    expected = {"misspelt": "SpecInvalid", "refused": "CronJobRejected", "taken": "CronJobNotOwned"}
    runner = start_kopf(NS, FakeClock())
    try:
        await eventually(lambda: all((reason, "Warning") in reasons_on(api, name)
                                     for name, reason in expected.items()), "each refusal's Event")
        await asyncio.sleep(1.0)  # kopf posts in the background: give a posting time to show
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)
    assert runner.exception is None, runner.output
    assert [e for e in events(api) if e["reason"] == "Logging"] == []
    for name, reason in expected.items():
        assert reasons_on(api, name) == [(reason, "Warning")], name
    by_reason = {e["reason"]: e["message"] for e in events(api)}
    assert "spec.timeZone" in by_reason["SpecInvalid"] and "Europe/Stockholmm" in by_reason["SpecInvalid"]
    assert REFUSAL in by_reason["CronJobRejected"]
    assert "not controlled by this GuardedCronJob" in by_reason["CronJobNotOwned"]


async def test_an_invalid_spec_is_said_once_per_generation(
        api: GuardedEmulator, client: KubeClient) -> None:
    await create_gcj(client, put(base_gcj(), "spec.timeZone", "Mars/Base"))
    memory = PassMemory()

    await one_pass(client, NS, NAME, now=T0, memory=memory)
    since = len(api.requests_list())
    await one_pass(client, NS, NAME, now=T0, memory=memory)  # a resync: nothing to say
    assert api.writes(since) == []
    # Fixed, then broken the same way again: a new generation, a new Event.
    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME, {"spec": {"timeZone": "UTC"}})
    await one_pass(client, NS, NAME, now=T0, memory=memory)
    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME, {"spec": {"timeZone": "Mars/Base"}})
    await one_pass(client, NS, NAME, now=T0, memory=memory)

    posted = events(api)
    assert [(e["reason"], e["type"]) for e in posted] == [("SpecInvalid", "Warning")] * 2
    assert posted[0]["metadata"]["name"] != posted[1]["metadata"]["name"]
    assert all("spec.timeZone" in e["message"] for e in posted)


async def test_a_refused_cronjob_is_said_in_the_api_servers_words(
        api: GuardedEmulator, client: KubeClient) -> None:
    api.validators.append(refuse_images_missing)
    await create_gcj(client, put(put(base_gcj(), "metadata.name", "refused"),
                                 "spec.jobTemplate.spec.template.spec.containers[0]",
                                 {"name": "task", "command": ["run"]}))

    result = await one_pass(client, NS, "refused", now=T0)

    assert result.apply_error == REFUSAL
    [event] = events(api)
    assert (event["reason"], event["type"]) == ("CronJobRejected", "Warning")
    assert REFUSAL in event["message"]


async def test_a_failing_pass_is_said_once_per_error(api: GuardedEmulator, client: KubeClient) -> None:
    await create_gcj(client, base_gcj())
    api[f"patch {GCJ_PATH}/{NAME}/status"] << 403 << {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": f'guardedcronjobs.guardedcron.io "{NAME}" is forbidden: cannot patch resource status'}
    context = OperatorContext(client=client, settings=Settings(build=SETTINGS), memory=PassMemory(),
                              clock=FakeClock())
    logger = logging.getLogger("tests.operator")
    observed = await observe_api(client, NS, NAME)

    for _ in range(2):  # the pass runs again; the second failure says nothing new
        with pytest.raises(Exception, match="is forbidden"):
            await run_pass(lambda: observed, uid=observed.gcj["metadata"]["uid"], context=context,
                           logger=logger)

    [event] = events(api)
    assert (event["reason"], event["type"]) == ("ReconcileFailed", "Warning")
    assert "cannot patch resource status" in event["message"]
