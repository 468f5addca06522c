"""What one reconcile pass looks at, gathered from the operator's caches (handlers/caches.py).

The caches hold every GuardedCronJob and every CronJob, Job and Pod labelled as
guardedcron's, so a pass (and a restart over up-to-date objects) reads nothing from
the API server. They keep a trimmed copy of each object (no `managedFields` except
the operator's own apply entry, which the apply check needs; no pod specs; not
kopf's bookkeeping annotations), packed as zlib-compressed JSON: parsed dicts of a
CronJob with its pod template take about ten times the memory of its JSON, its JSON
about three times its compressed form (a real API server's CronJob: 6.0 KB of JSON,
about 2 KB packed), and a pass unpacks only the few objects it reads.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from guardedcron import contract
from guardedcron.planner import Observed

Key = tuple[str, str]  # (namespace, GuardedCronJob name)
Body = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Packed:
    """A cached object as compressed compact JSON, and when this version of it was
    stored (`time.monotonic()`): a pass that started later has seen it."""

    packed: bytes
    stored_at: float

    @classmethod
    def of(cls, body: Body) -> Packed:
        text = json.dumps(body, separators=(",", ":")).encode()
        return cls(zlib.compress(text), time.monotonic())

    def unpack(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(zlib.decompress(self.packed))
        return result


class Cached(Protocol):
    """Objects by the key of the GuardedCronJob they belong to (handlers/caches.py)."""

    def get(self, key: Key) -> Iterable[Packed]: ...


def trimmed(body: Mapping[str, Any], *, keep_spec: bool = True,
            drop_spec_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """A plain copy of the parts of an object a pass reads."""
    metadata = dict(body.get("metadata") or {})
    annotations = {k: v for k, v in (metadata.get("annotations") or {}).items()
                   if not k.startswith(f"{contract.KOPF_ANNOTATION_PREFIX}/")}
    if annotations:
        metadata["annotations"] = annotations
    else:
        metadata.pop("annotations", None)
    managed = own_apply_entries(metadata.pop("managedFields", None))
    if managed:
        metadata["managedFields"] = managed
    result: dict[str, Any] = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
                              "metadata": metadata}
    if keep_spec and "spec" in body:
        spec = body["spec"]
        result["spec"] = {k: v for k, v in spec.items() if k not in drop_spec_keys} \
            if drop_spec_keys else spec
    if "status" in body:
        result["status"] = body["status"]
    return result


def own_apply_entries(managed_fields: Any) -> list[Any]:
    """The entries of `metadata.managedFields` that a pass reads: the operator's own apply
    (what it owns, for the apply check). The others (the API server's, kubectl's, the
    CronJob controller's status updates) are the larger part of a real object's body."""
    return [entry for entry in managed_fields or ()
            if isinstance(entry, Mapping) and entry.get("manager") == contract.FIELD_MANAGER
            and entry.get("operation") == "Apply"]


def owner_key(body: Mapping[str, Any]) -> Key | None:
    """The GuardedCronJob an owned object belongs to, by the label the builder sets."""
    metadata = body.get("metadata") or {}
    name = (metadata.get("labels") or {}).get(contract.LABEL_NAME)
    namespace = metadata.get("namespace")
    return (namespace, name) if isinstance(name, str) and isinstance(namespace, str) else None


def index_by_name(body: Body) -> dict[Key, Packed]:
    return {gcj_key(body): Packed.of(trimmed(body))}


def index_job(body: Body) -> dict[Key, Packed]:
    key = owner_key(body)
    # The pod template is the CronJob's, already known; runs are told apart by status.
    return {key: Packed.of(trimmed(body, drop_spec_keys=("template",)))} if key is not None else {}


def index_pod(body: Body) -> dict[Key, Packed]:
    key = owner_key(body)
    return {key: Packed.of(trimmed(body, keep_spec=False))} if key is not None else {}


def lookup(cached: Cached, key: Key) -> Body | None:
    packed = next(iter(cached.get(key)), None)
    return packed.unpack() if packed is not None else None


def newest_stored_at(cached: Cached, key: Key) -> float | None:
    """When the newest of the objects cached under `key` was stored; None if none is."""
    return max((packed.stored_at for packed in cached.get(key)), default=None)


def gcj_key(body: Body) -> Key:
    """(namespace, name) of an object; for a CronJob, also its GuardedCronJob's."""
    metadata = body.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def observe(gcj: Body, cronjob: Body | None, *, jobs: Cached, pods: Cached) -> Observed:
    key = gcj_key(gcj)
    owned_jobs = [packed.unpack() for packed in jobs.get(key)]
    by_job: dict[str, list[Body]] = {}
    for pod in (packed.unpack() for packed in pods.get(key)):
        job_name = ((pod.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_JOB_NAME)
        if isinstance(job_name, str):
            by_job.setdefault(job_name, []).append(pod)
    return Observed(gcj=gcj, cronjob=cronjob, jobs=owned_jobs, pods_by_job=by_job)
