"""What the process-kubelet makes of a pod's spec before it starts a process: each
container's argv and environment, and a host folder for each volume.

Kubernetes rules, as far as guardedcron's pods need them: env comes from the image,
then `envFrom` (Secrets, ConfigMaps, with a prefix), then `env` (literal values with
$(VAR) expansion, the downward API, Secret and ConfigMap keys); `command` replaces the
image's entrypoint and `args` its default args; a volume mount's path is rewritten, in
argv and env values, to the volume's host folder (a Secret volume gets its keys as files).

The rules themselves are pure functions; `PodSpecResolver` adds what needs the API
server (Secrets, ConfigMaps) and the disk (the volume folders). The process lifecycle
is in `kubelet.py`.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guardedcron_devenv.admin_api import AdminApi

# "$$" is an escaped "$"; "$(NAME)" a variable reference (Kubernetes' expansion syntax).
_VAR_REF = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_.-]*)\))")
_FIELD_KEY = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
# Where a volume is mounted in the container, and the host folder that stands for it.
Mount = tuple[str, Path]


@dataclass(frozen=True)
class Image:
    """What a container image would run, as host commands."""

    entrypoint: Sequence[str]
    cmd: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Launch:
    """A container's process as resolved from its spec: argv and the container's own env
    (mount paths already rewritten to host folders)."""

    argv: list[str]
    env: dict[str, str]


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables are replaced, others left as
    written, and "$$" becomes "$" (how the builders protect literal names)."""

    def replace(match: re.Match[str]) -> str:
        if match.group(1) == "$":
            return "$"
        return env.get(match.group(2), match.group(0))

    return _VAR_REF.sub(replace, value)


def argv_for(spec: Mapping[str, Any], image: Image, env: Mapping[str, str]) -> list[str]:
    if spec.get("command"):
        argv = list(spec["command"]) + list(spec.get("args") or [])
    else:
        argv = list(image.entrypoint) + list(spec.get("args") or image.cmd)
    return [expand(a, env) for a in argv]


def mounts_for(spec: Mapping[str, Any], volumes: Mapping[str, Path]) -> list[Mount]:
    """The container's mounts, longest mount path first, so /a/b is rewritten before /a."""
    mounts = []
    for mount in spec.get("volumeMounts") or []:
        host = volumes.get(mount["name"])
        if host is None:
            raise RuntimeError(f"volume {mount['name']!r} is not defined in the pod")
        sub = mount.get("subPath")
        mounts.append((mount["mountPath"].rstrip("/"), host / sub if sub else host))
    return sorted(mounts, key=lambda m: len(m[0]), reverse=True)


def rewrite(value: str, mounts: Sequence[Mount]) -> str:
    for mount_path, host in mounts:
        value = value.replace(mount_path, str(host))
    return value


def field_value(pod: Mapping[str, Any], node_name: str, path: str) -> str:
    """A downward-API `fieldRef`, as the process-kubelet's pod has it."""
    meta = pod["metadata"]
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": node_name,
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    if path in simple:
        return str(simple[path])
    match = _FIELD_KEY.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise RuntimeError(f"fieldRef {path!r} is not supported by the process-kubelet")


class PodSpecResolver:
    """One pod's volumes (host folders under `pod_dir`, made at once) and, per container,
    the argv and env its process starts with; Secrets and ConfigMaps are read when asked."""

    def __init__(self, api: AdminApi, pod: Mapping[str, Any], node_name: str, pod_dir: Path) -> None:
        self.api = api
        self.pod = pod
        self.node_name = node_name
        self.namespace: str = pod["metadata"]["namespace"]
        self.volumes = self._make_volumes(pod_dir)

    def launch(self, spec: Mapping[str, Any], image: Image) -> Launch:
        mounts = mounts_for(spec, self.volumes)
        env = {k: rewrite(v, mounts) for k, v in self.env(spec, image).items()}
        return Launch(argv=[rewrite(a, mounts) for a in argv_for(spec, image, env)], env=env)

    def env(self, spec: Mapping[str, Any], image: Image) -> dict[str, str]:
        env: dict[str, str] = dict(image.env)
        for source in spec.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "secretRef" in source:
                data = self._secret_data(source["secretRef"]["name"])
            else:
                data = self._configmap_data(source["configMapRef"]["name"])
            env.update({prefix + k: v for k, v in data.items()})
        for item in spec.get("env") or []:
            if "value" in item:
                env[item["name"]] = expand(item["value"], env)
            elif "valueFrom" in item:
                env[item["name"]] = self._value_from(item["valueFrom"])
        return env

    def _value_from(self, source: Mapping[str, Any]) -> str:
        if "fieldRef" in source:
            return field_value(self.pod, self.node_name, source["fieldRef"]["fieldPath"])
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            return self._secret_data(ref["name"])[ref["key"]]
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            return self._configmap_data(ref["name"])[ref["key"]]
        raise RuntimeError(f"env source {sorted(source)} is not supported by the process-kubelet")

    def _make_volumes(self, pod_dir: Path) -> dict[str, Path]:
        volumes: dict[str, Path] = {}
        for volume in self.pod["spec"].get("volumes") or []:
            host = pod_dir / "volumes" / volume["name"]
            host.mkdir(parents=True)
            if "secret" in volume:
                self._project_secret(volume["secret"], host)
            volumes[volume["name"]] = host
        return volumes

    def _project_secret(self, source: Mapping[str, Any], host: Path) -> None:
        secret = self.api.get(f"/api/v1/namespaces/{self.namespace}/secrets/{source['secretName']}")
        for key, value in (secret.get("data") or {}).items():
            (host / key).write_bytes(base64.b64decode(value))

    def _secret_data(self, name: str) -> dict[str, str]:
        secret = self.api.get(f"/api/v1/namespaces/{self.namespace}/secrets/{name}")
        return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}

    def _configmap_data(self, name: str) -> dict[str, str]:
        cm = self.api.get(f"/api/v1/namespaces/{self.namespace}/configmaps/{name}")
        return dict(cm.get("data") or {})
