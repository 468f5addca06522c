"""Locks belong to namespaces (issue 11), as the reconcile pass enforces it against the
emulator: a shared lock the allow-list does not grant gives Invalid, an Event and no
CronJob; a granted one gives a CronJob taking "shared:<name>"; a CronJob whose runs
would take a lock the namespace may no longer use is deleted, whether the allow-list
shrank or the object was admitted before lease.name was confined to its namespace."""

from __future__ import annotations

import dataclasses
from typing import Any

from guardedcron import contract
from guardedcron.builders import build_cronjob, locks_in_cronjob
from guardedcron.handlers.context import PassMemory
from guardedcron.kube import CRONJOBS, GUARDED_CRONJOBS, KubeClient
from guardedcron.spec import parse_guarded_cronjob
from guardedcron.spec.locks import SharedLock
from guardedcron.spec.settings import CHART_VALUE_SHARED_LOCKS, ENV_SHARED_LOCKS
from tests.operator.passes import SETTINGS, create_gcj, one_pass
from tests.support.clock import T0
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj, put

NS, NAME = "billing", "nightly-invoices"
GCJ_RES, CJ_RES = "guardedcron.io/v1alpha1/guardedcronjobs", "batch/v1/cronjobs"
SHARED = "ledger-close"
BOTH = (SharedLock(SHARED, frozenset({"finance", NS})),)
FINANCE_ONLY = (SharedLock(SHARED, frozenset({"finance"})),)


def cronjob(api: GuardedEmulator) -> dict[str, Any] | None:
    return api.object(CJ_RES, NS, NAME)


def condition(api: GuardedEmulator, kind: str) -> dict[str, Any]:
    found = api.object(GCJ_RES, NS, NAME)
    assert found is not None
    return next(c for c in found["status"]["conditions"] if c["type"] == kind)


def events(api: GuardedEmulator, since: int = 0) -> list[dict[str, Any]]:
    return [r.data for r in api.writes(since)
            if r.method.value == "POST" and r.url.path.endswith("/events")]


def deletes(api: GuardedEmulator, since: int = 0) -> list[str]:
    return [r.url.path for r in api.writes(since) if r.method.value == "DELETE"]


def shared_gcj() -> dict[str, Any]:
    return put(base_gcj(), "spec.lease.sharedLock", SHARED)


async def test_a_shared_lock_the_allow_list_does_not_grant_gets_invalid_an_event_and_no_cronjob(
        api: GuardedEmulator, client: KubeClient) -> None:
    await create_gcj(client, shared_gcj())
    memory = PassMemory()

    result = await one_pass(client, NS, NAME, now=T0, memory=memory, shared_locks=FINANCE_ONLY)

    assert not result.applied and cronjob(api) is None
    invalid = condition(api, "Invalid")
    assert (invalid["status"], invalid["reason"]) == ("True", "SpecInvalid")
    message = invalid["message"]
    assert message.startswith("spec.lease.sharedLock: namespace billing may not use shared lock "
                              "'ledger-close'")
    assert CHART_VALUE_SHARED_LOCKS in message and ENV_SHARED_LOCKS in message
    assert "grants 'ledger-close' to namespaces finance only" in message
    ready = condition(api, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "SpecInvalid")
    [event] = events(api)
    assert (event["reason"], event["type"]) == ("LockNotAllowed", "Warning")
    assert ENV_SHARED_LOCKS in event["message"]

    # A resync over the same refusal writes nothing: no status, no second Event.
    since = len(api.requests_list())
    assert not (await one_pass(client, NS, NAME, now=T0, memory=memory,
                               shared_locks=FINANCE_ONLY)).status_written
    assert api.writes(since) == []


async def test_without_any_allow_list_the_message_says_the_lock_is_not_listed(
        api: GuardedEmulator, client: KubeClient) -> None:
    await create_gcj(client, shared_gcj())
    await one_pass(client, NS, NAME, now=T0)
    assert "lists no shared lock 'ledger-close'" in condition(api, "Invalid")["message"]
    assert cronjob(api) is None


async def test_a_granted_shared_lock_makes_a_cronjob_taking_the_shared_lock(
        api: GuardedEmulator, client: KubeClient) -> None:
    await create_gcj(client, shared_gcj())

    result = await one_pass(client, NS, NAME, now=T0, shared_locks=BOTH)

    live = cronjob(api)
    assert result.applied and live is not None
    assert live["metadata"]["annotations"][contract.ANNOTATION_LOCK] == "shared:ledger-close"
    assert locks_in_cronjob(live) == {"shared:ledger-close"}
    assert condition(api, "Ready")["status"] == "True"
    assert events(api) == []


