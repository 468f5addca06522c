"""Where the operator's Kubernetes credentials come from: kopf's own login helpers.

Inside a pod, the service account; elsewhere, the kubeconfig (`$KUBECONFIG` or
`~/.kube/config`), as kubectl would. The helpers read small files, so they run in a
worker thread. The result is a `kopf.ConnectionInfo`, which kopf uses for its
watches and `KubeClient` for the operator's own calls.

Inside a pod the API server is addressed as client-go does it: by the
`KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT` the kubelet sets in every
container, not by the name `kubernetes.default.svc` that kopf's helper uses, which needs
cluster DNS and a pod DNS policy that reaches it (a host-network pod, or a cluster
without DNS, has neither; the real-node tier runs without DNS and found this).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Mapping

import kopf


async def discover_credentials(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo | None:
    return await asyncio.to_thread(login, settings, os.environ)


def login(settings: kopf.OperatorSettings, env: Mapping[str, str]) -> kopf.ConnectionInfo | None:
    """The service account's credentials (inside a pod), else the kubeconfig's, else None."""
    info = kopf.login_with_service_account(settings=settings)
    if info is not None:
        server = in_cluster_server(env)
        return info if server is None else dataclasses.replace(info, server=server)
    return kopf.login_with_kubeconfig(settings=settings)


def in_cluster_server(env: Mapping[str, str]) -> str | None:
    """The API server's URL from the kubelet's service variables, as client-go reads them."""
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
