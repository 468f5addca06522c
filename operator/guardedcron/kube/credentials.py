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

The CLI's logins (guardedcron.cli.kubeconfig) give a `ClusterLogin`: kopf's
`ConnectionInfo` and the one kubeconfig setting it has no field for, `tls-server-name`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Mapping

import kopf


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterLogin(kopf.ConnectionInfo):
    """`tls_server_name`: the name sent as SNI and checked against the API server's
    certificate instead of the server URL's host (a kubeconfig's `tls-server-name`, for
    an API server reached by an address its certificate does not name)."""

    tls_server_name: str | None = None


def tls_server_name(info: kopf.ConnectionInfo) -> str | None:
    """The name the server's certificate must carry when it is not the URL's host."""
    return info.tls_server_name if isinstance(info, ClusterLogin) else None


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