async def test_taking_a_namespace_off_the_allow_list_deletes_its_cronjob(
        api: GuardedEmulator, client: KubeClient) -> None:
    created = await create_gcj(client, shared_gcj())
    await one_pass(client, NS, NAME, now=T0, shared_locks=BOTH)
    live = cronjob(api)
    assert live is not None
    since = len(api.requests_list())

    # The admin narrows the list; the operator restarts with it (a new memory).
    memory = PassMemory()
    result = await one_pass(client, NS, NAME, now=T0, memory=memory, shared_locks=FINANCE_ONLY)

    assert not result.applied and cronjob(api) is None
    [delete] = [r for r in api.writes(since) if r.method.value == "DELETE"]
    assert delete.url.path == f"/apis/batch/v1/namespaces/{NS}/cronjobs/{NAME}"
    assert delete.params == {"propagationPolicy": "Background"}  # its Jobs go with it
    assert delete.data["preconditions"] == {"uid": live["metadata"]["uid"]}
    assert condition(api, "Invalid")["status"] == "True"
    refused, deleted = (e["message"] for e in events(api, since))
    assert refused.startswith("spec.lease.sharedLock: namespace billing may not use")
    assert deleted.startswith(f"deleted CronJob {NAME} and its Jobs (a run in progress is "
                              "stopped): its runs take lock 'shared:ledger-close', which "
                              "namespace billing may not use")
    assert ENV_SHARED_LOCKS in deleted
    assert created["metadata"]["uid"] == live["metadata"]["ownerReferences"][0]["uid"]

    # Nothing more to delete, nothing more to write.
    since = len(api.requests_list())
    assert not (await one_pass(client, NS, NAME, now=T0, memory=memory,
                               shared_locks=FINANCE_ONLY)).status_written
    assert api.writes(since) == []


async def _cronjob_from_before_the_upgrade(client: KubeClient, lease_name: str) -> dict[str, Any]:
    """A GuardedCronJob stored before lease.name was confined to its namespace, and the
    CronJob the operator made from it then (its runs take `lease_name` as written)."""
    obj = put(base_gcj(), "spec.lease.name", lease_name)
    created = await create_gcj(client, put(base_gcj(), "spec.lease.name", "placeholder"))
    parsed = parse_guarded_cronjob(created)
    old_lease = dataclasses.replace(parsed.spec.lease, name=lease_name)
    old = dataclasses.replace(parsed, spec=dataclasses.replace(parsed.spec, lease=old_lease))
    await client.apply(CRONJOBS, build_cronjob(old, SETTINGS))
    # The stored object keeps its old lease.name (admission does not re-check stored objects).
    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME, {"spec": {"lease": obj["spec"]["lease"]}})
    return created


async def test_a_cronjob_from_before_the_upgrade_taking_another_namespaces_lock_is_deleted(
        api: GuardedEmulator, client: KubeClient) -> None:
    await _cronjob_from_before_the_upgrade(client, "payments/nightly-payouts")
    assert locks_in_cronjob(cronjob(api) or {}) == {"payments/nightly-payouts"}

    await one_pass(client, NS, NAME, now=T0)

    assert cronjob(api) is None
    invalid = condition(api, "Invalid")
    assert invalid["status"] == "True" and invalid["message"].startswith("spec.lease.name: ")
    assert [e["reason"] for e in events(api)] == ["LockNotAllowed", "SpecInvalid"]
    event = events(api)[0]
    assert "'payments/nightly-payouts', which namespace billing may not use" in event["message"]


async def test_a_cronjob_from_before_the_upgrade_taking_its_own_namespaces_lock_is_kept(
        api: GuardedEmulator, client: KubeClient) -> None:
    # "billing/nightly-invoices" written out: refused now (the fix is lease.name
    # "nightly-invoices", the same lock), but the runs stay inside their namespace, so
    # the CronJob is left as it was, as for any invalid spec.
    await _cronjob_from_before_the_upgrade(client, "billing/nightly-invoices")
    since = len(api.requests_list())

    await one_pass(client, NS, NAME, now=T0)

    assert cronjob(api) is not None and deletes(api, since) == []
    assert condition(api, "Invalid")["status"] == "True"
    assert [e["reason"] for e in events(api)] == ["SpecInvalid"]  # no LockNotAllowed

    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME,
                             {"spec": {"lease": {"name": "nightly-invoices"}}})
    await one_pass(client, NS, NAME, now=T0)
    assert condition(api, "Ready")["status"] == "True"
    assert locks_in_cronjob(cronjob(api) or {}) == {"billing/nightly-invoices"}


async def test_a_lease_name_from_before_the_upgrade_without_a_slash_moves_into_the_namespace_with_an_event(
        api: GuardedEmulator, client: KubeClient) -> None:
    # Before issue 11, lease.name "nightly" was the lock "nightly" itself; now it is
    # "billing/nightly". The operator re-applies the CronJob with the new lock and says so.
    await _cronjob_from_before_the_upgrade(client, "nightly")
    await client.merge_patch(GUARDED_CRONJOBS, NS, NAME, {"spec": {"lease": {"name": "nightly"}}})

    result = await one_pass(client, NS, NAME, now=T0)

    assert result.applied
    assert locks_in_cronjob(cronjob(api) or {}) == {"billing/nightly"}
    [event] = events(api)
    assert (event["reason"], event["type"]) == ("LockChanged", "Warning")
    assert event["message"] == (f"CronJob {NAME}: runs took lock 'nightly' and now take "
                                "'billing/nightly'; a run still holding the old lock does not "
                                "keep a new run out")
    assert condition(api, "Ready")["status"] == "True"
