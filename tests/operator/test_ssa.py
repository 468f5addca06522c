"""`apply_needed`: whether the live object already holds what an apply would make of it."""

from __future__ import annotations

from typing import Any

import pytest

from guardedcron.planner.ssa import apply_needed

MANAGER = "guardedcron-operator"


def pod(*containers: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"spec": {"template": {"spec": {"containers": list(containers), **extra}}}}


def owned(fields: dict[str, Any], manager: str = MANAGER, operation: str = "Apply") -> dict[str, Any]:
    return {"metadata": {"managedFields": [
        {"manager": manager, "operation": operation, "fieldsType": "FieldsV1", "fieldsV1": fields}]}}


def merged(*parts: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            result[key] = merged(result[key], value) if isinstance(value, dict) and \
                isinstance(result.get(key), dict) else value
    return result


UP_TO_DATE = {
    "equal": ({"spec": {"a": 1}}, {"spec": {"a": 1}}),
    "defaults added by the server": (
        pod({"name": "task", "image": "x"}),
        pod({"name": "task", "image": "x", "imagePullPolicy": "IfNotPresent",
             "terminationMessagePath": "/dev/termination-log"}, dnsPolicy="ClusterFirst")),
    "a container another writer added": (
        pod({"name": "task", "image": "x"}),
        pod({"name": "sidecar", "image": "y"}, {"name": "task", "image": "x"})),
    "cpu written back in canonical form": (
        pod({"name": "t", "resources": {"limits": {"cpu": "0.5", "memory": "1Gi"}}}),
        pod({"name": "t", "resources": {"limits": {"cpu": "500m", "memory": "1024Mi"}}})),
    "an int-or-string written back as a string": (
        pod({"name": "t", "resources": {"requests": {"cpu": 1}}}),
        pod({"name": "t", "resources": {"requests": {"cpu": "1"}}})),
    "an empty object sets nothing": ({"metadata": {"labels": {}}}, {"metadata": {}}),
    "a field left unset": ({"spec": {"timeZone": None}}, {"spec": {}}),
    "owned fields all still desired": (
        {"spec": {"schedule": "* * * * *"}},
        merged({"spec": {"schedule": "* * * * *"}}, owned({"f:spec": {"f:schedule": {}}}))),
    "a port whose protocol the server defaulted": (
        {"ports": [{"containerPort": 80}]},
        merged({"ports": [{"containerPort": 80, "protocol": "TCP"}]},
               owned({"f:ports": {'k:{"containerPort":80,"protocol":"TCP"}': {".": {}}}}))),
    "fields another manager owns": (
        {"spec": {"a": 1}},
        merged({"spec": {"a": 1, "b": 2}}, owned({"f:spec": {"f:b": {}}}, manager="kubectl"))),
}


@pytest.mark.parametrize(("desired", "live"), UP_TO_DATE.values(), ids=UP_TO_DATE.keys())
def test_nothing_to_apply(desired: dict[str, Any], live: dict[str, Any]) -> None:
    assert apply_needed(desired, live, MANAGER) is None


DUE = {
    "missing object": ({"spec": {}}, None, "the object does not exist"),
    "a scalar changed": ({"spec": {"a": 1}}, {"spec": {"a": 2}}, "spec.a differs"),
    "a type changed": ({"spec": {"a": True}}, {"spec": {"a": 1}}, "spec.a differs"),
    "a desired container missing": (
        pod({"name": "guard", "image": "g"}, {"name": "task", "image": "x"}),
        pod({"name": "task", "image": "x"}), "spec.template.spec.containers[name=guard] differs"),
    "a field inside a container changed": (
        pod({"name": "task", "image": "x"}), pod({"name": "task", "image": "y"}),
        "spec.template.spec.containers[name=task].image differs"),
    "an atomic list changed length": (
        {"args": ["a", "b"]}, {"args": ["a"]}, "args differs"),
    "a quantity outside resources is compared as text": (
        {"env": [{"name": "N", "value": "0.5"}]}, {"env": [{"name": "N", "value": "500m"}]},
        "env[name=N].value differs"),
    "a field we owned and no longer set": (
        {"spec": {"schedule": "* * * * *"}},
        merged({"spec": {"schedule": "* * * * *", "timeZone": "UTC"}},
               owned({"f:spec": {"f:schedule": {}, "f:timeZone": {}}})),
        "spec.timeZone is no longer set"),
    "a list item we owned and no longer set": (
        {"env": [{"name": "A", "value": "1"}]},
        merged({"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
               owned({"f:env": {'k:{"name":"A"}': {".": {}, "f:value": {}},
                                'k:{"name":"B"}': {".": {}, "f:value": {}}}})),
        "env[name=B] is no longer set"),
    "a set item we owned and no longer set": (
        {"finalizers": ["a"]},
        merged({"finalizers": ["a"]}, owned({"f:finalizers": {'v:"a"': {}, 'v:"b"': {}}})),
        'finalizers["b"] is no longer set'),
}


@pytest.mark.parametrize(("desired", "live", "reason"), DUE.values(), ids=DUE.keys())
def test_apply_due(desired: dict[str, Any], live: dict[str, Any] | None, reason: str) -> None:
    assert apply_needed(desired, live, MANAGER) == reason


def test_only_the_apply_entry_of_our_manager_counts() -> None:
    live = merged({"spec": {"a": 1, "b": 2}}, owned({"f:spec": {"f:b": {}}}, operation="Update"))
    assert apply_needed({"spec": {"a": 1}}, live, MANAGER) is None
