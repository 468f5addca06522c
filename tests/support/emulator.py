"""kmock's Kubernetes emulator, extended with what these scenarios need of an API server.

kmock 0.8 stores objects as plain JSON and merges every PATCH into them. A real API
server does more, and the operator relies on some of it. This subclass adds, for
these tests only (the e2e suite runs the same scenarios on a real kube-apiserver):

- metadata the server owns: `uid`, `generation` (bumped when `spec` changes),
  `resourceVersion` (bumped on every change, not on a no-op), `creationTimestamp`;
- the status subresource: a PATCH of `.../status` changes only `status`, and a PATCH
  of the object leaves `status` alone;
- server-side apply (a PATCH with `application/apply-patch+yaml`) for one applier:
  create-on-apply, `managedFields` for the applying manager (lists of containers,
  env, volumes, mounts, ports and owner references keyed by their merge keys, other
  lists atomic), fields the manager applied before and no longer applies removed,
  merge keys respected when other writers added list items;
- `labelSelector` on LIST (equality and existence terms);
- rejections at admission: `validators` return a message, answered as 422 Invalid;
- speed: kmock matches every request against its reactions by scanning all the
  requests served so far (quadratic); with no reaction added by the test, requests
  for objects go straight to the emulator's own answers (the benchmark's 1,000
  objects would take minutes otherwise).

Requests are kept in order; `writes()` lists the ones that change something.
"""

from __future__ import annotations

import copy
import itertools
import json
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import aiohttp.web
import kmock
from kmock._internal import apps, enums, k8s, rendering

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
# The merge keys of the lists a CronJob holds (x-kubernetes-list-map-keys in the
# Kubernetes OpenAPI); every other list is atomic.
MERGE_KEYS: Mapping[str, tuple[str, ...]] = {
    "containers": ("name",), "initContainers": ("name",), "ephemeralContainers": ("name",),
    "env": ("name",), "volumes": ("name",), "imagePullSecrets": ("name",),
    "volumeMounts": ("mountPath",), "ports": ("containerPort", "protocol"),
    "ownerReferences": ("uid",),
}
WRITE_METHODS = ("POST", "PATCH", "PUT", "DELETE")

RESOURCES: dict[str, kmock.ResourceInfo] = {
    "guardedcron.io/v1alpha1/guardedcronjobs": kmock.ResourceInfo(
        kind="GuardedCronJob", singular="guardedcronjob", namespaced=True, shortnames={"gcj"},
        subresources={"status"}, verbs={"get", "list", "watch", "patch", "create", "delete"}),
    "batch/v1/cronjobs": kmock.ResourceInfo(
        kind="CronJob", singular="cronjob", namespaced=True, subresources={"status"},
        verbs={"get", "list", "watch", "patch", "create", "delete"}),
    "batch/v1/jobs": kmock.ResourceInfo(
        kind="Job", singular="job", namespaced=True, subresources={"status"},
        verbs={"get", "list", "watch", "create", "patch", "delete"}),
    "v1/pods": kmock.ResourceInfo(
        kind="Pod", singular="pod", namespaced=True, subresources={"status"},
        verbs={"get", "list", "watch", "create", "patch", "delete"}),
    "v1/secrets": kmock.ResourceInfo(
        kind="Secret", singular="secret", namespaced=True, verbs={"get", "create"}),
    "v1/events": kmock.ResourceInfo(
        kind="Event", singular="event", namespaced=True, verbs={"create", "patch", "list"}),
    # Every API server has these; kopf looks for them before it starts its watches.
    "v1/namespaces": kmock.ResourceInfo(
        kind="Namespace", singular="namespace", namespaced=False, verbs={"get", "list", "watch"}),
    "apiextensions.k8s.io/v1/customresourcedefinitions": kmock.ResourceInfo(
        kind="CustomResourceDefinition", singular="customresourcedefinition", namespaced=False,
        verbs={"get", "list", "watch"}),
}

Validator = Callable[[Mapping[str, Any]], str | None]


