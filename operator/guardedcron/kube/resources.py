"""The API resources the operator reads and writes, and their URL paths."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from guardedcron import contract


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core API
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        """`/apis/batch/v1/namespaces/NS/cronjobs/NAME/status` and its shorter forms;
        a namespaced resource without a namespace lists across all namespaces."""
        parts = [f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"]
        if self.namespaced and namespace is not None:
            parts.append(f"namespaces/{quote(namespace, safe='')}")
        parts.append(self.plural)
        if name is not None:
            parts.append(quote(name, safe=""))
            if subresource is not None:
                parts.append(subresource)
        return "/".join(parts)


GUARDED_CRONJOBS = Resource(contract.API_GROUP, contract.API_VERSION, contract.PLURAL, contract.KIND)
CRONJOBS = Resource("batch", "v1", "cronjobs", "CronJob")
JOBS = Resource("batch", "v1", "jobs", "Job")
PODS = Resource("", "v1", "pods", "Pod")
# core/v1 Events: what `kubectl describe` lists for an object.
EVENTS = Resource("", "v1", "events", "Event")
# Read only for outcome recording (the DSN a GuardedCronJob names), with `get` alone.
SECRETS = Resource("", "v1", "secrets", "Secret")
