"""Run the real `helm` binary over the chart and read back what it rendered."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from guardedcron_devenv.tools import ensure_helm
from tests.support import REPO

CHART = REPO / "charts" / "guardedcron"
RELEASE = "gc"
RELEASE_NAMESPACE = "guardedcron-system"

# Value sets every chart test runs over: the default and the documented variants.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": {"watchNamespaces": ["billing", "reports"]},
    "peering": {"replicaCount": 2, "peering": {"enabled": True}},
    "peering-namespaced": {
        "replicaCount": 2,
        "peering": {"enabled": True},
        "watchNamespaces": ["billing"],
    },
    "outcome-recording": {"outcomeRecording": {"enabled": True}},
    "stop-workload": {"stopWorkload": {"enabled": True}},
    "stop-workload-namespaced": {"stopWorkload": {"enabled": True}, "watchNamespaces": ["billing"]},
    "monitoring": {
        "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
    },
    "everything": {
        "replicaCount": 2,
        "peering": {"enabled": True, "name": "gc-peers"},
        "outcomeRecording": {"enabled": True},
        "stopWorkload": {"enabled": True},
        "clusterName": "eu-west-1",
        "guard": {"image": "registry.example/guard:1.2.3", "resources": {"limits": {"cpu": ""}}},
        "image": {"digest": "sha256:" + "ab" * 32},
        "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                    "dashboard": {"enabled": True, "annotations": {"grafana_folder": "Ops"}}},
        "crds": {"keep": False},
        "podLabels": {"team": "platform"},
        "priorityClassName": "system-cluster-critical",
    },
    "ha-network": {
        "replicaCount": 2,
        "peering": {"enabled": True},
        "outcomeRecording": {"enabled": True},
        "podDisruptionBudget": {"enabled": True, "minAvailable": "50%", "maxUnavailable": ""},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                       "whenUnsatisfiable": "DoNotSchedule",
                                       "matchLabelKeys": ["pod-template-hash"]}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "podAffinityTerm": {"topologyKey": "topology.kubernetes.io/zone",
                                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "guardedcron"}}},
        }]}},
        "networkPolicy": {
            "enabled": True,
            "metrics": {"from": [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}},
                                  "podSelector": {}}]},
            "apiServer": {"cidrs": ["172.18.0.2/32"]},
            "database": {"cidrs": ["10.20.0.0/16"],
                         "to": [{"ipBlock": {"cidr": "10.30.0.0/16", "except": ["10.30.1.0/24"]}}]},
            "dns": {"to": [{"namespaceSelector": {},
                            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]},
            "extraEgress": [{"to": [{"ipBlock": {"cidr": "10.9.9.9/32"}}],
                             "ports": [{"port": 3128, "endPort": 3130, "protocol": "TCP"}]}],
        },
    },
}


@dataclass
class HelmResult:
    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def objects(self) -> list[dict[str, Any]]:
        return [doc for doc in yaml.safe_load_all(self.stdout) if doc]


def helm(args: Sequence[str], values: Mapping[str, Any] | None = None) -> HelmResult:
    """Run helm; values go in as a JSON file (JSON is YAML), so types stay exact."""
    command = [str(ensure_helm()), *args]
    values_file = None
    if values is not None:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
            json.dump(values, handle)
        values_file = Path(handle.name)
        command += ["--values", str(values_file)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    finally:
        if values_file is not None:
            values_file.unlink()
    return HelmResult(done.returncode, done.stdout, done.stderr, time.perf_counter() - started)


def template(values: Mapping[str, Any] | None = None, *extra: str) -> HelmResult:
    return helm(
        ["template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, *extra], values
    )


def render(values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Rendered objects; a failed render fails the calling test with helm's own message."""
    result = template(values)
    assert result.code == 0, f"helm template failed:\n{result.stderr}"
    return result.objects


def by_kind(objects: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj.get("kind") == kind]


def one(objects: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]


# The Pod Security Standard 'restricted' profile, checked field by field (tests that
# render pods: the chart's, its migration hook's, and the node tier's live ones).
RESTRICTED_VOLUME_TYPES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
    "persistentVolumeClaim", "projected", "secret",
}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The Pod Security Standard 'restricted' profile (plus our read-only root), as a list."""
    found = []
    pod_context = pod.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            found.append(f"pod: {flag}")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            found.append(f"volume {volume['name']}: type {kinds}")
    containers = pod.get("initContainers", []) + pod["containers"]
    for container in containers:
        context = container.get("securityContext", {})
        name = container["name"]

        def setting(key: str, context: dict[str, Any] = context) -> Any:
            return context.get(key, pod_context.get(key))

        if setting("runAsNonRoot") is not True:
            found.append(f"{name}: runAsNonRoot")
        if setting("runAsUser") == 0:
            found.append(f"{name}: runAsUser 0")
        if (setting("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"{name}: capabilities.drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: capabilities.add")
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        if context.get("readOnlyRootFilesystem") is not True:
            found.append(f"{name}: readOnlyRootFilesystem")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            found.append(f"{name}: hostPort")
    return found
