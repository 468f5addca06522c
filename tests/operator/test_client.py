"""The API client against the emulator: the calls, and errors in the API server's words."""

from __future__ import annotations

import kmock
import kopf
import pytest

from guardedcron.kube import (
    CRONJOBS,
    GUARDED_CRONJOBS,
    ApiError,
    ApiUnreachable,
    KubeClient,
    NotFound,
    Unauthorized,
)
from tests.operator.passes import server_url
from tests.support.emulator import GuardedEmulator

NS = "team"


def cronjob(name: str, **labels: str) -> dict[str, object]:
    return {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": name, "namespace": NS, "labels": labels}, "spec": {"schedule": "@daily"}}


async def test_create_get_list_patch_delete(api: GuardedEmulator, client: KubeClient) -> None:
    created = await client.create(CRONJOBS, NS, cronjob("a", app="x"))
    await client.create(CRONJOBS, NS, cronjob("b", app="y"))

    assert (await client.get(CRONJOBS, NS, "a"))["metadata"]["uid"] == created["metadata"]["uid"]
    assert [o["metadata"]["name"] for o in await client.list(CRONJOBS, NS, label_selector="app=y")] == ["b"]
    assert len(await client.list(CRONJOBS)) == 2  # all namespaces
    patched = await client.merge_patch(CRONJOBS, NS, "a", {"spec": {"suspend": True}})
    assert patched["spec"] == {"schedule": "@daily", "suspend": True}
    await client.delete(CRONJOBS, NS, "a")
    with pytest.raises(NotFound):
        await client.get(CRONJOBS, NS, "a")
    assert api.requests_list()[-2].params == {"propagationPolicy": "Background"}


async def test_apply_creates_then_updates(api: GuardedEmulator, client: KubeClient) -> None:
    first = await client.apply(CRONJOBS, cronjob("c"))
    second = await client.apply(CRONJOBS, {**cronjob("c"), "spec": {"schedule": "@hourly"}})

    assert second["metadata"]["uid"] == first["metadata"]["uid"]
    assert second["spec"] == {"schedule": "@hourly"}
    request = api.requests_list()[-1]
    assert request.headers["Content-Type"] == "application/apply-patch+yaml"
    assert request.params == {"fieldManager": "guardedcron-operator", "force": "true"}


async def test_an_error_carries_the_api_servers_message(api: GuardedEmulator, client: KubeClient) -> None:
    api.validators.append(lambda obj: 'CronJob.batch "d" is invalid: spec.schedule: Invalid value: "x"')

    with pytest.raises(ApiError) as caught:
        await client.apply(CRONJOBS, cronjob("d"))

    assert caught.value.code == 422 and caught.value.permanent
    assert caught.value.message == 'CronJob.batch "d" is invalid: spec.schedule: Invalid value: "x"'
    assert str(caught.value) == f"422 Invalid: {caught.value.message}"


async def test_a_missing_object_is_not_found(client: KubeClient) -> None:
    with pytest.raises(NotFound) as caught:
        await client.patch_status(GUARDED_CRONJOBS, NS, "absent", {"observedGeneration": 1})
    assert caught.value.code == 404 and not caught.value.permanent and caught.value.message


async def test_a_rejected_token_is_read_again_once(api: GuardedEmulator) -> None:
    api[kmock.headers({"Authorization": "Bearer expired"})] << 401 << {
        "kind": "Status", "reason": "Unauthorized", "message": "Unauthorized"}
    logins: list[str] = []

    async def relogin() -> kopf.ConnectionInfo:
        logins.append("again")
        return kopf.ConnectionInfo(server=server_url(api), token="rotated")

    client = KubeClient(kopf.ConnectionInfo(server=server_url(api), token="expired"), relogin=relogin)
    try:
        assert await client.list(CRONJOBS, NS) == []
    finally:
        await client.close()
    assert logins == ["again"]
    assert [r.headers["Authorization"] for r in api.requests_list()] == ["Bearer expired", "Bearer rotated"]


async def test_a_token_refused_again_is_an_error(api: GuardedEmulator) -> None:
    api[kmock.headers({"Authorization": "Bearer bad"})] << 401 << {"message": "Unauthorized"}

    async def relogin() -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server_url(api), token="bad")

    client = KubeClient(kopf.ConnectionInfo(server=server_url(api), token="bad"), relogin=relogin)
    try:
        with pytest.raises(Unauthorized):
            await client.get(CRONJOBS, NS, "x")
    finally:
        await client.close()
    assert len(api.requests_list()) == 2


async def test_no_server_is_unreachable() -> None:
    client = KubeClient(kopf.ConnectionInfo(server="http://127.0.0.1:9"), timeout_seconds=5)
    try:
        with pytest.raises(ApiUnreachable):
            await client.get(CRONJOBS, NS, "x")
    finally:
        await client.close()


async def test_no_credentials_yet_is_unreachable() -> None:
    with pytest.raises(ApiUnreachable, match="no Kubernetes credentials"):
        await KubeClient().get(CRONJOBS, NS, "x")


def test_a_refusal_in_a_terminating_namespace_is_recognised() -> None:
    """What kube-apiserver answers when something is created in a namespace being deleted."""
    from guardedcron.kube.errors import error_from_response

    body = {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": 'cronjobs.batch "nightly" is forbidden: unable to create new content in namespace '
                   "billing because it is being terminated",
        "details": {"name": "nightly", "group": "batch", "kind": "cronjobs", "causes": [
            {"reason": "NamespaceTerminating", "message": "namespace billing is being terminated",
             "field": "metadata.namespace"}]},
    }
    assert error_from_response(403, body, "").namespace_terminating
    rbac = {**body, "message": "cronjobs.batch is forbidden: User cannot patch", "details": {}}
    assert not error_from_response(403, rbac, "").namespace_terminating