class _DirectDispatch(apps.RawHandler):
    """Serves object requests without kmock's reaction matching while the test added no
    reaction of its own; placed after the emulator in the method order, so the
    emulator's bookkeeping of objects runs first, as always."""

    builtin_reactions = 0

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and request.resource.plural \
                and len(self._payloads) == self.builtin_reactions:
            serve = {
                enums.action.LIST: "_serve_list", enums.action.WATCH: "_serve_watch",
                enums.action.FETCH: "_serve_fetch", enums.action.CREATE: "_serve_create",
                enums.action.UPDATE: "_serve_update", enums.action.DELETE: "_serve_delete",
            }.get(request.action) if request.action is not None else None
            if serve is not None:
                return await rendering.Response(payload=getattr(self, serve))(request)
        return await super()._handle(request)


class GuardedEmulator(k8s.KubernetesEmulator, _DirectDispatch):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.builtin_reactions = len(self._payloads)
        self.validators: list[Validator] = []
        self._versions = itertools.count(1000)

    def declare_resources(self) -> None:
        """What the operator watches and writes, as the API server's discovery shows it."""
        for name, info in RESOURCES.items():
            self.resources[name] = info

    # --- what tests read

    def requests_list(self) -> list[rendering.Request]:
        return list(self._requests)

    def writes(self, since: int = 0) -> list[rendering.Request]:
        return [r for r in self._requests[since:] if r.method.value in WRITE_METHODS]

    def object(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        key = (kmock.resource(resource), namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    # --- the extensions

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and request.action == enums.action.UPDATE \
                and request.headers.get("Content-Type", "").startswith(APPLY_CONTENT_TYPE):
            return await self._apply(request)
        if request.resource is not None and request.action == enums.action.CREATE:
            self._stamp_new(request.data)
        elif request.resource is not None and request.action == enums.action.UPDATE:
            self._prepare_patch(request)
        return await super()._handle(request)

    async def _serve_list(self, request: rendering.Request) -> Any:
        result: dict[str, Any] = await super()._serve_list(request)  # type: ignore[assignment]
        selector = request.params.get("labelSelector")
        if selector:
            result["items"] = [item for item in result["items"] if _selected(item, selector)]
        return result

    def _stamp_new(self, body: dict[str, Any]) -> None:
        metadata = body.setdefault("metadata", {})
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata["generation"] = 1
        metadata["resourceVersion"] = str(next(self._versions))
        metadata["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _prepare_patch(self, request: rendering.Request) -> None:
        """Status subresource rules, and generation/resourceVersion, for a merge patch."""
        data = request.data
        if not isinstance(data, dict):
            return
        if request.subresource == "status":
            for key in [k for k in data if k != "status"]:
                del data[key]
        else:
            data.pop("status", None)
        key = _object_key(request)
        if key not in self.objects or self.objects[key].deleted:
            return  # kmock answers 404
        live = self.objects[key].raw
        merged = _merge_patch(copy.deepcopy(live), data)
        if merged == live:
            return
        metadata = data.setdefault("metadata", {})
        metadata["resourceVersion"] = str(next(self._versions))
        if merged.get("spec") != live.get("spec"):
            metadata["generation"] = int(live.get("metadata", {}).get("generation", 0)) + 1

    async def _apply(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        applied = request.data
        manager = request.params.get("fieldManager", "")
        if not isinstance(applied, dict) or not manager:
            raise k8s.KubernetesError(status=400, reason="BadRequest",
                                      message="apply needs a body and a fieldManager")
        for validate in self.validators:
            message = validate(applied)
            if message is not None:
                raise k8s.KubernetesError(status=422, reason="Invalid", message=message)
        key = _object_key(request)
        async with self._lock:
            exists = key in self.objects and not self.objects[key].deleted
            if not exists:
                body = copy.deepcopy(applied)
                self._stamp_new(body)
                body["metadata"]["managedFields"] = [_managed_entry(manager, applied)]
                if key in self.objects:
                    self.objects[key].create(body)
                else:
                    self.objects[key] = body
                event_type = "ADDED"
            else:
                live = self.objects[key].raw
                before = _owned_fields(live, manager)
                after = _fieldset(applied)
                merged = _merge_applied(_remove_fields(copy.deepcopy(live), before, after), applied)
                entries = [e for e in merged["metadata"].get("managedFields") or ()
                           if e.get("manager") != manager or e.get("operation") != "Apply"]
                merged["metadata"]["managedFields"] = [*entries, _managed_entry(manager, applied)]
                if merged == live:
                    return aiohttp.web.json_response(live)  # no-op: nothing changes, no event
                merged["metadata"]["resourceVersion"] = str(next(self._versions))
                if merged.get("spec") != live.get("spec"):
                    merged["metadata"]["generation"] = int(live["metadata"].get("generation", 0)) + 1
                self.objects[key].history.append(merged)
                event_type = "MODIFIED"
            raw = self.objects[key].raw
            await self._buses[key[0]].put({"type": event_type, "object": raw})
        return aiohttp.web.json_response(raw)


def _object_key(request: rendering.Request) -> tuple[kmock.resource, str | None, str]:
    assert request.resource is not None and request.name is not None
    return request.resource, request.namespace, request.name


def _managed_entry(manager: str, applied: Mapping[str, Any]) -> dict[str, Any]:
    return {"manager": manager, "operation": "Apply", "apiVersion": applied.get("apiVersion"),
            "fieldsType": "FieldsV1", "fieldsV1": _fieldset(applied)}


def _owned_fields(live: Mapping[str, Any], manager: str) -> dict[str, Any]:
    for entry in live.get("metadata", {}).get("managedFields") or ():
        if entry.get("manager") == manager and entry.get("operation") == "Apply":
            return dict(entry.get("fieldsV1") or {})
    return {}


def _fieldset(value: Any, field: str = "") -> dict[str, Any]:
    """The FieldsV1 set of the fields `value` sets."""
    if isinstance(value, dict):
        return {f"f:{k}": _fieldset(v, k) for k, v in value.items()
                if not (field == "" and k in ("apiVersion", "kind"))
                and not (field == "metadata" and k in ("name", "namespace"))}
    keys = MERGE_KEYS.get(field)
    if isinstance(value, list) and keys:
        return {_item_key(item, keys): {".": {}, **_fieldset(item)} for item in value}
    return {}


def _item_key(item: Mapping[str, Any], keys: tuple[str, ...]) -> str:
    return "k:" + json.dumps({k: item[k] for k in keys if k in item}, separators=(",", ":"))


def _find(items: list[Any], item_key: str) -> int | None:
    wanted = json.loads(item_key[2:])
    for index, item in enumerate(items):
        if isinstance(item, dict) and all(item.get(k) == v for k, v in wanted.items()):
            return index
    return None


def _remove_fields(live: Any, before: Mapping[str, Any], after: Mapping[str, Any]) -> Any:
    """Remove from `live` what the manager owned (`before`) and no longer applies (`after`)."""
    for key, children in before.items():
        kind, _, rest = key.partition(":")
        if kind == "f" and isinstance(live, dict) and rest in live:
            if key not in after:
                del live[rest]
            elif children:
                live[rest] = _remove_fields(live[rest], children, after[key])
        elif kind == "k" and isinstance(live, list):
            index = _find(live, key)
            if index is None:
                continue
            if key not in after:
                del live[index]
            else:
                live[index] = _remove_fields(live[index], children, after[key])
    return live


def _merge_applied(live: Any, applied: Any, field: str = "") -> Any:
    if isinstance(applied, dict) and isinstance(live, dict):
        for key, value in applied.items():
            live[key] = _merge_applied(live.get(key), value, key)
        return live
    keys = MERGE_KEYS.get(field)
    if isinstance(applied, list) and isinstance(live, list) and keys:
        rest = list(live)
        result = []
        for item in applied:
            index = _find(rest, _item_key(item, keys))
            result.append(_merge_applied(rest.pop(index) if index is not None else {}, item))
        return result + rest  # items other writers added stay, after the applied ones
    return copy.deepcopy(applied)


def _merge_patch(live: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(live) if isinstance(live, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _selected(item: Mapping[str, Any], selector: str) -> bool:
    labels = item.get("metadata", {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            name, value = term.split("!=", 1)
            if labels.get(name.strip()) == value.strip():
                return False
        elif "=" in term:
            name, value = term.replace("==", "=").split("=", 1)
            if labels.get(name.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True
